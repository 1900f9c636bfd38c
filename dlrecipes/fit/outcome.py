"""How a training ended: :class:`TrainResult` (what a finished run returns), summary.json's status for one that
raised, and the one line (its traceback to the run's log) for a run that failed or lost a process."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from dlrecipes.core.distributed import PeerLost, lost_peer, rank
from dlrecipes.core.secrets import redact_text
from dlrecipes.errors import UserError, first_line
from dlrecipes.records.layout import RunDir


@dataclass
class TrainResult:
    run_dir: Path
    epochs: int
    batches: int
    eval_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    status: str = "finished"  # or "pruned" (a sweep's search stopped it early, see callbacks.optuna_trial)
    reason: str = ""
    address: str | None = None  # a run in a bucket: s3://BUCKET/PREFIX/NAME (run_dir is its local staging copy)

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

        rows = [
            ("run", self.run_dir),
            ("status", self.status + (f" ({self.reason})" if self.reason else "")),
            ("trained", f"{self.epochs} epochs, {self.batches} batches in {self.seconds:.1f} s"),
            *((f"eval {k}", f"{v:.4f}") for k, v in self.eval_metrics.items()),
            ("best checkpoint", self.best_checkpoint or "none"),
        ]
        body = "".join(
            f"<tr><th style='text-align:left'>{escape(str(k))}</th><td style='text-align:left'>"
            f"{escape(str(v))}</td></tr>"
            for k, v in rows
        )
        return f"<table><caption style='text-align:left'>TrainResult</caption>{body}</table>"


class TrainingFailed(UserError):
    """An exception escaped training: one line names it and the run; the traceback went to the run's log."""

    exit_code = 1

    def __init__(self, message: str, traceback_text: str = ""):
        super().__init__(message)
        self.traceback_text = traceback_text


def outcome(exc: BaseException) -> str:
    """summary.json's status for a run that ended with ``exc``."""
    from dlrecipes.callbacks.monitors import Diverged
    from dlrecipes.callbacks.stop_on_signal import Preempted

    if isinstance(exc, Diverged):
        return "diverged"
    if isinstance(exc, (Preempted, KeyboardInterrupt)) or lost_peer(exc):
        return "stopped"
    return "failed"


def ended_by(exc: BaseException, run: RunDir, kept: bool, verbose: bool) -> BaseException:
    """What a training that raised ``exc`` raises: one line for a lost process or a failure (its traceback to the
    run's log, ``kept``: when the run directory stays), else ``exc`` itself."""
    lost = lost_peer(exc)
    if lost and kept:
        return lost_line(exc, lost, run, verbose)
    if isinstance(exc, Exception) and not isinstance(exc, UserError):
        return failed_line(exc, run if kept else None, verbose)
    return exc


def lost_line(exc: BaseException, who: str, run: RunDir, verbose: bool) -> PeerLost:
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
    where = (
        f"the last checkpoint is {point}"
        if point
        else "no checkpoint yet"
        if rank() == 0
        else "rank 0 names the checkpoint"
    )
    first = first_line(exc, 160)
    then = (
        "torchrun restarts the job if it has a restart left (--max-restarts), and the run resumes; else run the "
        "same torchrun command again"
        if os.environ.get("TORCHELASTIC_RUN_ID")
        else "when every host is back, run the same command with --resume on each"
    )
    return PeerLost(
        f"training stopped: lost {who} ({first}); {where}; {then} (run directory {run}, traceback in {log})"
    )


def failed_line(exc: Exception, run: RunDir | None, verbose: bool) -> TrainingFailed:
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
    first = first_line(exc, 300, "")
    place = f"run directory {run}" if run is not None else "no run directory was kept (no checkpoint yet)"
    return TrainingFailed(f"training failed: {type(exc).__name__}: {first} ({place}; {where})", text)
