"""Loss functions: ``fn(predictions, targets) -> scalar``; targets are class indices or dense rows."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from composer.loss import binary_cross_entropy_with_logits
from composer.loss.utils import infer_target_type
from torch import Tensor

__all__ = [
    "smoothed",
    "soft_cross_entropy",
    "binary_cross_entropy",
    "focal_loss",
    "mse_loss",
    "l1_loss",
    "regression_pair",
    "one_hot",
]


def one_hot(targets: Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Class indices as one-hot rows along dimension 1, with nothing read back from the device.

    Composer's ``_one_hot`` reads the labels' minimum and maximum back three times per call (a
    host-device synchronisation each, on every batch with label smoothing), and torch's ``one_hot``
    does the same on the CPU. A scatter needs neither: a label past ``num_classes`` still fails in
    it (a device-side assert on a GPU), and a negative label gives a row of zeros, as Composer's does.
    """
    index = targets.long().unsqueeze(1)
    shape = list(index.shape)
    shape[1] = num_classes
    rows = torch.zeros(shape, dtype=dtype, device=targets.device)
    return rows.scatter_(1, index.clamp(min=0), (index >= 0).to(dtype))


def dense_targets(targets: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    """Index targets as one-hot rows; dense (already smoothed or mixed) targets as they are."""
    if targets.dim() == 1 or (targets.dim() == 2 and targets.shape[1] == 1 and num_classes > 1):
        return one_hot(targets.reshape(-1), num_classes, dtype)
    return targets.to(dtype)


def soft_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """Composer's ``soft_cross_entropy`` (index or dense targets), the same arithmetic bit for bit, without its
    checks of the targets' total probability: each read two values back from the device on every batch with
    dense (smoothed, mixed) targets. Dense targets are averaged per unit of probability, as Composer does."""
    if infer_target_type(input, target) == "indices":
        return F.cross_entropy(input, target, weight=weight, reduction=reduction)
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"{reduction} reduction not supported.")
    xentropy = -(target * F.log_softmax(input, dim=1))
    if weight is not None:
        xentropy = torch.movedim(torch.movedim(xentropy, 1, -1) * weight, -1, 1)
    xentropy = xentropy.sum(dim=1)
    if reduction == "sum":
        return xentropy.sum()
    if reduction == "mean":
        num_examples = torch.numel(xentropy)
        xentropy = xentropy.mean()
        xentropy *= num_examples / target.sum()  # on the device: no read-back
    return xentropy


def _with_smoothing(
    fn: Callable[[Tensor, Tensor], Tensor], smoothing: float, logits: Tensor, targets: Tensor
) -> Tensor:
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
