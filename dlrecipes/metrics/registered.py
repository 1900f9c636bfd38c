"""The built-in metrics, by name (``metrics:`` and ``train_metrics:`` in a recipe).

A recipe lists names, or maps names to parameters::

    metrics: [top1, top5, macro_f1, confusion_matrix]
    metrics: {accuracy: {top_k: 3}, f1: {average: weighted}, per_class_accuracy: {}}

Each is torchmetrics-backed and logged as ``metrics/eval/<name>`` (``metrics/train/<name>``
for ``train_metrics``), so ``checkpoint.monitor`` and early stopping can watch it.  Two are
not a number per evaluation but a table (``report=True``): ``confusion_matrix`` and
``per_class_accuracy`` are gathered at every evaluation and written at the end of the run for
the evaluation the best checkpoint was saved at (the last one without ``checkpoint.monitor``),
as CSV and PNG under ``<run dir>/report/`` with the dataset's class names where it has them.

Factories take the class count as a positional-only parameter (supplied by the builder)
and import torchmetrics inside, so validation stays fast.
"""

from __future__ import annotations

from typing import Literal

from dlrecipes.registry import metrics

Average = Literal["macro", "micro", "weighted"]

# torchmetrics checks every update's labels with torch.unique, which waits for the GPU each time;
# the loss has already checked them (cross-entropy refuses a label outside the classes).
UNCHECKED = {"validate_args": False}


def _accuracy(num_classes: int, top_k: int, average: str):
    from torchmetrics.classification import MulticlassAccuracy

    return MulticlassAccuracy(num_classes=num_classes, top_k=min(top_k, num_classes), average=average, **UNCHECKED)


@metrics.register("top1")
def top1(num_classes: int, /):
    """Top-1 accuracy (the fraction of samples whose highest score is the label)."""
    return _accuracy(num_classes, 1, "micro")


@metrics.register("top5", top_k=lambda p: 5)
def top5(num_classes: int, /):
    """Top-5 accuracy (top-k capped at the class count)."""
    return _accuracy(num_classes, 5, "micro")


@metrics.register("accuracy", top_k=lambda p: p.get("top_k", 1))
def accuracy(num_classes: int, /, top_k: int = 1, average: Literal["micro", "macro"] = "micro"):
    """Top-k accuracy; average=macro is the mean of the per-class accuracies (balanced accuracy).

    Args:
        top_k: a sample counts as right when its label is among its k highest scores (k capped at the class count).
        average: 'micro' is the fraction of all samples that are right; 'macro' the mean of the per-class
            accuracies, each class weighing the same (balanced accuracy).
    """
    return _accuracy(num_classes, top_k, average)


@metrics.register("f1")
def f1(num_classes: int, /, average: Average = "macro"):
    """F1 score (harmonic mean of precision and recall), macro-, micro- or support-weighted-averaged.

    Args:
        average: how the per-class scores combine: 'macro' their plain mean, 'weighted' their mean weighted by
            each class's sample count, 'micro' one score from the counts of all classes summed.
    """
    from torchmetrics.classification import MulticlassF1Score

    return MulticlassF1Score(num_classes=num_classes, average=average, **UNCHECKED)


@metrics.register("macro_f1")
def macro_f1(num_classes: int, /):
    """F1 score averaged over classes, each class counting the same."""
    return f1(num_classes, average="macro")


@metrics.register("micro_f1")
def micro_f1(num_classes: int, /):
    """F1 score over all samples (equals top-1 accuracy for single-label data)."""
    return f1(num_classes, average="micro")


@metrics.register("precision")
def precision(num_classes: int, /, average: Average = "macro"):
    """Precision (of the samples predicted as a class, the fraction that are), averaged over classes.

    Args:
        average: how the per-class scores combine: 'macro' their plain mean, 'weighted' their mean weighted by
            each class's sample count, 'micro' one score from the counts of all classes summed.
    """
    from torchmetrics.classification import MulticlassPrecision

    return MulticlassPrecision(num_classes=num_classes, average=average, **UNCHECKED)


@metrics.register("recall")
def recall(num_classes: int, /, average: Average = "macro"):
    """Recall (of the samples of a class, the fraction predicted as it), averaged over classes.

    Args:
        average: how the per-class scores combine: 'macro' their plain mean, 'weighted' their mean weighted by
            each class's sample count, 'micro' one score from the counts of all classes summed.
    """
    from torchmetrics.classification import MulticlassRecall

    return MulticlassRecall(num_classes=num_classes, average=average, **UNCHECKED)


@metrics.register("confusion_matrix", report=True)
def confusion_matrix(num_classes: int, /):
    """Counts of (true class, predicted class) at the best evaluation: report/confusion_matrix.{csv,png}."""
    from torchmetrics.classification import MulticlassConfusionMatrix

    return MulticlassConfusionMatrix(num_classes=num_classes, **UNCHECKED)


@metrics.register("per_class_accuracy", report=True)
def per_class_accuracy(num_classes: int, /):
    """Each class's accuracy (recall) at the best evaluation: report/per_class_accuracy.{csv,png}."""
    return confusion_matrix(num_classes)
