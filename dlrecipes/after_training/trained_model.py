"""After training: a run's network with a checkpoint's weights, in an evaluation Trainer, and its data: what
``eval``, ``export`` and ``predict`` (from a run) start from. Only the model's weights are loaded: no optimizer
state, no schedule, no step.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from dlrecipes.errors import RecipeError

if TYPE_CHECKING:
    from torch import nn

    from dlrecipes.after_training.opened import Trained
    from dlrecipes.data.splits import DatasetSplits
    from dlrecipes.engine.trainer import Trainer


def trained_model(trained: Trained) -> tuple[Trainer, DatasetSplits]:
    """The opened run's network with its checkpoint's weights, in an evaluation Trainer, and the data:
    (trainer, data), as its recipe (with the command's overrides) says. The checkpoint (a run's own too) is read
    tensors-only unless ``trained.trust`` (``--trust-checkpoint``): one that holds other Python objects is refused
    before any of it is loaded."""
    from dlrecipes.builders.trainer import build_eval_trainer
    from dlrecipes.core.devices import resolve_device
    from dlrecipes.loggers.terminal import hide_harmless_warnings
    from dlrecipes.records.checkpoints import check_checkpoint

    config, target, trust = trained.config, trained.found, trained.trust
    if config.task is not None:
        raise RecipeError(
            "task: this command works on classifiers with one image input and one label; this "
            "recipe has a task: section (several inputs/outputs)"
        )
    check_checkpoint(target.checkpoint, trust, key="--checkpoint")
    with warnings.catch_warnings():
        hide_harmless_warnings()
        warnings.filterwarnings("ignore", message="No optimizer was specified")  # none is needed: no step is taken
        try:
            trainer, data = build_eval_trainer(
                config, target.checkpoint, resolve_device(config.trainer.device), trust=trust
            )
        except RuntimeError as exc:
            if "state_dict" not in str(exc):
                raise
            raise RecipeError(
                f"--checkpoint: {target.checkpoint} does not fit {target.recipe}'s model "
                f"({_first_mismatch(str(exc))}); give the recipe it was trained with, or undo the "
                "model overrides"
            ) from None
    return trainer, data


def _first_mismatch(message: str) -> str:
    """The first useful line of torch's ``load_state_dict`` error (which names every mismatching key)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = next(
        (line for line in lines[1:] if line.startswith(("size mismatch", "Missing key", "Unexpected key"))),
        lines[0] if lines else "",
    )
    return detail[:300]


def network_of(trainer: Trainer) -> nn.Module:
    """The bare network (images in, logits out) inside an evaluation Trainer's model."""
    state = trainer.state
    composer_model = state.model.module if state.is_model_ddp else state.model
    return composer_model.module


__all__ = ["network_of", "trained_model"]
