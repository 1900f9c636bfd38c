"""Wrap an ``nn.Module`` as a Composer classifier with the recipe's loss and metrics."""

from __future__ import annotations

from typing import Any

from torch import nn

from dlrecipes import registry
from dlrecipes.core.outputs import DEFAULT_METRICS, DEFAULT_TRAIN_METRICS, EVAL_LOSS
from dlrecipes.registry import build_component


def classification_metrics(num_classes: int, names: dict[str, dict[str, Any]] | None = None, train: bool = False):
    """The named metrics (the report tables excluded) as a torchmetrics MetricCollection.

    Evaluation adds ``loss`` (cross-entropy per sample over the evaluation set, however it is batched).  Training skips
    torchmetrics' input checks: they read values back from the device (a host-device
    synchronisation) and cost more than the update itself; evaluation keeps them.
    """
    from torchmetrics import MetricCollection

    from dlrecipes.metrics.eval_loss import SampleMeanCrossEntropy

    if names is None:
        names = {name: {} for name in (DEFAULT_TRAIN_METRICS if train else DEFAULT_METRICS)}
    metrics = {}
    for name, params in names.items():
        if registry.metrics.get(name).metadata.get("report"):
            continue  # tables, gathered by dlrecipes.metrics.report
        metric = build_component(registry.metrics, name, params, f"metrics.{name}", num_classes=num_classes)
        if train:
            metric.validate_args = False
        metrics[name] = metric
    if not train:
        metrics[EVAL_LOSS] = SampleMeanCrossEntropy()
    return MetricCollection(metrics)


def wrap_classifier(
    module: nn.Module,
    num_classes: int,
    loss: str | dict[str, Any] = "cross_entropy",
    metrics: dict[str, dict[str, Any]] | None = None,
    train_metrics: dict[str, dict[str, Any]] | None = None,
):
    """A ComposerClassifier logging metrics/train/<name>, loss/train/total and metrics/eval/<name>.

    ``loss`` is the recipe's training loss (a name, or a name with parameters; see
    :mod:`dlrecipes.losses`); ``metrics`` and ``train_metrics`` map metric names to parameters
    (default: top-1 and top-5 accuracy).
    """
    from composer.models import ComposerClassifier, ComposerModel

    from dlrecipes.losses import build_loss

    if isinstance(module, ComposerModel):  # passed in from Python already wrapped: its own loss and metrics
        return module
    return ComposerClassifier(
        module,
        num_classes=num_classes,
        train_metrics=classification_metrics(num_classes, train_metrics, train=True),
        val_metrics=classification_metrics(num_classes, metrics),
        loss_fn=build_loss(loss),
    )
