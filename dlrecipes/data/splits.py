"""What a dataset factory returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlrecipes.core.outputs import DataIO, OutputSpec

if TYPE_CHECKING:
    from torch.utils.data import Dataset

__all__ = ["DataIO", "DatasetSplits", "OutputSpec"]


@dataclass
class DatasetSplits:
    """A training and an evaluation split, plus what a model needs to know about them."""

    train: Dataset  # a torch Dataset yielding (image tensor, int label), or (*inputs, *outputs) when io is set
    eval: Dataset
    num_classes: int  # 0 when io is set: each output has its own
    input_shape: tuple[int, int, int]  # (channels, height, width) of one sample (of the first input when io is set)
    class_names: list[str] | None = None
    # For image-folder data: crop_size, eval_crop_size, resize_size, min_scale, hflip, mean, std (the tensor cache
    # reuses them)
    augment: dict[str, Any] | None = None
    io: DataIO | None = None  # several inputs and/or outputs (recipes with a task: section)
    # How an image file becomes an input as the eval split does it (dlrecipes.data.preprocess); None: no image files
    preprocess: dict[str, Any] | None = None
    # DataLoaders passed in from Python (dlrecipes.train(train_data=DataLoader(...))): (train, eval), each used as it
    # is or None (that split's loader is built from its dataset as usual)
    loaders: tuple[Any, Any] | None = None
