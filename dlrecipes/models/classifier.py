"""Wrap an ``nn.Module`` as a Composer classifier with top-1/top-5 accuracy and loss."""

from __future__ import annotations

from torch import nn


def classification_metrics(num_classes: int, loss: bool = True):
    """torchmetrics: top-1 and top-5 accuracy (top-k capped at the class count), and cross-entropy.

    Training leaves the loss metric out (the training loss is logged already) and skips
    torchmetrics' input checks: they read values back from the device (a host-device
    synchronisation) and cost more than the update itself.
    """
    from composer.metrics import CrossEntropy
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy

    checks = {"validate_args": loss}  # eval metrics (loss=True) keep them
    metrics = {
        "top1": MulticlassAccuracy(num_classes=num_classes, top_k=1, average="micro", **checks),
        "top5": MulticlassAccuracy(num_classes=num_classes, top_k=min(5, num_classes), average="micro", **checks),
    }
    if loss:
        metrics["loss"] = CrossEntropy()
    return MetricCollection(metrics)


def wrap_classifier(module: nn.Module, num_classes: int, loss: str = "cross_entropy"):
    """A ComposerClassifier logging metrics/train/{top1,top5}, loss/train/total and metrics/eval/{top1,top5,loss}.

    ``loss`` is the training loss: ``cross_entropy`` (softmax) or ``binary_cross_entropy``
    (one sigmoid per class), both Composer's, both accepting smoothed or mixed targets.
    """
    from composer.loss import binary_cross_entropy_with_logits, soft_cross_entropy
    from composer.models import ComposerClassifier

    loss_fn = {"cross_entropy": soft_cross_entropy, "binary_cross_entropy": binary_cross_entropy_with_logits}[loss]
    return ComposerClassifier(
        module,
        num_classes=num_classes,
        train_metrics=classification_metrics(num_classes, loss=False),
        val_metrics=classification_metrics(num_classes),
        loss_fn=loss_fn,
    )
