"""Composer's layer freezing, with checkpoints that can be written after a layer froze.

Composer's ``LayerFreezing`` takes frozen parameters out of the optimizer's param groups but leaves their state
(momentum buffers) in ``optimizer.state``; torch's ``Optimizer.state_dict()`` maps each state entry to its
parameter's index in the groups, so the first checkpoint after a freeze failed with ``KeyError: <id of a
parameter>``. A frozen parameter is never stepped again, so its state is dropped with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer.algorithms import LayerFreezing as ComposerLayerFreezing

if TYPE_CHECKING:
    from composer.core import Event, State
    from composer.loggers import Logger
    from torch.optim import Optimizer


def drop_state_of_removed_params(optimizer: Optimizer) -> int:
    """Remove ``optimizer.state`` entries of parameters in none of its param groups; returns how many."""
    kept = {id(p) for group in optimizer.param_groups for p in group["params"]}
    gone = [p for p in optimizer.state if id(p) not in kept]
    for param in gone:
        del optimizer.state[param]
    return len(gone)


class LayerFreezing(ComposerLayerFreezing):
    """Composer's ``LayerFreezing`` (see the module docstring)."""

    def apply(self, event: Event, state: State, logger: Logger) -> int | None:
        result = super().apply(event, state, logger)
        for optimizer in state.optimizers or ():
            drop_state_of_removed_params(optimizer)
        return result
