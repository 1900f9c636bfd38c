"""Layer-wise learning-rate decay: discriminative learning rates by depth.

Blocks near the input get smaller learning rates than blocks near the output: the block at
depth ``d`` of ``D`` (the head is ``D - 1``) trains at ``lr * decay ** (D - 1 - d)``.  Useful
when fine-tuning, where early features are already good and the head is new.

Written the Composer way: :func:`apply_layerwise_lr_decay` does the work on a model and an
optimizer; :class:`LayerwiseLRDecay` only applies it at ``Event.INIT`` (before Composer
compiles the schedulers, so schedules scale each group from its own base rate).  The
registered factory lives in :mod:`dlrecipes.algorithms`.
"""

from __future__ import annotations

import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from torch import nn

__all__ = ["block_index", "apply_layerwise_lr_decay", "LayerwiseLRDecay"]


def block_index(model: nn.Module, block_depth: int = 2) -> dict[str, int]:
    """Parameter name -> block number, blocks numbered from the input (0) to the head.

    A block is the first ``block_depth`` components of a parameter's name (``layer1.0`` in
    ``layer1.0.conv1.weight``), in the order the model registers its parameters.
    """
    blocks: dict[str, int] = {}
    index: dict[str, int] = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        key = ".".join(parts[: min(block_depth, len(parts) - 1)]) or parts[0]
        index[name] = blocks.setdefault(key, len(blocks))
    return index


def apply_layerwise_lr_decay(
    model: nn.Module, optimizer: torch.optim.Optimizer, decay: float, block_depth: int = 2
) -> list[float]:
    """Split each optimizer group by block and scale its ``lr`` (and ``initial_lr``) by depth.

    Returns the scale of every block, input first.  Group options (weight decay, momentum)
    are kept; a group is split only where its parameters span several blocks.
    """
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    names = {id(p): n for n, p in model.named_parameters()}
    index = block_index(model, block_depth)
    depth = max(index.values()) + 1
    scales = [decay ** (depth - 1 - d) for d in range(depth)]
    new_groups = []
    for group in optimizer.param_groups:
        by_block: dict[int, list] = {}
        for p in group["params"]:
            by_block.setdefault(index[names[id(p)]], []).append(p)
        for block, params in sorted(by_block.items()):
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = params
            g["lr"] = group["lr"] * scales[block]
            if "initial_lr" in group:
                g["initial_lr"] = group["initial_lr"] * scales[block]
            g["layerwise_block"] = block
            new_groups.append(g)
    state = optimizer.state
    optimizer.param_groups.clear()
    for g in new_groups:
        optimizer.add_param_group(g)
    optimizer.state = state  # per-parameter state (momentum) is keyed by parameter, so it survives
    return scales


class LayerwiseLRDecay(Algorithm):
    """Applies :func:`apply_layerwise_lr_decay` once, at ``Event.INIT``."""

    def __init__(self, decay: float = 0.75, block_depth: int = 2):
        self.decay = decay
        self.block_depth = block_depth
        self.scales: list[float] | None = None

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if not state.optimizers:
            raise ValueError("layerwise_lr_decay needs the optimizer at Event.INIT")
        network = getattr(state.model, "module", state.model)  # name blocks inside the ComposerClassifier
        for optimizer in state.optimizers:
            self.scales = apply_layerwise_lr_decay(network, optimizer, self.decay, self.block_depth)
        logger.log_hyperparameters(
            {"layerwise_lr_decay/blocks": len(self.scales), "layerwise_lr_decay/min_scale": self.scales[0]}
        )
