"""Callbacks of our own: stop (or skip the step) on a non-finite loss, stop a run that diverged, and
torch profiler traces."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from dlrecipes.errors import UserError
from dlrecipes.records.layout import latest_checkpoint_name


class NonFiniteLossError(UserError):
    """Training stopped because the loss was NaN or infinite (the checkpoints on disk are intact)."""


class NaNMonitor(Callback):
    """Check the loss after every forward pass.

    ``action: stop`` raises before the bad step's optimizer update, so the weights and every
    checkpoint already written stay as they were; the message names the batch and the last
    good checkpoint.  ``action: skip`` drops that step's gradients instead (the optimizer
    step then changes nothing) and counts the skipped steps.

    With several processes every rank decides together, once per batch before the optimizer
    step (a host-side reduction of "some microbatch here was not finite"): a NaN on one rank
    reaches every rank's gradients through the all-reduce, so every rank skips that step, or
    every rank stops.  Reading the check back is a synchronisation per step: the price of
    asking for this monitor.
    """

    def __init__(self, checkpoint_dir: Path, action: str = "stop", max_skips: int = 10):
        self.checkpoint_dir = Path(checkpoint_dir)
        self.action = action
        self.max_skips = max_skips
        self.skipped = 0
        self._bad = False
        self._host = None

    def fit_start(self, state: State, logger: Logger) -> None:
        from dlrecipes.core.distributed import HostReducer

        self._host = HostReducer()

    def before_train_batch(self, state: State, logger: Logger) -> None:
        self._bad = False

    def after_loss(self, state: State, logger: Logger) -> None:
        loss = state.loss
        values = loss.values() if isinstance(loss, dict) else (loss if isinstance(loss, (list, tuple)) else [loss])
        checks = [torch.isfinite(v.detach()).all() for v in values if isinstance(v, torch.Tensor)]
        if checks and not bool(torch.stack(checks).all()):
            self._bad = True

    def after_train_batch(self, state: State, logger: Logger) -> None:
        """All microbatches are done and the optimizer has not stepped yet: decide for every rank."""
        bad = self._bad
        if self._host is not None and self._host.world_size > 1:
            bad = bool(self._host.max([float(bad)])[0])
        self._bad = False
        if not bad:
            return
        batch, epoch = int(state.timestamp.batch) + 1, int(state.timestamp.epoch) + 1  # the one being trained
        if self.action == "skip" and self.skipped < self.max_skips:
            self.skipped += 1
            for p in state.model.parameters():
                p.grad = None  # the optimizer skips parameters without gradients
            logger.log_metrics({"nan_monitor/skipped_steps": self.skipped})
            return
        latest = self.checkpoint_dir / latest_checkpoint_name(dist.get_global_rank())
        kept = f"the last good checkpoint is {latest}" if latest.exists() else "no checkpoint had been written yet"
        why = f" after skipping {self.skipped} steps (max_skips)" if self.action == "skip" else ""
        raise NonFiniteLossError(
            f"nan_monitor: the loss is not finite at batch {batch} (epoch {epoch}){why}; "
            f"training stopped before that step's update, {kept}"
        )


class TorchProfilerTraces(Callback):
    """Chrome/TensorBoard traces from ``torch.profiler`` for a window of batches.

    Skips ``wait`` batches, warms up for ``warmup``, records ``active``, ``repeat`` times;
    traces go to ``<run dir>/profiler`` (open them in chrome://tracing or TensorBoard).
    """

    def __init__(
        self,
        folder: Path,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
    ):
        self.folder = Path(folder)
        self.schedule = dict(wait=wait, warmup=warmup, active=active, repeat=repeat)
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.profiler: torch.profiler.profile | None = None

    def fit_start(self, state: State, logger: Logger) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        from dlrecipes.core.devices import gpu_available

        if gpu_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(**self.schedule),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                str(self.folder), worker_name=f"rank{dist.get_global_rank()}"
            ),
            **self.options,
        )
        self.profiler.__enter__()

    def batch_end(self, state: State, logger: Logger) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.close(state, logger)

    def close(self, state: State, logger: Logger) -> None:
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.__exit__(None, None, None)


class Diverged(UserError):
    """The training loss became NaN or infinite (a learning rate too high, most often)."""

    exit_code = 3


class StopOnDivergence(Callback):
    """Stop a run whose training loss is no longer finite, at the read-backs that already happen.

    Every run has it.  The engine logs the loss as a device tensor every batch; the terminal and the
    run log read it back every ``read_every`` batches (``trainer.log_interval``) and at each epoch's
    end, and so does this check, at those same batches: no further waits for the device.  A
    non-finite loss raises :class:`Diverged` (exit code 3) before the epoch is evaluated, so no
    ``best.pt`` comes from it; ``callbacks.nan_monitor`` checks every step instead.
    """

    def __init__(self, read_every: int = 50, lr: float | None = None):
        self.read_every = max(1, int(read_every))
        self.lr = lr

    def _check(self, state: State, epoch: int) -> None:
        loss = (state.total_loss_dict or {}).get("loss/train/total")
        if loss is None or math.isfinite(float(loss)):
            return
        batch = int(state.timestamp.batch)
        hint = (
            f"a lower learning rate (optimizer.lr is {self.lr:g}; try {self.lr / 10:g})"
            if self.lr
            else "a lower learning rate (optimizer.lr)"
        )
        raise Diverged(
            f"training diverged: the loss is {float(loss)} by batch {batch} (epoch {epoch}); try {hint}, "
            "or a warmup (scheduler.warmup)"
        )

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) % self.read_every == 0:
            self._check(state, int(state.timestamp.epoch) + 1)

    def epoch_end(self, state: State, logger: Logger) -> None:
        self._check(state, int(state.timestamp.epoch))  # the epoch counter has moved on already
