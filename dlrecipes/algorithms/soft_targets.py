"""Soft targets with no host-device synchronisation: Composer's label smoothing, MixUp and CutMix, their
arithmetic bit for bit.

Composer's ``smooth_labels`` makes its one-hot rows with ``_one_hot``, which reads the labels'
minimum and maximum back from the device three times per batch to check them; on a GPU each read
makes the step wait for every kernel queued before it.  Here the rows come from a scatter
(:func:`dlrecipes.losses.functions.one_hot`), and the smoothed targets are Composer's
``targets * (1 - smoothing) + smoothing / num_classes``.  MixUp and CutMix (without
``interpolate_loss``) make the same one-hot rows through ``ensure_targets_one_hot``: their modules
are given :func:`ensure_targets_one_hot` below, which makes them the same way.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from composer.algorithms import LabelSmoothing as ComposerLabelSmoothing
from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from composer.loss.utils import infer_target_type

from dlrecipes.losses.functions import one_hot

A = TypeVar("A", bound=Algorithm)  # a Composer MixUp or CutMix


def smooth_labels(logits: torch.Tensor, targets: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    """Targets (class indices, or dense rows of the logits' shape) as float32 rows mixed with the uniform
    distribution: ``(1 - smoothing) * targets + smoothing / num_classes``, as Composer's ``smooth_labels``."""
    num_classes = logits.shape[1]
    if infer_target_type(logits, targets) == "indices":
        targets = one_hot(targets, num_classes)
    return (targets.float() * (1.0 - smoothing)) + (smoothing / num_classes)


def ensure_targets_one_hot(input: torch.Tensor, targets: torch.Tensor, num_classes: int | None = None) -> torch.Tensor:
    """Composer's ``ensure_targets_one_hot`` (index targets as float32 one-hot rows, dense ones as float32),
    with no read-back."""
    if infer_target_type(input, targets) == "indices":
        targets = one_hot(targets, input.shape[1] if num_classes is None else num_classes)
    return targets.float()


def without_read_backs(algorithm: A) -> A:
    """A Composer MixUp or CutMix whose one-hot targets are made by :func:`ensure_targets_one_hot`."""
    import importlib

    module = importlib.import_module(type(algorithm).__module__)
    if getattr(module, "ensure_targets_one_hot", None) is not None:
        module.ensure_targets_one_hot = ensure_targets_one_hot  # the same rows, bit for bit
    return algorithm


class LabelSmoothing(ComposerLabelSmoothing):
    """Composer's ``LabelSmoothing`` (same events, same restore of the labels after the loss) with
    :func:`smooth_labels`."""

    def apply(self, event: Event, state: State, logger: Logger) -> Any | None:
        if event != Event.BEFORE_LOSS:
            return super().apply(event, state, logger)
        labels = state.batch_get_item(self.target_key)
        if not isinstance(state.outputs, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise TypeError("label_smoothing needs one tensor of outputs and one of labels")
        self.original_labels = labels.clone()
        state.batch_set_item(self.target_key, smooth_labels(state.outputs, labels, smoothing=self.smoothing))
        return None
