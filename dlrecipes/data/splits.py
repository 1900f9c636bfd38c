"""What a dataset factory returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional


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
    :class:`DatasetSplits` it returns.
    """

    inputs: dict[str, tuple[int, ...]]  # name -> shape of one sample
    outputs: dict[str, OutputSpec]

    def __post_init__(self) -> None:
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise ValueError(f"names used for an input and an output: {', '.join(sorted(both))}")


@dataclass
class DatasetSplits:
    """A training and an evaluation split, plus what a model needs to know about them."""

    train: Any  # a torch Dataset yielding (image tensor, int label), or (*inputs, *outputs) when io is set
    eval: Any
    num_classes: int  # 0 when io is set: each output has its own
    input_shape: tuple[int, int, int]  # (channels, height, width) of one sample (of the first input when io is set)
    class_names: Optional[list[str]] = None
    # For image-folder data: crop_size, eval_crop_size, resize_size, min_scale, hflip, mean, std (the tensor cache reuses them)
    augment: Optional[dict[str, Any]] = None
    io: Optional[DataIO] = None  # several inputs and/or outputs (recipes with a task: section)
