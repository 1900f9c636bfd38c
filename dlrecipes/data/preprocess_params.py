"""The image-preprocessing parameters that several dataset factories share, declared once.

``image_folder``, ``imagenet``, ``hf`` and ``ffcv`` take the same keys for the same thing (the training crop, the
evaluation resize and crop, the augmentation, the normalisation).  Each key is declared here once: its type with
its range (checked at validation, :mod:`dlrecipes.core.ranges`), its meaning (read by ``dlrecipes list``, ``show
--explain`` and the reference pages, :mod:`dlrecipes.core.param_docs`) and its default, and each factory writes
``crop_size: CropSize = CROP_SIZE``.  ``tests/test_preprocess_params.py`` checks that every built-in dataset
taking one of these names uses them, so validation, documentation and defaults cannot drift apart.

A meaning travels with its type (``Annotated[T, Range(...), Doc(...)]``) where the type has a range; ``hflip``,
``mean`` and ``std`` have none at their top level, so their meanings (:data:`MEANINGS`) are added to the
``Args:`` section of each factory that takes them by :func:`shared_meanings`.  No torch here: the registry imports
this module to list and validate recipes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

from dlrecipes.core.param_docs import Doc, meaning_of_type
from dlrecipes.core.ranges import Range, Size
from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "CROP_SIZE",
    "CropSize",
    "EVAL_CROP_SIZE",
    "EvalCropSize",
    "HFLIP",
    "Hflip",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MEANINGS",
    "MIN_SCALE",
    "Mean",
    "MinScale",
    "meaning",
    "RESIZE_RATIO",
    "RESIZE_SIZE",
    "ResizeRatio",
    "ResizeSize",
    "SHARED",
    "Std",
    "shared_meanings",
]

# Sides in pixels: at least 1, at most core.ranges.Size's 8192 (a typo such as 22400 is refused, not allocated).
CropSize = Annotated[
    Size,
    Doc(
        "side in pixels of the square training crop (a random-resized crop), and so of the images the model is "
        "built for; evaluation crops the same size unless eval_crop_size is set."
    ),
]
ResizeSize = Annotated[
    Size,
    Doc(
        "pixels evaluation resizes each image's shorter side to before its centre crop (256 with a 224 crop keeps the "
        "central 87.5% of the side); also the side of tensor-cache images unless trainer.cache_size is set."
    ),
]
# null: the training crop size.  Union[None, int] (not Optional[int]) so that the type reads "null or int >= 1".
EvalCropSize = Annotated[
    None | int,
    Range(1, 8192),
    Doc(
        "side in pixels of the square centre crop evaluation takes (and exports expect); "
        "null: crop_size, a larger value "
        "evaluates at a higher resolution than training (FixRes)."
    ),
]
MinScale = Annotated[
    float,
    Range(0, 1, low_open=True),
    Doc(
        "smallest share of an image's area a training crop covers (random-resized crop area drawn from "
        "[min_scale, 1]); 1 crops the whole image every time, the default 0.08 is Inception's."
    ),
]
ResizeRatio = Annotated[
    float,
    Range(0, 1, low_open=True),
    Doc(
        "evaluation centre crop as a share of each image's shorter side, resized to the crop size; the default 0.875 "
        "is image_folder's 224 of 256, 1 keeps the whole shorter side."
    ),
]
# Per-channel values of pixels scaled to [0, 1]: a mean of 123.7 or a std of 58.4 (0..255 scale) is refused.
PixelMean = Annotated[float, Range(0, 1)]
PixelStd = Annotated[float, Range(0, 1, low_open=True)]
Hflip = bool
Mean = tuple[PixelMean, PixelMean, PixelMean]  # every one of these datasets decodes images as RGB
Std = tuple[PixelStd, PixelStd, PixelStd]

CROP_SIZE = 224
RESIZE_SIZE = 256
EVAL_CROP_SIZE = None
MIN_SCALE = 0.08
RESIZE_RATIO = CROP_SIZE / RESIZE_SIZE  # 0.875: FFCV's centre crop matches image folders' by default
HFLIP = True

MEANINGS = {  # the shared parameters whose types carry no Doc (see the module's docstring)
    "hflip": "flip each training image left-right with probability 0.5 (evaluation never flips); false: no flips.",
    "mean": "per-channel (R, G, B) mean subtracted from pixels scaled to [0, 1]; the default is ImageNet's.",
    "std": "per-channel (R, G, B) standard deviation that pixels scaled to [0, 1] are divided by, after the mean "
    "is subtracted; the default is ImageNet's.",
}

# name -> (type, default): what a factory taking the name declares
SHARED: dict[str, tuple[Any, Any]] = {
    "crop_size": (CropSize, CROP_SIZE),
    "resize_size": (ResizeSize, RESIZE_SIZE),
    "eval_crop_size": (EvalCropSize, EVAL_CROP_SIZE),
    "min_scale": (MinScale, MIN_SCALE),
    "resize_ratio": (ResizeRatio, RESIZE_RATIO),
    "hflip": (Hflip, HFLIP),
    "mean": (Mean, IMAGENET_MEAN),
    "std": (Std, IMAGENET_STD),
}


def meaning(name: str) -> str:
    """The shared meaning of parameter ``name``: its type's ``Doc``, else :data:`MEANINGS`."""
    return meaning_of_type(SHARED[name][0]) or MEANINGS[name]


def shared_meanings(factory: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: add the :data:`MEANINGS` of the shared parameters ``factory`` takes to its docstring's ``Args:``
    section, which must end the docstring (so the added lines join it)."""
    doc = inspect.cleandoc(factory.__doc__ or "")
    last_section = doc.rsplit("\n\n", 1)[-1]
    if not last_section.startswith("Args:"):
        raise ValueError(f"{factory.__qualname__}: its docstring must end with an Args: section")
    taken = [name for name in MEANINGS if name in inspect.signature(factory).parameters]
    factory.__doc__ = "\n".join([doc, *(f"    {name}: {MEANINGS[name]}" for name in taken)])
    return factory
