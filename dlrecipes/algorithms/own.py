"""dlrecipes' own algorithms, registered exactly as a user's plugin would be.

This module is not imported with the built-ins: ``pyproject.toml`` lists it under the
``dlrecipes.algorithms`` entry-point group, so it arrives through the same route as a
third-party package.  The factories are light; the implementations (which import torch
and Composer) load only when a recipe uses them.
"""

from __future__ import annotations

from typing import Optional

from dlrecipes.registry import algorithms


@algorithms.register("layerwise_lr_decay")
def layerwise_lr_decay(decay: float = 0.75, block_depth: int = 2):
    """Smaller learning rates nearer the input: block d of D trains at lr * decay ** (D - 1 - d)."""
    from dlrecipes.algorithms.layerwise_lr_decay import LayerwiseLRDecay

    return LayerwiseLRDecay(decay=decay, block_depth=block_depth)


@algorithms.register("gradient_checkpointing")
def gradient_checkpointing(targets: Optional[list[str]] = None, every: int = 1):
    """Recompute the activations of residual blocks in backward instead of storing them (memory for compute)."""
    from dlrecipes.algorithms.gradient_checkpointing import GradientCheckpointing

    return GradientCheckpointing(targets=targets, every=every)
