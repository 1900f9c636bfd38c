"""What a model's outputs are and how their metrics are named (shared by data, models and validation).

A classifier has one output, its class logits; a task (``task:`` in a recipe) has several, each a
class label or regression values, described by the dataset as a :class:`DataIO`.  Metric names
are decided here so that validation (``checkpoint.monitor``) and the models that log them agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What a recipe gets without a metrics: section.
DEFAULT_METRICS = ("top1", "top5", "per_class_accuracy", "confusion_matrix")
DEFAULT_TRAIN_METRICS = ("top1", "top5")
# The evaluation loss (cross-entropy; for a task, the weighted sum of its outputs' losses): always
# evaluated, not a registry name.
EVAL_LOSS = "loss"


@dataclass(frozen=True)
class OutputSpec:
    """One target of a multi-output dataset: a class label, or ``size`` regression values."""

    kind: Literal["class", "regression"]
    size: int  # classes (kind "class") or values per sample (kind "regression"; 1 = a scalar)


@dataclass(frozen=True)
class DataIO:
    """What a multi-input / multi-output dataset yields: a sample is ``(*inputs, *outputs)`` in this order.

    A dataset declares it twice: as ``io=`` in its registry entry (a function of the
    factory's parameters, so recipes are checked without loading data) and on the
    :class:`~dlrecipes.data.splits.DatasetSplits` it returns.
    """

    inputs: dict[str, tuple[int, ...]]  # name -> shape of one sample
    outputs: dict[str, OutputSpec]

    def __post_init__(self) -> None:
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise ValueError(f"names used for an input and an output: {', '.join(sorted(both))}")


def output_metrics(spec: OutputSpec, train: bool = False) -> list[str]:
    """Metric names of one output: top1 (top5 above 5 classes) or mse/mae, and its loss in evaluation."""
    if spec.kind == "class":
        names = ["top1", "top5"] if spec.size > 5 else ["top1"]  # top-5 of 5 classes or fewer is always 1
    else:
        names = ["mse", "mae"]
    return names if train else [*names, EVAL_LOSS]


def metric_names(outputs: dict[str, OutputSpec], train: bool = False) -> list[str]:
    """``<output>/<metric>`` for every output (and ``loss``, the weighted total, in evaluation)."""
    names = [f"{name}/{metric}" for name, spec in outputs.items() for metric in output_metrics(spec, train)]
    return names if train else [EVAL_LOSS, *names]
