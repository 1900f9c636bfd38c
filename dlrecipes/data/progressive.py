"""The progressive-resizing schedule, shared by Composer's batch resizing and the FFCV decoder.

One ``progressive_resizing:`` block in a recipe (Composer's parameters: ``initial_scale``,
``delay_fraction``, ``finetune_fraction``, ``size_increment``) gives the same sizes whichever
loader is in use: Composer's algorithm resizes decoded batches, the FFCV loader decodes at
the size directly.
"""

from __future__ import annotations


def progressive_scale(elapsed: float, initial_scale: float, delay_fraction: float, finetune_fraction: float) -> float:
    """Composer's rule: ``initial_scale`` until ``delay_fraction``, a linear ramp, full size for the last ``finetune_fraction``."""
    if elapsed < delay_fraction:
        return initial_scale
    ramp = 1.0 - finetune_fraction - delay_fraction
    frac = 1.0 if ramp <= 0 else min(1.0, (elapsed - delay_fraction) / ramp)
    return initial_scale + (1.0 - initial_scale) * frac


def progressive_resolution(
    elapsed: float,
    full_size: int,
    initial_scale: float = 0.5,
    delay_fraction: float = 0.5,
    finetune_fraction: float = 0.2,
    size_increment: int = 4,
) -> int:
    """The side length at ``elapsed`` (fraction of training), a multiple of ``size_increment``."""
    scale = progressive_scale(elapsed, initial_scale, delay_fraction, finetune_fraction)
    return max(size_increment, round(full_size * scale / size_increment) * size_increment)
