"""Test-time augmentation (airbench's ``infer``): each evaluation batch's logits averaged over mirrored and
translated views of its images.

- level 0: the logits of the images alone;
- level 1 (``flip``): 0.5 * f(x) + 0.5 * f(mirror(x));
- level 2 (``flip_translate``): 0.5 * level1(x) + 0.25 * level1(up-left) + 0.25 * level1(down-right), the two
  translations crops of the images reflect-padded by ``pad`` pixels, shifted by ``pad`` up and left, and by
  ``pad`` down and right.

:func:`tta_logits` is the functional form; :class:`TestTimeAugmentation` applies it at Composer's
``EVAL_AFTER_FORWARD``, replacing the batch's outputs before the metrics read them, so that every evaluation of
a Trainer holding it (during training, and ``dlrecipes eval``, which rebuilds it from the run's recipe) scores
the averaged logits.  The network and its weights are unchanged: checkpoints and exports do not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from composer.core import Algorithm, Event, State
from composer.core.precision import get_precision_context
from composer.loggers import Logger
from composer.utils.batch_helpers import batch_get, batch_set

LEVEL_NAMES = {0: "none", 1: "flip", 2: "flip_translate"}


def mirrored(
    forward: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, logits: torch.Tensor | None = None
) -> torch.Tensor:
    """0.5 * f(x) + 0.5 * f(mirror(x)); ``logits``: f(x), when already computed."""
    plain = forward(images) if logits is None else logits
    return 0.5 * plain + 0.5 * forward(images.flip(-1))


def tta_logits(
    forward: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    level: int,
    pad: int = 1,
    logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """The test-time-augmented logits of ``images`` (N, C, H, W) at ``level`` (0, 1 or 2, as the module says);
    ``logits``: ``forward(images)``, when already computed."""
    if level == 0:
        return forward(images) if logits is None else logits
    flipped = mirrored(forward, images, logits)
    if level == 1:
        return flipped
    height, width = images.shape[-2:]
    padded = F.pad(images, (pad,) * 4, mode="reflect")
    shifted = [padded[..., :height, :width], padded[..., 2 * pad : 2 * pad + height, 2 * pad : 2 * pad + width]]
    translated = torch.stack([mirrored(forward, view) for view in shifted]).mean(0)
    return 0.5 * flipped + 0.5 * translated


class TestTimeAugmentation(Algorithm):
    """Every evaluation batch's outputs become :func:`tta_logits` of its images (``level`` 1 or 2)."""

    __test__ = False  # not a pytest class

    def __init__(self, level: int = 2, pad: int = 1):
        self.level, self.pad = level, pad

    def match(self, event: Event, state: State) -> bool:
        return self.level > 0 and event in (Event.FIT_START, Event.EVAL_AFTER_FORWARD)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.FIT_START:  # the run's record says its evaluations were augmented
            logger.log_hyperparameters({"eval/tta": LEVEL_NAMES[self.level]})
            return
        model = state.model.module if state.is_model_ddp else state.model
        batch = state.batch
        images = batch_get(batch, 0)

        def forward(views: torch.Tensor) -> torch.Tensor:
            return model.eval_forward(batch_set(batch, 0, views))

        with torch.no_grad(), get_precision_context(state.precision, state.precision_config):
            state.outputs = tta_logits(forward, images, self.level, self.pad, logits=state.outputs)

    def state_dict(self) -> dict[str, Any]:
        return {}


__all__ = ["LEVEL_NAMES", "TestTimeAugmentation", "mirrored", "tta_logits"]
