"""MixUp or CutMix, one of the two per batch (timm's ``Mixup`` in batch mode, as DeiT and ResNet strikes back's
A1-A3 train): with probability ``switch_prob`` the batch is CutMixed (a box pasted from the batch reversed, its
mixing weight the kept area's share), else MixUped (a convex mix with the batch reversed, lam ~
Beta(mixup_alpha, mixup_alpha)); the labels are mixed with the same lam, with label smoothing if asked.

The draws and the mixing are timm's own (``timm.data.Mixup``: numpy's generator, which Composer seeds and
checkpoints); :class:`MixUpCutMix` applies it to each training batch before the forward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from timm.data import Mixup


class MixUpCutMix(Algorithm):
    """Each training batch (images batch[0], class labels batch[1]) mixed by timm's Mixup, the labels made soft."""

    def __init__(
        self,
        mixup_alpha: float,
        cutmix_alpha: float,
        switch_prob: float,
        prob: float,
        label_smoothing: float,
        correct_lam: bool,
    ):
        self.settings = {
            "mixup_alpha": mixup_alpha,
            "cutmix_alpha": cutmix_alpha,
            "switch_prob": switch_prob,
            "prob": prob,
            "label_smoothing": label_smoothing,
            "correct_lam": correct_lam,
            "mode": "batch",
        }
        self.mixup: Mixup | None = None

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BEFORE_FORWARD

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if self.mixup is None:  # the class count is the model's
            model = state.model.module if state.is_model_ddp else state.model
            self.mixup = Mixup(num_classes=model.num_classes, **self.settings)
        images, labels = state.batch_get_item(0), state.batch_get_item(1)
        if images.shape[0] % 2:
            raise ValueError(f"algorithms.mixup_cutmix: timm's batch mixing needs an even batch, got {images.shape[0]}")
        with torch.no_grad():
            images, labels = self.mixup(images, labels)
        state.batch_set_item(0, images)
        state.batch_set_item(1, labels)

    def state_dict(self) -> dict[str, Any]:
        return {}


__all__ = ["MixUpCutMix"]
