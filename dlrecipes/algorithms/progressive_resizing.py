"""Progressive resizing (Composer's), for every loader: one ``progressive_resizing:`` block, one schedule.

Composer's algorithm downsizes each decoded batch early in training and grows it to full size.
A loader that decodes at a size it is given (FFCV: ``set_resolution``) does better: it decodes at
the scheduled size directly, so nothing is decoded large only to be shrunk.  :class:`ProgressiveResizing`
is Composer's class (same parameters, same checkpoint name) with that second way added: when the
train loader has ``set_resolution``, the size is set at each epoch's start, by Composer's rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from composer.algorithms import ProgressiveResizing as ComposerProgressiveResizing
from composer.core import Event, State
from composer.loggers import Logger


def decodes_at_a_size(loader: Iterable | None) -> bool:
    """Whether a loader decodes at a size it is told (``set_resolution`` and ``full_resolution``)."""
    return hasattr(loader, "set_resolution") and hasattr(loader, "full_resolution")


def elapsed_at_epoch_start(state: State) -> float:
    """The fraction of training done when the current epoch started: at EPOCH_START, Composer's elapsed duration;
    inside an epoch (a resume), the same counted without the epoch's batches, samples or tokens."""
    from composer.core import TimeUnit

    stamp, unit = state.timestamp, state.max_duration.unit if state.max_duration is not None else None
    done = {
        TimeUnit.EPOCH: lambda: int(stamp.epoch),
        TimeUnit.BATCH: lambda: int(stamp.batch) - int(stamp.batch_in_epoch),
        TimeUnit.SAMPLE: lambda: int(stamp.sample) - int(stamp.sample_in_epoch),
        TimeUnit.TOKEN: lambda: int(stamp.token) - int(stamp.token_in_epoch),
    }.get(unit)
    if int(stamp.batch_in_epoch) == 0 or done is None:
        elapsed = state.get_elapsed_duration()
        return float(elapsed.value) if elapsed is not None else 0.0
    return min(1.0, done() / state.max_duration.value)


class ProgressiveResizing(ComposerProgressiveResizing):
    """Composer's ProgressiveResizing; with a loader that decodes at a given size, that size instead."""

    def resolution_at(self, elapsed: float, full_size: int) -> int:
        """Composer's rule: ``initial_scale`` until ``delay_fraction``, a linear ramp, full size for the last
        ``finetune_fraction``; the side a multiple of ``size_increment``."""
        if elapsed < self.delay_fraction:
            ramp = 0.0
        else:
            span = 1.0 - self.finetune_fraction - self.delay_fraction
            ramp = 1.0 if span <= 0 else min(1.0, (elapsed - self.delay_fraction) / span)
        scale = self.initial_scale + (1.0 - self.initial_scale) * ramp
        step = self.size_increment
        return max(step, round(full_size * scale / step) * step)

    def match(self, event: Event, state: State) -> bool:
        if decodes_at_a_size(state.train_dataloader):
            # a run resumed inside an epoch starts no epoch: its size is set as the epoch's start set it
            resumed_inside = event == Event.FIT_START and int(state.timestamp.batch_in_epoch) > 0
            return event == Event.EPOCH_START or resumed_inside
        return super().match(event, state)

    def apply(self, event: Event, state: State, logger: Logger | None = None) -> None:
        loader = state.train_dataloader
        if not decodes_at_a_size(loader):
            return super().apply(event, state, logger)
        size = self.resolution_at(elapsed_at_epoch_start(state), loader.full_resolution)
        loader.set_resolution(size)
        if logger is not None:
            logger.log_metrics({"progressive_resizing/resolution": size})
