"""What a dataset factory returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class DatasetSplits:
    """A training and an evaluation split, plus what a model needs to know about them."""

    train: Any  # a torch Dataset yielding (image tensor, int label)
    eval: Any
    num_classes: int
    input_shape: tuple[int, int, int]  # (channels, height, width) of one sample
    class_names: Optional[list[str]] = None
    # For image-folder data: crop_size, resize_size, min_scale, hflip, mean, std (the tensor cache reuses them)
    augment: Optional[dict[str, Any]] = None
