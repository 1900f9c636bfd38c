"""Running a sweep: its trainings, ``--parallel`` at a time, and the Optuna search that picks the next point.

Each point trains as its own process (or, with ``--nproc``, processes, as ``dlrecipes launch`` starts them) under
``runs/<sweep name>/<point name>/``, handed its run as a :class:`~dlrecipes.records.request.RunRequest` (the recipe
with the point's overrides as the sweep loaded it; its log names the ``dlrecipes train`` line it stands for); on a
CPU the trainings are forked from a process that imported torch and Composer once
(:mod:`dlrecipes.runtime.fork_server`).  Running the same sweep again skips finished points, resumes
stopped or killed ones from their checkpoints and reruns failed or diverged ones.  Ctrl-C, SIGTERM or SIGHUP (a
closed terminal) stops the running trainings as training always stops (a checkpoint, exit 75) and then the
sweep (exit 75).  Each training's outcome is recorded as it ends, and at the end the table is written
(:mod:`dlrecipes.tools.sweep.report`); the sweep exits 0 when every point finished or was pruned, else 1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from dlrecipes.core.devices import visible_gpus
from dlrecipes.errors import RecipeError, UserError
from dlrecipes.records.layout import RunDir
from dlrecipes.records.request import RunRequest
from dlrecipes.runtime.hangup import leave_closed_terminal, terminal_fds
from dlrecipes.tools.sweep.plan import SWEEP_FILE, Point, SweepPlan, optuna_distribution, overrides_of, point_name
from dlrecipes.tools.sweep.report import (
    LOG_DIR,
    best_value,
    finished_line,
    forget_outcome,
    history_rows,
    log_path,
    point_run,
    record_outcome,
    summarize,
    unfinished,
    write_summary,
)

if TYPE_CHECKING:
    from dlrecipes.records.store import SweepFolder
    from dlrecipes.runtime.fork_server import Program, Started

OPTUNA_FILE = "optuna.journal"  # the Optuna study of a --search optuna sweep (its trials, reports and results)


def point_state(run: RunDir) -> str:
    """What to do with a point: skip (finished), resume (stopped or killed with a checkpoint) or run."""
    from dlrecipes.records.runs import describe_run

    if not run.is_run():
        return "run"
    status = describe_run(run)["status"]
    if status in ("done", "pruned"):  # pruned: an Optuna search stopped it on purpose
        return "skip"
    if status.endswith("(resumable)"):
        return "resume"
    if status.startswith("running"):
        raise UserError(f"{run}: a training run is using it now ({status}); wait for it, or stop it")
    return "run"


@dataclass
class _Slot:
    point: Point
    process: subprocess.Popen | Started  # Started: a fork server's, with the part of Popen's interface used here
    started: float
    log: TextIO
    index: int = 0  # which of the --parallel places it holds (its GPUs)


def _child_env(parallel: int, index: int, nproc: int = 1) -> dict[str, str]:
    """Threads split between the parallel runs' processes on a CPU; ``nproc`` GPUs each when there are GPUs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MASTER_PORT", None)  # each launched run's processes meet on a free port of their own
    if parallel > 1:
        threads = max(1, (os.cpu_count() or 1) // (parallel * nproc))
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        gpus = visible_gpus()
        if len(gpus) >= nproc:  # groups of nproc GPUs, shared when more runs than groups go at once
            group = index % (len(gpus) // nproc)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[group * nproc : (group + 1) * nproc])
    return env


def run_sweep(
    plan: SweepPlan, program: Program, parallel: int = 1, echo: Callable[[str], None] = print
) -> tuple[list[dict], int]:
    """Run the points not finished yet, ``parallel`` at a time (on a CPU, forked as ``program`` says: a
    fork_server.Program, the CLI's); returns the summary rows and an exit code: 0 when
    every point finished (or was pruned), 75 when a signal stopped the sweep, else 1 (``closing_line`` says
    how many did not finish, and how)."""
    if parallel < 1:
        raise RecipeError(f"--parallel: must be at least 1, got {parallel}")
    assert plan.folder is not None
    (plan.folder / LOG_DIR).mkdir(exist_ok=True)
    source: _Grid | _Search = _Search(plan, echo) if plan.search == "optuna" else _Grid(plan, echo)
    stop = {"signal": 0, "count": 0}
    previous = _catch_signals(stop) if _main_thread() else {}
    running: list[_Slot] = []
    plan.requests = Path(tempfile.mkdtemp(prefix="dlrecipes-sweep-"))  # the run requests: private, gone at the end
    try:
        _train(plan, source, running, parallel, stop, echo, program)
        if stop["signal"]:
            echo(f"sweep stopped by {signal.Signals(stop['signal']).name}: run the same command again to continue")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pass_on(running, signal.SIGINT, plan.nproc)  # an error in the sweep itself: the trainings stop as on a signal
        for slot in running:
            slot.process.wait()
            slot.log.close()
        shutil.rmtree(plan.requests, ignore_errors=True)
    if plan.search == "optuna":  # sweep.yaml lists the trials run so far
        (plan.folder / SWEEP_FILE).write_text(yaml.safe_dump(plan.record(), sort_keys=False))
    rows = summarize(plan)
    write_summary(plan, rows)
    return rows, 75 if stop["signal"] else 1 if unfinished(plan) else 0


def _train(
    plan: SweepPlan,
    source: _Grid | _Search,
    running: list[_Slot],
    parallel: int,
    stop: dict[str, int],
    echo: Callable[[str], None],
    program: Program,
) -> None:
    """Start the points as places free up, pass each signal on to the running trainings once, and record and
    report each training's outcome as it ends."""
    assert plan.folder is not None
    durations: list[float] = []
    forwarded = 0
    while True:
        while len(running) < parallel and not stop["signal"]:
            task = source.next()
            if task is None:
                break
            free = min(set(range(parallel)) - {slot.index for slot in running})  # a finished run's place
            running.append(_start(plan, task[0], task[1], free, parallel, program))
        if not running:
            break
        if stop["count"] > forwarded:  # the children run in their own sessions: each signal reaches them once
            forwarded = stop["count"]
            _pass_on(running, stop["signal"], plan.nproc)
        time.sleep(0.2)
        for slot in [s for s in running if s.process.poll() is not None]:
            running.remove(slot)
            slot.log.close()
            seconds = time.perf_counter() - slot.started
            durations.append(seconds)
            outcome = record_outcome(plan.folder, slot.point.name, slot.process.returncode, bool(stop["signal"]))
            if plan.after_point is not None:
                plan.after_point()
            source.finished(slot)
            left = source.left() + len(running)
            eta = statistics.mean(durations) * left / parallel if left else None
            echo(finished_line(plan, slot.point, outcome, seconds, source.done, source.total, eta))
            if slot.process.returncode == 75 and not stop["signal"]:  # stopped from outside the sweep
                stop["signal"], stop["count"] = signal.SIGTERM, forwarded


def _catch_signals(stop: dict[str, int]) -> dict[int, Any]:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP (the terminal or ssh session closed) stop the sweep, which passes
    each on to the running trainings once; returns the handlers they had."""
    terminal = terminal_fds()

    def on_signal(signum: int, frame: Any) -> None:
        stop["signal"], stop["count"] = signum, stop["count"] + 1
        if signum == signal.SIGHUP:
            leave_closed_terminal(terminal)

    return {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _pass_on(running: list[_Slot], signum: int, nproc: int) -> None:
    """A signal to the running trainings; `launch` passes SIGTERM on to its processes (a Ctrl-C reaches them
    only from a terminal), so launched runs get that, and so does a training when the sweep's terminal hung up
    (SIGHUP): training stops on SIGTERM with a checkpoint."""
    for slot in running:
        if slot.process.poll() is None:
            slot.process.send_signal(signal.SIGTERM if nproc > 1 or signum == signal.SIGHUP else signum)


class _Grid:
    """The points of a grid or a random search, known up front: those not finished yet, in order."""

    def __init__(self, plan: SweepPlan, echo: Callable[[str], None]):
        assert plan.folder is not None
        self.todo = []
        for point in plan.points:
            action = point_state(point_run(plan.folder, point.name))
            if action == "skip":
                echo(f"skip   {point.name} (finished)")
            else:
                self.todo.append((point, action))
        self.done, self.total = len(plan.points) - len(self.todo), len(plan.points)

    def next(self) -> tuple[Point, str] | None:
        return self.todo.pop(0) if self.todo else None

    def finished(self, slot: _Slot) -> None:
        self.done += 1

    def left(self) -> int:
        return len(self.todo)


class _Search:
    """An Optuna study in the sweep's folder (``optuna.journal``): each trial is one run that reports its
    monitored metric at every evaluation (``callbacks.optuna_trial``); Optuna's TPE sampler picks the next
    trial's values, its median pruner stops a trial below the median of earlier ones at the same evaluation
    (never at its first evaluation, and only once a few trials have finished).  A trial's result is its best
    monitored value.  Trials left running by an interrupted sweep are resumed first; failed ones do not count
    towards ``--trials``."""

    def __init__(self, plan: SweepPlan, echo: Callable[[str], None]):
        from dlrecipes.callbacks.optuna_trial import import_optuna, journal_storage

        assert plan.folder is not None and plan.trials
        self.optuna, self.plan = import_optuna(), plan
        self.storage_path = plan.folder / OPTUNA_FILE
        storage = journal_storage(str(self.storage_path))
        earlier = _trial_count(storage, plan.name)
        self.study = self.optuna.create_study(
            study_name=plan.name,
            storage=storage,
            load_if_exists=True,
            direction="maximize" if plan.mode == "max" else "minimize",
            # a seed of its own per call: a resumed sweep does not draw its first trials' values again
            sampler=self.optuna.samplers.TPESampler(seed=plan.seed + earlier),
        )
        self.distributions = {key: optuna_distribution(key, values) for key, values in plan.swept.items()}
        self.pending: list[tuple[Point, str]] = []
        self.asked = self.running = 0
        states = self.optuna.trial.TrialState
        plan.points = []
        for trial in self.study.get_trials(deepcopy=False):
            point = self._point(trial.number, trial.params)
            plan.points.append(point)
            if trial.state == states.RUNNING:
                action = point_state(point_run(plan.folder, point.name))
                if action == "skip":  # its run ended after the sweep that started it had gone
                    self._tell(point)
                else:
                    self.pending.append((point, action))
            elif trial.state in (states.COMPLETE, states.PRUNED):
                echo(f"skip   {point.name} ({trial.state.name.lower()})")

    @property
    def done(self) -> int:
        """Trials that count towards --trials: complete and pruned ones."""
        states = self.optuna.trial.TrialState
        return len(self.study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED)))

    @property
    def total(self) -> int:
        return int(self.plan.trials or 0)

    def _point(self, number: int, params: dict[str, Any]) -> Point:
        values = {key: params[key] for key in self.plan.swept if key in params}
        # the runs prune (callbacks.optuna_trial): not before a quarter of the trials (at most 5) have finished
        trial = {
            "storage": str(self.storage_path),
            "study": self.plan.name,
            "trial": number,
            "monitor": self.plan.monitor,
            "startup_trials": min(5, max(1, self.total // 4)),
            "warmup_evaluations": 1,
        }
        return Point(
            f"trial={number},{point_name(values)}",
            values,
            [*overrides_of(values), f"callbacks.optuna_trial={json.dumps(trial)}"],
            trial=number,
        )

    def next(self) -> tuple[Point, str] | None:
        if self.pending:
            self.running += 1
            return self.pending.pop(0)
        if self.done + self.running >= self.total or self.asked >= self.total:
            return None
        try:
            trial = self.study.ask(self.distributions)
        except ValueError as exc:  # Optuna refuses a parameter whose kind or choices changed within a study
            raise UserError(
                f"--search optuna: the study in {self.storage_path} drew its trials from other ranges "
                f"({exc}); keep them, or give another --name"
            ) from None
        self.asked += 1
        self.running += 1
        point = self._point(trial.number, trial.params)
        self.plan.points.append(point)
        return point, "run"

    def finished(self, slot: _Slot) -> None:
        self.running -= 1
        self._tell(slot.point)

    def _tell(self, point: Point) -> None:
        """The trial's outcome from its run: its best monitored value, pruned, or failed; a stopped or killed
        run's trial stays running (the next call resumes it)."""
        from dlrecipes.records.runs import describe_run

        assert self.plan.folder is not None and point.trial is not None
        run = point_run(self.plan.folder, point.name)
        status = describe_run(run)["status"] if run.is_run() else "failed"
        if status.startswith(("stopped", "killed", "running")):
            return
        states = self.optuna.trial.TrialState
        best = best_value(history_rows(run), self.plan.monitor, self.plan.mode)
        if status == "pruned":
            self.study.tell(point.trial, state=states.PRUNED)
        elif status == "done" and best is not None:
            self.study.tell(point.trial, best)
        else:
            self.study.tell(point.trial, state=states.FAIL)

    def left(self) -> int:
        return len(self.pending) + max(0, min(self.total - self.done, self.total - self.asked) - self.running)


def _trial_count(storage: Any, study: str) -> int:
    try:
        study_id = storage.get_study_id_from_name(study)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


FRESH_PYTHON = "DLRECIPES_SWEEP_FRESH_PYTHON"  # =1: each training a new Python, on a CPU too


def forks_trainings(nproc: int) -> bool:
    """Whether the trainings start forked from a process that imported torch and Composer once: on a machine
    without GPUs (CUDA does not survive a fork), one process each (``launch`` starts its own), unless
    DLRECIPES_SWEEP_FRESH_PYTHON=1."""
    return nproc == 1 and not visible_gpus() and os.environ.get(FRESH_PYTHON) != "1"


def get_ready(nproc: int, program: Program) -> None:
    """Start the process the trainings are forked from now (``program``: a fork_server.Program, the CLI's), so that
    its imports go on while the points are validated."""
    if forks_trainings(nproc):
        from dlrecipes.runtime import fork_server

        fork_server.start_server(program)


def _start(plan: SweepPlan, point: Point, action: str, index: int, parallel: int, program: Program) -> _Slot:
    assert plan.folder is not None and plan.requests is not None
    request = _request(plan, point, action)
    command = [
        sys.executable,
        "-m",
        "dlrecipes",
        "train-request",
        str(request.write(plan.requests, point.name)),
        *(["-n", str(plan.nproc)] if plan.nproc > 1 else []),
    ]
    forget_outcome(plan.folder, point.name)  # until this training ends, its run directory tells how it goes
    log = open(log_path(plan.folder, point.name), "a")
    line = request.command.replace("dlrecipes train ", f"dlrecipes launch -n {plan.nproc} ", 1)
    log.write(f"$ {request.command if plan.nproc == 1 else line}\n")
    log.flush()
    # its own session: a Ctrl-C reaches the sweep, which passes it on once (a second one would interrupt at once)
    env = _child_env(parallel, index, plan.nproc)
    if forks_trainings(plan.nproc):
        from dlrecipes.runtime import fork_server

        process: subprocess.Popen | Started = fork_server.start(
            program, command[3:], env=env, out=log_path(plan.folder, point.name), append=True, new_session=True
        )
    else:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return _Slot(point, process, time.perf_counter(), log, index)


def _request(plan: SweepPlan, point: Point, action: str) -> RunRequest:
    """The point's run, handed to its training: the recipe with the sweep's fixed and the point's overrides, trained
    in the sweep's folder (where its store says: ``trains_into``) under the point's name, with no progress bar."""
    from dlrecipes.config.resolving import load_local
    from dlrecipes.records.store import RunOptions

    where = [f"runs_dir={plan.trains_into}", f"run_name={point.name}", "trainer.progress_bar=false"]
    overrides = [*plan.fixed, *point.overrides, *where]  # parsed here, once: the training takes the loaded recipe
    options = RunOptions(resume=action == "resume", trust=plan.trust_checkpoint)
    return RunRequest.of(load_local(plan.recipe, overrides, plan.plugins), overrides, plan.plugins, options)


__all__ = ["FRESH_PYTHON", "OPTUNA_FILE", "forks_trainings", "get_ready", "point_state", "run_sweep"]


def finish_folder(folder: SweepFolder, echo: Callable[[str], None] = print) -> int:
    """The sweep's own files uploaded where its folder is a bucket's (:meth:`SweepFolder.finish`); 1, with a line
    naming the files that are not there, when some could not be, else 0."""
    missing = folder.finish()
    if not missing:
        return 0
    echo(
        f"error: {len(missing)} file(s) of the sweep are not in {folder.address}: {', '.join(missing[:5])}"
        f"{' ...' if len(missing) > 5 else ''} (the same command uploads them)"
    )
    return 1
