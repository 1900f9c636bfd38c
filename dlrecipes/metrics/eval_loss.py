"""The evaluation loss: cross-entropy averaged over the evaluation set's samples.

Composer's ``CrossEntropy`` metric averages the per-batch means, so its value depends on how the
set is cut into batches and shards: a smaller last batch weighs more, and two processes or another
batch size give another number.  This one sums the per-sample losses and counts the samples (both
summed over processes), so the loss of a checkpoint on a split is one number, however it is run.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric


class SampleMeanCrossEntropy(Metric):
    """Mean cross-entropy per sample over everything updated (targets: class indices or probabilities)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, ignore_index: int = -100, **kwargs):
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        self.add_state("sum_loss", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("samples", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        from composer.loss.utils import infer_target_type
        from torch.nn import functional as F

        if infer_target_type(preds, targets) == "one_hot":
            losses = -(targets * F.log_softmax(preds.float(), dim=1)).sum(dim=1)
            counted = torch.ones_like(losses, dtype=torch.bool)
        else:
            losses = F.cross_entropy(preds.float(), targets, ignore_index=self.ignore_index, reduction="none")
            counted = targets != self.ignore_index
        self.sum_loss += losses[counted].sum().double()
        self.samples += counted.sum()

    def compute(self) -> torch.Tensor:
        return (self.sum_loss / self.samples).float()


__all__ = ["SampleMeanCrossEntropy"]
