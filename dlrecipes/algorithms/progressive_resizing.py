"""Progressive resizing (Composer's), for every loader: one ``progressive_resizing:`` block, one schedule.

Composer's algorithm downsizes each decoded batch early in training and grows it to full size.
A loader that decodes at a size it is given (FFCV: ``set_resolution``) does better: it decodes at
the scheduled size directly, so nothing is decoded large only to be shrunk.  :class:`ProgressiveResizing`
is Composer's class (same parameters, same checkpoint name) with that second way added: when the
train loader has ``set_resolution``, the size is set at each epoch's start, by Composer's rule.
"""

from __future__ import annotations

from typing import Any, Optional

from composer.algorithms import ProgressiveResizing as ComposerProgressiveResizing
from composer.core import Event, State
from composer.loggers import Logger


def decodes_at_a_size(loader: Any) -> bool:
    """Whether a loader decodes at a size it is told (``set_resolution`` and ``full_resolution``)."""
    return hasattr(loader, "set_resolution") and hasattr(loader, "full_resolution")


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
            return event == Event.EPOCH_START
        return super().match(event, state)

    def apply(self, event: Event, state: State, logger: Optional[Logger] = None) -> None:
        loader = state.train_dataloader
        if not decodes_at_a_size(loader):
            return super().apply(event, state, logger)
        elapsed = state.get_elapsed_duration()
        size = self.resolution_at(float(elapsed.value) if elapsed is not None else 0.0, loader.full_resolution)
        loader.set_resolution(size)
        if logger is not None:
            logger.log_metrics({"progressive_resizing/resolution": size})
