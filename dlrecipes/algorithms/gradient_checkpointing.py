"""Gradient checkpointing of a model's blocks: memory for compute.

Inside a checkpointed block, forward keeps only the block's inputs; backward runs the block
again to get the activations it needs.  Peak activation memory drops to roughly one block's
worth plus the block boundaries, at the cost of about one extra forward pass.

:func:`apply_gradient_checkpointing` does the work (it changes the class of each target
block to a subclass whose ``forward`` is checkpointed, so copies of the model, such as
EMA's, stay correct); :class:`GradientCheckpointing` applies it at ``Event.INIT``.
Batch-norm running statistics are updated once per step, as without checkpointing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["DEFAULT_TARGETS", "apply_gradient_checkpointing", "GradientCheckpointing"]

# Residual block classes of torchvision, timm and dlrecipes' CIFAR ResNets.
DEFAULT_TARGETS = ("BasicBlock", "Bottleneck", "PreActBlock")

_checkpointed_classes: dict[type, type] = {}


@contextlib.contextmanager
def _batchnorm_stats_frozen(module: nn.Module) -> Iterator[None]:
    """Run ``module`` without moving its batch-norm running statistics (for the recomputation)."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, saved):
            m.momentum = momentum
            if tracked is not None:
                m.num_batches_tracked.copy_(tracked)


def _checkpointed_class(cls: type) -> type:
    if cls not in _checkpointed_classes:

        def forward(self, *args, **kwargs):
            if not (self.training and torch.is_grad_enabled()):
                return cls.forward(self, *args, **kwargs)
            calls = [0]

            def run(*inputs):
                calls[0] += 1
                if calls[0] == 1:
                    return cls.forward(self, *inputs, **kwargs)
                with _batchnorm_stats_frozen(self):
                    return cls.forward(self, *inputs, **kwargs)

            return checkpoint(run, *args, use_reentrant=False)

        _checkpointed_classes[cls] = type(f"Checkpointed{cls.__name__}", (cls,), {"forward": forward})
    return _checkpointed_classes[cls]


def apply_gradient_checkpointing(model: nn.Module, targets: Sequence[str] | None = None, every: int = 1) -> int:
    """Checkpoint every ``every``-th module whose class name is in ``targets``; returns how many."""
    targets = tuple(targets or DEFAULT_TARGETS)
    if every < 1:
        raise ValueError(f"every must be at least 1, got {every}")
    matches = [m for m in model.modules() if type(m).__name__ in targets]
    for module in matches[::every]:
        module.__class__ = _checkpointed_class(type(module))
    if not matches:
        names = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"no modules of type {', '.join(targets)} to checkpoint; the model has: {', '.join(names)}")
    return len(matches[::every])


class GradientCheckpointing(Algorithm):
    """Applies :func:`apply_gradient_checkpointing` once, at ``Event.INIT``."""

    def __init__(self, targets: Sequence[str] | None = None, every: int = 1):
        self.targets = targets
        self.every = every

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        count = apply_gradient_checkpointing(state.model, self.targets, self.every)
        logger.log_hyperparameters({"gradient_checkpointing/blocks": count})
