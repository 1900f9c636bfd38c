"""Loss functions: ``fn(predictions, targets) -> scalar``; targets are class indices or dense rows."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from composer.loss import binary_cross_entropy_with_logits, soft_cross_entropy
from torch import Tensor

__all__ = ["smoothed", "soft_cross_entropy", "binary_cross_entropy", "focal_loss", "mse_loss", "l1_loss", "regression_pair"]


def dense_targets(targets: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    """Index targets as one-hot rows; dense (already smoothed or mixed) targets as they are."""
    if targets.dim() == 1 or (targets.dim() == 2 and targets.shape[1] == 1 and num_classes > 1):
        return F.one_hot(targets.reshape(-1).long(), num_classes).to(dtype)
    return targets.to(dtype)


def _with_smoothing(fn: Callable[[Tensor, Tensor], Tensor], smoothing: float, logits: Tensor, targets: Tensor) -> Tensor:
    num_classes = logits.shape[1]
    dense = dense_targets(targets, num_classes, logits.dtype if logits.is_floating_point() else torch.float32)
    return fn(logits, dense * (1.0 - smoothing) + smoothing / num_classes)


def smoothed(fn: Callable[[Tensor, Tensor], Tensor], smoothing: float) -> Callable[[Tensor, Tensor], Tensor]:
    """``fn`` with label smoothing applied to its targets (``fn`` itself when smoothing is 0)."""
    return fn if smoothing == 0.0 else partial(_with_smoothing, fn, smoothing)


def binary_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return binary_cross_entropy_with_logits(logits, targets)


def _focal(gamma: float, logits: Tensor, targets: Tensor) -> Tensor:
    log_p = F.log_softmax(logits.float(), dim=1)
    dense = dense_targets(targets, logits.shape[1], log_p.dtype)
    weight = (1.0 - log_p.exp()).pow(gamma)
    return -(dense * weight * log_p).sum(dim=1).mean()


def focal_loss(gamma: float) -> Callable[[Tensor, Tensor], Tensor]:
    return partial(_focal, gamma)


def regression_pair(pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """(N, 1) predictions against (N,) targets: one value per sample either way."""
    target = target.float()
    return pred.reshape(target.shape), target


def mse_loss(pred: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(*regression_pair(pred, target))


def l1_loss(pred: Tensor, target: Tensor) -> Tensor:
    return F.l1_loss(*regression_pair(pred, target))
