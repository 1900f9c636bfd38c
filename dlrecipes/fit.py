"""Fit (the fourth stage): a validated recipe -> its run directory -> the built Trainer -> ``fit()``.

The run directory and its lock, resuming, and what is reported around ``fit()``; everything the
recipe names is built by :mod:`dlrecipes.builders`, the run directory's helpers are
:mod:`dlrecipes.records.run_dir`, and where each file goes in it, :class:`dlrecipes.records.layout.RunDir`.
"""

from __future__ import annotations

import shutil
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dlrecipes.builders import build_trainer
from dlrecipes.config import RecipeConfig
from dlrecipes.core import lr_scaling
from dlrecipes.core.devices import resolve_device
from dlrecipes.core.distributed import PeerLost, choose_gloo_interface, lost_peer, rank
from dlrecipes.core.secrets import redact_text
from dlrecipes.errors import UserError
from dlrecipes.records import run_lock
from dlrecipes.records.layout import RunDir
from dlrecipes.records.store.bucket import RemoteRun, staged_run, uploader
from dlrecipes.records.store.bucket import prepare as prepare_remote
from dlrecipes.records.resume_check import check_resume
from dlrecipes.records.run_dir import (
    choose_run_name, find_resume_point, has_checkpoint, make_run_dir, record_recipe, set_aside_failed_run,
    set_aside_for_restart,
)


@dataclass
class TrainResult:
    run_dir: Path
    epochs: int
    batches: int
    eval_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    status: str = "finished"  # or "pruned" (a sweep's search stopped it early, see callbacks.optuna_trial)
    reason: str = ""
    address: Optional[str] = None  # a run in a bucket: s3://BUCKET/PREFIX/NAME (run_dir is its local staging copy)

    @property
    def metrics(self) -> dict[str, float]:
        """The final evaluation's metrics (``eval_metrics``)."""
        return dict(self.eval_metrics)

    @property
    def best_checkpoint(self) -> Path | None:
        """``checkpoints/best.pt`` when the run kept one (``checkpoint.monitor``), else None."""
        best = RunDir(self.run_dir).best
        return best if best.is_file() else None

    @property
    def history(self):
        """history.csv as a pandas DataFrame, one row per epoch (pandas: the ``notebook`` extra)."""
        from dlrecipes.records.frames import history_frame

        return history_frame(self.run_dir)

    def plot(self):
        """Loss, accuracy and learning rate per epoch in one matplotlib Figure (shown inline in a notebook)."""
        from dlrecipes.records.plots import history_figure

        return history_figure(self.run_dir)

    def _repr_html_(self) -> str:
        from html import escape

        rows = [("run", self.run_dir), ("status", self.status + (f" ({self.reason})" if self.reason else "")),
                ("trained", f"{self.epochs} epochs, {self.batches} batches in {self.seconds:.1f} s"),
                *((f"eval {k}", f"{v:.4f}") for k, v in self.eval_metrics.items()),
                ("best checkpoint", self.best_checkpoint or "none")]
        body = "".join(f"<tr><th style='text-align:left'>{escape(str(k))}</th><td style='text-align:left'>"
                       f"{escape(str(v))}</td></tr>" for k, v in rows)
        return f"<table><caption style='text-align:left'>TrainResult</caption>{body}</table>"


def _log_lr_scaling(config: RecipeConfig, trainer) -> None:
    """With ``optimizer.scale_lr``: the lr the optimizer got, logged and said once."""
    lr = trainer.state.optimizers[0].param_groups[0]["lr"]
    report = lr_scaling.scaling_report(config.optimizer.params, config.trainer.batch_size, lr)
    if report is None:
        return
    line, hyperparameters = report
    trainer.logger.log_hyperparameters(hyperparameters)
    if rank() == 0:
        print(line, file=sys.stderr)


def _report_skipped_images(trainer) -> None:
    """Image-folder data with ``bad_images: skip``: say how many unreadable images were left out."""
    for label, loader in (("train", trainer.state.train_dataloader),
                          *((e.label, e.dataloader.dataloader) for e in trainer.state.evaluators)):
        flags = getattr(getattr(loader, "dataset", None), "unreadable", None)
        skipped = sum(flags) if flags is not None else 0
        if skipped:
            print(f"warning: {skipped} unreadable image(s) skipped in the {label} data (paths above)", file=sys.stderr)


class TrainingFailed(UserError):
    """An exception escaped training: one line names it and the run; the traceback went to the run's log."""

    exit_code = 1

    def __init__(self, message: str, traceback_text: str = ""):
        super().__init__(message)
        self.traceback_text = traceback_text


def _outcome(exc: BaseException) -> str:
    """summary.json's status for a run that ended with ``exc``."""
    from dlrecipes.callbacks.monitors import Diverged
    from dlrecipes.callbacks.stop_on_signal import Preempted

    if isinstance(exc, Diverged):
        return "diverged"
    if isinstance(exc, (Preempted, KeyboardInterrupt)) or lost_peer(exc):
        return "stopped"
    return "failed"


def fit(config: RecipeConfig, resume: bool = False, trust_checkpoint: bool = False,
          verbose: bool = False, restart: bool = False) -> TrainResult:
    """Train a validated recipe; returns where the run went and its final eval metrics.

    ``verbose``: Composer's own console logging too, the warnings
    :data:`dlrecipes.loggers.terminal.HARMLESS_WARNINGS` (hidden otherwise), and the traceback of a
    failure (always written to the run's log when the run directory stays).  ``restart``: the run named
    ``run_name`` is kept under another name and this one starts from the beginning.
    """
    choose_gloo_interface()  # started by a launcher across hosts: gloo's interface is the one reaching the master
    _check_options(config, resume, restart)
    recipe = config.to_dict()  # the resolved recipe as plain data: compared on resume, written, recorded
    remote = prepare_remote(config, resume, restart)  # runs_dir: s3://...: checked, claimed, staged locally
    device = resolve_device(config.trainer.device)
    runs = remote.staging() if remote is not None else Path(config.runs_dir)  # the config itself stays as resolved
    run = RunDir(runs / choose_run_name(config, resume, device, runs))  # a new default name: made now
    run_dir = run.path
    accepted: list[str] = []
    if resume:  # before anything is built or written
        accepted = check_resume(run_dir, recipe)
    elif restart:
        set_aside_for_restart(run_dir)
    elif config.run_name:
        set_aside_failed_run(run_dir)
    lock, fresh = None, not resume and (not config.run_name or not run_dir.exists())
    if rank() == 0:
        if config.run_name:  # made here, once (a default name names a run made as the name was chosen)
            make_run_dir(run)
        lock = _locked(run_dir, remote)
    try:
        with warnings.catch_warnings():
            if not verbose:
                from dlrecipes.loggers.terminal import hide_harmless_warnings

                hide_harmless_warnings()
            # under the lock (a live run's files are not touched) and before anything is written: refused here,
            # a resume changes nothing
            point = find_resume_point(run_dir, config.trainer.max_duration, trust_checkpoint) \
                if resume and rank() == 0 else None
            if accepted and rank() == 0:
                print(f"resuming {run_dir.name} with changed settings: {', '.join(accepted)}", file=sys.stderr)
            record_recipe(run, recipe, resume)
            mirror = staged_run(remote, run_dir.name) if remote is not None else None
            return _all_uploaded(_fit_in(config, run_dir, recipe, device, resume, trust_checkpoint, verbose, point,
                                         mirror), mirror)
    except BaseException as exc:
        kept = not (fresh and lock is not None and not has_checkpoint(run_dir))
        if not kept:  # nothing worth keeping: leave no run directory behind
            lock.release()
            shutil.rmtree(run_dir, ignore_errors=True)
        lost = lost_peer(exc)
        if lost and kept:
            raise _lost(exc, lost, run, verbose) from exc
        if isinstance(exc, Exception) and not isinstance(exc, UserError):
            raise _failed(exc, run if kept else None, verbose) from exc
        raise
    finally:
        if lock is not None:
            lock.release()


def _locked(run_dir: Path, remote: Any) -> Any:
    """The run directory's lock (rank 0); in a bucket, with the run's lease there too (no shared disk between the
    machines that may write it: :mod:`dlrecipes.records.store.lease`)."""
    lock = run_lock.acquire(run_dir)
    if remote is None:
        return lock
    from dlrecipes.records.store.lease import leased

    return leased(lock, remote, run_dir.name)


def _check_options(config: RecipeConfig, resume: bool, restart: bool) -> None:
    """Refuse what cannot go together (:func:`dlrecipes.config.checks.check_train_options`); say what the recipe
    will cost needlessly (before anything is built)."""
    from dlrecipes.config.checks import check_train_options

    if rank() == 0:
        from dlrecipes.data.source_sizes import upsampling_notes

        for note in upsampling_notes(config):
            print(note, file=sys.stderr)
    check_train_options(config, resume, restart)


def _all_uploaded(result: TrainResult, mirror: RemoteRun | None) -> TrainResult:
    """A run in object storage that ends with files not uploaded: one line naming them, exit code 1."""
    if mirror is None or not mirror.incomplete():
        return result
    missing = mirror.incomplete()
    raise TrainingFailed(f"training {result.status}, but {len(missing)} file(s) of the run are not in "
                         f"{mirror.root}/{mirror.name}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                         f"(they are in {mirror.local}, as its summary says; run the same command with --resume to upload them)")


def _lost(exc: BaseException, who: str, run: RunDir, verbose: bool) -> PeerLost:
    """One line for a run that lost a process (a host went down): who, the checkpoint to continue from, how;
    the traceback to the run's log."""
    from dlrecipes.records.checkpoint_safety import UntrustedCheckpoint
    from dlrecipes.records.checkpoints import resume_point

    text = redact_text(traceback.format_exc())  # a URL with its password in an exception stays in neither place
    if verbose:
        print(text, file=sys.stderr, end="")
    log = run.log(rank())
    with open(log, "a") as f:
        f.write(f"\n[error]: lost {who}\n{text}")
    try:
        point = resume_point(run.checkpoints, repair=False) if rank() == 0 else None  # only names it
    except UntrustedCheckpoint:  # not this line's business: --resume says so
        point = None
    where = f"the last checkpoint is {point}" if point else "no checkpoint yet" if rank() == 0 else \
        "rank 0 names the checkpoint"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:160]
    return PeerLost(f"training stopped: lost {who} ({first}); {where}; when every host is back, run the same command "
                    f"with --resume on each (run directory {run}, traceback in {log})")


def _failed(exc: Exception, run: RunDir | None, verbose: bool) -> TrainingFailed:
    """One line for an exception that escaped training; its traceback to the run's log (and with ``verbose``,
    to the terminal)."""
    text = redact_text(traceback.format_exc())  # a URL with its password in an exception stays in neither place
    if verbose:
        print(text, file=sys.stderr, end="")
    where = "rerun with --verbose to see its traceback"
    if run is not None:
        log = run.log(rank())
        with open(log, "a") as f:
            f.write(f"\n[error]: training failed\n{text}")
        where = f"its traceback is in {log}"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:300]
    place = f"run directory {run}" if run is not None else "no run directory was kept (no checkpoint yet)"
    return TrainingFailed(f"training failed: {type(exc).__name__}: {first} ({place}; {where})", text)


def _fit_in(config: RecipeConfig, run_dir: Path, recipe: dict[str, Any], device: str, resume: bool,
            trust_checkpoint: bool, verbose: bool, point: Path | None, mirror: RemoteRun | None) -> TrainResult:
    """Build the run's Trainer and ``fit()`` it; how it ended goes to the run's history (summary.json, kept as
    built), and into the result."""
    address = f"{mirror.root}/{mirror.name}" if mirror is not None else None  # what the lines name
    built = build_trainer(config, run_dir, recipe, device, resume=resume, trust_checkpoint=trust_checkpoint,
                          verbose=verbose, resume_from=point, shown_as=address)
    trainer, history = built.trainer, built.history
    if mirror is not None:  # after every other callback: it uploads what they wrote
        trainer.state.callbacks.append(uploader(mirror))
    _log_lr_scaling(config, trainer)
    finished = resume and trainer.state.get_elapsed_duration() >= 1.0
    if finished:  # e.g. killed after its last checkpoint: nothing left to train
        print(f"{run_dir.name} already finished ({int(trainer.state.timestamp.batch)} batches); nothing to resume",
              file=sys.stderr)
    try:
        if not finished:
            trainer.fit()
    except BaseException as exc:  # summary.json's status and reason, written at close
        history.status = _outcome(exc)
        history.reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise
    finally:
        trainer.close()
        _report_skipped_images(trainer)
    state = trainer.state
    metrics: dict[str, Any] = {k: float(v) for k, v in state.eval_metric_values.items()}
    return TrainResult(
        run_dir=run_dir,
        epochs=int(state.timestamp.epoch),
        batches=int(state.timestamp.batch),
        eval_metrics=metrics,
        seconds=history.wall_time_sec or 0.0,  # summary.json's wall_time_sec
        status=history.status,
        reason=history.reason,
        address=address,
    )
