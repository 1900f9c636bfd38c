"""Sweeps: a grid (or a random sample) of overrides, each point one training run, resumable, with a table.

``dlrecipes sweep RECIPE optimizer.lr=0.01,0.03 trainer.precision=fp32,amp_bf16 [--seeds N]`` runs the
Cartesian product of the comma-separated values (times N seeds), each point as its own
``dlrecipes train`` process under ``runs/<sweep name>/<point name>/``, named from its values
(``lr=0.01,precision=amp_bf16,seed=1``).  A value in brackets or braces stays one value
(``'key=[a,b]'``), as in Hydra's multirun.  ``--trials N --search random`` instead samples N points from
ranges: ``loguniform(1e-4,1e-1)``, ``uniform(a,b)``, ``randint(a,b)`` (both ends included),
``choice(a,b,c)``.

Every point is validated before the first one starts.  Running the same sweep again skips finished
points, resumes stopped or killed ones from their checkpoints and reruns failed or diverged ones.
Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stops the running trainings as training always stops (a
checkpoint, exit 75) and then the sweep (exit 75).  At the end ``summary.csv``, ``summary.md`` and
``summary.png`` in the sweep's folder hold one row per grid point (seeds aggregated as mean ± std) with each
point's outcome and its reason (:mod:`dlrecipes.tools.sweep_report`); the sweep exits 0 when every point
finished or was pruned, else 1.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from dlrecipes.core.hangup import leave_closed_terminal, terminal_fds
from dlrecipes.errors import RecipeError, UserError
from dlrecipes.records.layout import RunDir
from dlrecipes.tools.sweep_report import (FINISHED, LOG_DIR, forget_outcome, history_rows, log_path, number,
                                          record_outcome, short_names, summarize, unfinished, value_text,
                                          write_summary)

SWEEP_FILE = "sweep.yaml"
DISTRIBUTION = re.compile(r"^(loguniform|uniform|randint|choice)\((.*)\)$")
SEARCHES = ("random", "optuna")
OPTUNA_FILE = "optuna.journal"  # the Optuna study of a --search optuna sweep (its trials, reports and results)


@dataclass
class Point:
    name: str
    values: dict[str, Any]  # swept key -> value (the seed included, as trainer.seed)
    overrides: list[str]  # what the point's train command adds to the fixed overrides
    trial: Optional[int] = None  # its Optuna trial's number (--search optuna)


@dataclass
class SweepPlan:
    recipe: Path
    name: str
    fixed: list[str]
    swept: dict[str, list[Any]]  # key -> values (grid) or key -> [distribution text] (search)
    seeds: int
    points: list[Point]
    search: Optional[str] = None
    trials: Optional[int] = None
    folder: Optional[Path] = None  # runs_dir/<name>, set once the recipe's runs_dir is known
    plugins: list[str] = field(default_factory=list)
    seed: int = 0  # the random search's (and Optuna's sampler's)
    nproc: int = 1  # processes (devices) per run: more than one trains through `dlrecipes launch -n nproc`
    monitor: str = "top1"  # what an Optuna search optimizes (the recipe's checkpoint.monitor and mode)
    mode: str = "max"

    def record(self) -> dict[str, Any]:
        return {"recipe": str(self.recipe), "name": self.name, "fixed": self.fixed, "swept": self.swept,
                "seeds": self.seeds, "search": self.search, "trials": self.trials, "nproc": self.nproc,
                "points": [{"name": p.name, "values": p.values, "overrides": p.overrides,
                            **({"trial": p.trial} if p.trial is not None else {})} for p in self.points]}


def split_values(raw: str) -> list[str]:
    """``a,b,[c,d],{e: 1, f: 2}`` -> ``['a', 'b', '[c,d]', '{e: 1, f: 2}']``: commas outside brackets,
    braces, parentheses and quotes."""
    parts, depth, quote, current = [], 0, "", ""
    for char in raw:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [p.strip() for p in parts]


def _value(text: str, key: str) -> Any:
    from dlrecipes.recipe import parse_assignment

    return parse_assignment(f"{key}={text}", "sweep value")[1]


def point_name(values: dict[str, Any]) -> str:
    """``lr=0.003,precision=amp_bf16,seed=1``, filesystem-safe and at most 120 characters."""
    short = short_names(list(values))
    name = ",".join(f"{short[k]}={value_text(v)}" for k, v in values.items())
    name = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", name).strip("._") or "point"
    return name if len(name) <= 120 else f"{name[:100]}-{abs(hash(name)) % 10**8:08d}"


def _sample(key: str, spec: str, rng: random.Random) -> Any:
    match = DISTRIBUTION.match(spec.replace(" ", ""))
    if match is None:
        raise RecipeError(f"{key}: with --trials, a value is loguniform(a,b), uniform(a,b), randint(a,b) or "
                          f"choice(a,b,...), got '{spec}'")
    kind, args = match.group(1), split_values(match.group(2))
    if kind == "choice":
        return _value(rng.choice(args), key)
    try:
        low, high = (float(a) for a in args)
    except ValueError:
        raise RecipeError(f"{key}: {kind} takes two numbers, got '{spec}'") from None
    if not low < high or (kind == "loguniform" and low <= 0):
        raise RecipeError(f"{key}: {kind}({args[0]},{args[1]}) needs 0 {'< ' if kind == 'loguniform' else ''}"
                          f"low < high")
    if kind == "loguniform":
        return float(f"{math.exp(rng.uniform(math.log(low), math.log(high))):.4g}")
    if kind == "uniform":
        return float(f"{rng.uniform(low, high):.4g}")
    return rng.randint(int(low), int(high))


def _range_spec(key: str, values: list[Any]) -> Optional[tuple[str, list[Any]]]:
    """A swept key's range (``loguniform(a,b)`` ...) as its kind and parsed arguments (a choice's values, a range's
    two ends), checked as the random search checks them; None for a list of values."""
    if not (len(values) == 1 and isinstance(values[0], str) and DISTRIBUTION.match(values[0].replace(" ", ""))):
        return None
    _sample(key, values[0], random.Random(0))  # sound bounds
    match = DISTRIBUTION.match(values[0].replace(" ", ""))
    assert match is not None
    kind, args = match.group(1), split_values(match.group(2))
    if kind == "choice":
        return kind, [_value(a, key) for a in args]
    return kind, [int(float(a)) for a in args] if kind == "randint" else [float(a) for a in args]


def _distribution(key: str, values: list[Any]) -> Any:
    """The Optuna distribution of a swept key: its range, or a choice among its listed values."""
    from dlrecipes.callbacks.optuna_trial import import_optuna

    distributions = import_optuna().distributions
    spec = _range_spec(key, values)
    if spec is not None and spec[0] == "randint":
        return distributions.IntDistribution(*spec[1])
    if spec is not None and spec[0] != "choice":
        return distributions.FloatDistribution(*spec[1], log=spec[0] == "loguniform")
    if spec is not None:
        values = spec[1]
    if not all(v is None or isinstance(v, (bool, int, float, str)) for v in values):
        raise RecipeError(f"{key}: with --search optuna, choices are numbers, strings or booleans, got {values}")
    return distributions.CategoricalDistribution(values)


def probe_points(plan: SweepPlan) -> list[dict[str, Any]]:
    """What a search can pick, to validate before the first run: each range's low end, then its high end, and
    every listed choice (at least two points)."""
    options = {key: (spec[1] if (spec := _range_spec(key, values)) else list(values))
               for key, values in plan.swept.items()}
    count = max(2, *(len(v) for v in options.values()))
    return [{k: v[i % len(v)] for k, v in options.items()} for i in range(count)]


def overrides_of(values: dict[str, Any]) -> list[str]:
    """``key=value`` for each swept value (JSON for anything but a plain string)."""
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in values.items()]


def _split_assignments(assignments: Sequence[str], search: Optional[str]) -> tuple[list[str], dict[str, list[Any]]]:
    """The fixed overrides, and each swept key's values (or, for a search, its range)."""
    fixed, swept = [], {}
    for item in assignments:
        if "=" not in item or item.startswith("~"):
            fixed.append(item)
            continue
        key, _, raw = item.partition("=")
        parts = split_values(raw)
        if search is not None and re.match(r"^\w+\(.*\)$", raw.strip()):
            _sample(key, raw, random.Random(0))  # a distribution we know, with sound bounds
            swept[key] = [raw]
        elif len(parts) > 1:
            if any(p == "" for p in parts):
                raise RecipeError(f"{key}: an empty value in '{raw}' (values are separated by commas)")
            swept[key] = [_value(p, key) for p in parts]
        else:
            fixed.append(item)
    return fixed, swept


def plan_sweep(recipe: str | Path, assignments: Sequence[str], seeds: int = 0, name: Optional[str] = None,
               trials: Optional[int] = None, search: Optional[str] = None, seed: int = 0) -> SweepPlan:
    """The points of a sweep: the grid of the comma-separated values (or ``trials`` random samples), times
    ``seeds`` seeds; an Optuna search's points come later, one trial at a time."""
    fixed, swept = _split_assignments(assignments, search)
    if seeds < 0:
        raise RecipeError(f"--seeds: must be 0 or more, got {seeds}")
    if "trainer.seed" in swept and seeds:
        raise RecipeError("--seeds: trainer.seed is swept already; drop one of them")
    if search is not None:
        if search not in SEARCHES:
            raise RecipeError(f"--search: expected random or optuna, got '{search}'")
        if not trials or trials < 1:
            raise RecipeError(f"--trials: --search {search} needs --trials N (at least 1)")
        if not swept:
            raise RecipeError("nothing to search: give a key a range, e.g. optimizer.lr=loguniform(1e-4,1e-1)")
    if search == "optuna":
        if seeds:
            raise RecipeError("--seeds: an Optuna search trains each trial once; search trainer.seed=choice(1,2,3) "
                              "or drop --seeds")
        for key, values in swept.items():
            _distribution(key, values)  # every range one Optuna can sample
        return SweepPlan(Path(recipe), name or f"{Path(recipe).stem}-sweep", fixed, swept, 0, [], search, trials,
                         seed=seed)
    if search is not None:
        rng = random.Random(seed)
        combos = []
        for _ in range(trials):
            combos.append({k: (_sample(k, v[0], rng) if _range_spec(k, v) else rng.choice(v))
                           for k, v in swept.items()})
    else:
        if trials is not None:
            raise RecipeError("--trials: only with --search random or --search optuna")
        if not swept and not seeds:
            raise RecipeError("nothing to sweep: give a key with several values (key=a,b) or --seeds N")
        combos = [dict(zip(swept, values)) for values in itertools.product(*swept.values())]
    points = []
    for combo in combos:
        for s in (range(1, seeds + 1) if seeds else [None]):
            values = {**combo, **({"trainer.seed": s} if s is not None else {})}
            points.append(Point(point_name(values), values, overrides_of(values)))
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise RecipeError(f"two points of the sweep get the same name '{duplicate}': give distinct values")
    recipe = Path(recipe)
    return SweepPlan(recipe, name or f"{recipe.stem}-sweep", fixed, swept, seeds, points, search, trials, seed=seed)


def prepare_folder(plan: SweepPlan, runs_dir: Path) -> Path:
    """``runs_dir/<name>/`` with ``sweep.yaml``. An existing folder must hold a sweep with the same fixed
    overrides (its grid may grow or change: points already trained under their names are reused)."""
    folder = runs_dir / plan.name
    record = plan.record()
    existing = folder / SWEEP_FILE
    if existing.is_file():
        before = yaml.safe_load(existing.read_text()) or {}
        if before.get("fixed") != record["fixed"] or str(before.get("recipe")) != record["recipe"]:
            raise UserError(f"--name: {folder} holds a sweep of other fixed settings ({existing}: recipe "
                            f"{before.get('recipe')}, fixed {before.get('fixed')}); give another --name")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SWEEP_FILE).write_text(yaml.safe_dump(record, sort_keys=False))
    plan.folder = folder
    return folder


def point_state(run_dir: Path) -> str:
    """What to do with a point: skip (finished), resume (stopped or killed with a checkpoint) or run."""
    from dlrecipes.records.runs import describe_run

    if not RunDir(run_dir).is_run():
        return "run"
    status = describe_run(run_dir)["status"]
    if status in ("done", "pruned"):  # pruned: an Optuna search stopped it on purpose
        return "skip"
    if status.endswith("(resumable)"):
        return "resume"
    if status.startswith("running"):
        raise UserError(f"{run_dir}: a training run is using it now ({status}); wait for it, or stop it")
    return "run"


@dataclass
class _Slot:
    point: Point
    process: Any  # a subprocess.Popen, or a preloaded.Started (its interface)
    started: float
    log: Any
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
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[group * nproc:(group + 1) * nproc])
    return env


def visible_gpus() -> list[str]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES``, else all of them); none on a CPU machine."""
    return [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g] or _gpu_ids()


def _gpu_ids() -> list[str]:
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch CUDA: a CPU machine
        return []


def run_sweep(plan: SweepPlan, parallel: int = 1, echo: Callable[[str], None] = print) -> tuple[list[dict], int]:
    """Run the points not finished yet, ``parallel`` at a time; returns the summary rows and an exit code: 0 when
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
    try:
        _train(plan, source, running, parallel, stop, echo)
        if stop["signal"]:
            echo(f"sweep stopped by {signal.Signals(stop['signal']).name}: run the same command again to continue")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pass_on(running, signal.SIGINT, plan.nproc)  # an error in the sweep itself: the trainings stop as on a signal
        for slot in running:
            slot.process.wait()
            slot.log.close()
    if plan.search == "optuna":  # sweep.yaml lists the trials run so far
        (plan.folder / SWEEP_FILE).write_text(yaml.safe_dump(plan.record(), sort_keys=False))
    rows = summarize(plan)
    write_summary(plan, rows)
    return rows, 75 if stop["signal"] else 1 if unfinished(plan) else 0


def _train(plan: SweepPlan, source: _Grid | _Search, running: list[_Slot], parallel: int, stop: dict[str, int],
           echo: Callable[[str], None]) -> None:
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
            running.append(_start(plan, task[0], task[1], free, parallel))
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
            source.finished(slot)
            echo(_finished_line(plan, slot, outcome, seconds, source, durations, len(running), parallel))
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
            action = point_state(plan.folder / point.name)
            if action == "skip":
                echo(f"skip   {point.name} (finished)")
            else:
                self.todo.append((point, action))
        self.done, self.total = len(plan.points) - len(self.todo), len(plan.points)

    def next(self) -> Optional[tuple[Point, str]]:
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
            study_name=plan.name, storage=storage, load_if_exists=True,
            direction="maximize" if plan.mode == "max" else "minimize",
            # a seed of its own per call: a resumed sweep does not draw its first trials' values again
            sampler=self.optuna.samplers.TPESampler(seed=plan.seed + earlier))
        self.distributions = {key: _distribution(key, values) for key, values in plan.swept.items()}
        self.pending: list[tuple[Point, str]] = []
        self.asked = self.running = 0
        states = self.optuna.trial.TrialState
        plan.points = []
        for trial in self.study.get_trials(deepcopy=False):
            point = self._point(trial.number, trial.params)
            plan.points.append(point)
            if trial.state == states.RUNNING:
                action = point_state(plan.folder / point.name)
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
        trial = {"storage": str(self.storage_path), "study": self.plan.name, "trial": number,
                 "monitor": self.plan.monitor, "startup_trials": min(5, max(1, self.total // 4)),
                 "warmup_evaluations": 1}
        return Point(f"trial={number},{point_name(values)}", values,
                     [*overrides_of(values), f"callbacks.optuna_trial={json.dumps(trial)}"], trial=number)

    def next(self) -> Optional[tuple[Point, str]]:
        if self.pending:
            self.running += 1
            return self.pending.pop(0)
        if self.done + self.running >= self.total or self.asked >= self.total:
            return None
        try:
            trial = self.study.ask(self.distributions)
        except ValueError as exc:  # Optuna refuses a parameter whose kind or choices changed within a study
            raise UserError(f"--search optuna: the study in {self.storage_path} drew its trials from other ranges "
                            f"({exc}); keep them, or give another --name") from None
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
        run_dir = self.plan.folder / point.name
        status = describe_run(run_dir)["status"] if RunDir(run_dir).is_run() else "failed"
        if status.startswith(("stopped", "killed", "running")):
            return
        states = self.optuna.trial.TrialState
        best = _best(history_rows(run_dir), self.plan.monitor, self.plan.mode)
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


def _best(history: list[dict[str, str]], monitor: str, mode: str) -> Optional[float]:
    values = [v for v in (number(h.get(f"eval_{monitor}")) for h in history) if v is not None and math.isfinite(v)]
    return (max(values) if mode == "max" else min(values)) if values else None


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


FRESH_PYTHON = "DLRECIPES_SWEEP_FRESH_PYTHON"  # =1: each training a new Python, on a CPU too


def forks_trainings(nproc: int) -> bool:
    """Whether the trainings start forked from a process that imported torch and Composer once: on a machine
    without GPUs (CUDA does not survive a fork), one process each (``launch`` starts its own), unless
    DLRECIPES_SWEEP_FRESH_PYTHON=1."""
    return nproc == 1 and not visible_gpus() and os.environ.get(FRESH_PYTHON) != "1"


def get_ready(nproc: int) -> None:
    """Start the process the trainings are forked from now, so that its imports go on while the points are
    validated."""
    if forks_trainings(nproc):
        from dlrecipes.tools import preloaded

        preloaded.start_server()


def _start(plan: SweepPlan, point: Point, action: str, index: int, parallel: int) -> _Slot:
    assert plan.folder is not None
    how = ["train"] if plan.nproc == 1 else ["launch", "-n", str(plan.nproc)]
    command = [sys.executable, "-m", "dlrecipes", *how, str(plan.recipe), *plan.fixed, *point.overrides,
               f"runs_dir={plan.folder}", f"run_name={point.name}", "trainer.progress_bar=false",
               *(["--resume"] if action == "resume" else []), *(a for p in plan.plugins for a in ("--plugin", p))]
    forget_outcome(plan.folder, point.name)  # until this training ends, its run directory tells how it goes
    log = open(log_path(plan.folder, point.name), "a")
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    # its own session: a Ctrl-C reaches the sweep, which passes it on once (a second one would interrupt at once)
    env = _child_env(parallel, index, plan.nproc)
    if forks_trainings(plan.nproc):
        from dlrecipes.tools import preloaded

        process: Any = preloaded.start(command[3:], env=env, out=log_path(plan.folder, point.name), append=True,
                                       new_session=True)
    else:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return _Slot(point, process, time.perf_counter(), log, index)


def _finished_line(plan: SweepPlan, slot: _Slot, outcome: dict[str, Any], seconds: float, source: Any,
                   durations: list[float], running: int, parallel: int) -> str:
    """``[3/8] lr=0.01,seed=1  done  top1 0.9471  24s  ETA 1:10  (log: ...)``, and below it the reason of a
    training that did not finish."""
    from dlrecipes.records.runs import describe_run

    assert plan.folder is not None
    run_dir = plan.folder / slot.point.name
    kept = outcome["status"] in FINISHED or outcome["status"].startswith("stopped")
    best = describe_run(run_dir)["best"] if kept and RunDir(run_dir).is_run() else "-"
    left = source.left() + running
    eta = statistics.mean(durations) * left / parallel if left else 0.0
    eta_text = f"  ETA {int(eta) // 60}:{int(eta) % 60:02d}" if left else ""
    line = (f"[{source.done}/{source.total}] {slot.point.name}  {outcome['status']}  {best}  {seconds:.0f}s"
            f"{eta_text}  (log: {log_path(plan.folder, slot.point.name)})")
    return line + (f"\n    {outcome['reason']}" if outcome["reason"] else "")


__all__ = ["Point", "SweepPlan", "plan_sweep", "point_name", "prepare_folder", "run_sweep", "split_values"]
