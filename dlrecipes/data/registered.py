"""Datasets: the built-in dataset factories, registered in :data:`dlrecipes.registry.datasets`.

A dataset factory takes keyword parameters from the recipe and returns a
:class:`~dlrecipes.data.splits.DatasetSplits` (train and eval datasets yielding
``(image, label)``, the class count and the input shape).  The implementations (and
torch/torchvision) are imported inside each factory so that listing and validating recipes
stays fast.  The factories of the datasets read from image files are in :mod:`.image_factories` (added by name
here, with what is known of each); the keys several datasets share are declared once, in :mod:`.dataset_params`
and :mod:`.preprocess_params`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrecipes.core.ranges import AtLeastOne, Classes, Size
from dlrecipes.data.dataset_params import (
    CifarAugment,
    CifarDownload,
    CifarFlip,
    CifarPadding,
    CifarPaddingMode,
    CifarSize,
    DigitsAugment,
    EvalFraction,
    SplitSeed,
)
from dlrecipes.data.image_factories import ffcv, hf, image_folder, imagenet, shards
from dlrecipes.data.preprocess_params import CROP_SIZE, RESIZE_SIZE
from dlrecipes.data.source_sizes import folder_side, hf_side
from dlrecipes.errors import RecipeError
from dlrecipes.registry import datasets

if TYPE_CHECKING:
    from dlrecipes.config.sections import TrainerConfig

DIGITS_SAMPLES = 1797  # the embedded scans (dlrecipes/data/digits.py), each upsampled to image_size when built


def _crop_side(params: dict) -> int:
    """``image_side=`` metadata: the side of the images a model sees (validation checks models' minimum)."""
    return min(params["crop_size"], params.get("eval_crop_size") or params["crop_size"])


def _folder_classes(path_key: str):
    """``classes=`` metadata of an image-folder dataset: its class folders, counted when the folder exists
    (one listing, no image read), else unknown."""

    def count(params: dict):
        from pathlib import Path

        root = Path(params[path_key]) if isinstance(params.get(path_key), str) else None
        if root is None or not root.is_dir():
            return None
        return sum(1 for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))

    return count


def _imagenet_classes(params: dict):
    if params.get("class_list"):
        from pathlib import Path

        listed = Path(params["class_list"])
        return len([c for c in listed.read_text().splitlines() if c.strip()]) if listed.is_file() else None
    return 100 if params.get("subset") == "imagenet100" else 1000


def _check_eval_sizes(params: dict, path: str) -> None:
    """Image folders: the evaluation centre crop must fit in the resized image."""
    crop = params.get("eval_crop_size") or params.get("crop_size", CROP_SIZE)
    resize = params.get("resize_size", RESIZE_SIZE)
    if crop > resize:
        which = "eval_crop_size" if params.get("eval_crop_size") else "crop_size"
        raise RecipeError(
            f"{path}.{which}: a {crop} px evaluation centre crop does not fit in images resized to "
            f"{path}.resize_size={resize} px (use a resize_size of at least {crop})"
        )


def _check_shards(params: dict, trainer: TrainerConfig) -> None:
    """validate's data check of a shards dataset: its address answers, its metadata and index are as a conversion
    writes them, and its cache limit holds the shards the recipe's loaders read at once (what training checks,
    without building anything)."""
    from dlrecipes.data.shards.dataset import check_cache_room, open_shards

    place, meta, limit = open_shards(params["remote"], params["cache_limit"])
    check_cache_room(place, meta, limit, trainer)


@datasets.register(
    "digits",
    in_memory=True,
    image_side=lambda p: p["image_size"],
    classes=lambda p: 10,
    channels=lambda p: 1,
    held_samples=lambda p: DIGITS_SAMPLES,
)
def digits(
    image_size: Size = 28, augment: DigitsAugment = True, eval_fraction: EvalFraction = 0.2, split_seed: SplitSeed = 0
):
    """Embedded handwritten digits (1,797 real 8x8 scans, upsampled; no download needed).

    Args:
        image_size: side in pixels the 8x8 scans are bilinearly upsampled to; 28 (the default) suits MNIST
            models, 8 keeps the scans as they are.
    """
    from dlrecipes.data.digits import build_digits

    return build_digits(image_size, augment, eval_fraction, split_seed)


@datasets.register(
    "mnist", in_memory=True, paths=("root",), image_side=lambda p: 28, classes=lambda p: 10, channels=lambda p: 1
)
def mnist(root: str = "data/mnist", download: bool = True, augment: bool = False):
    """MNIST handwritten digits, 28x28 (torchvision; downloads when online).

    Args:
        root: folder holding the MNIST files (under root/MNIST/raw), where they are downloaded to when missing.
        download: download the missing files into root; false: a missing file is an error naming it.
        augment: shift training images by up to 2 pixels at random (a random crop of the 2-pixel-padded image;
            never flipped); false: training images as they are.
    """
    from dlrecipes.data.torchvision_sets import build_mnist

    return build_mnist(root, download, augment)


@datasets.register(
    "cifar10",
    in_memory=True,
    paths=("root",),
    image_side=lambda p: p["image_size"],
    classes=lambda p: 10,
    channels=lambda p: 3,
)
def cifar10(
    root: str = "data/cifar10",
    download: CifarDownload = True,
    augment: CifarAugment = True,
    image_size: CifarSize = 32,
    crop_padding: CifarPadding = 4,
    padding_mode: CifarPaddingMode = "zeros",
    flip: CifarFlip = "random",
):
    """CIFAR-10, 32x32 colour, 10 classes; random crop (pad crop_padding, default 4) + flip when augment.

    image_size resizes the (augmented) images for networks built for larger inputs, on the GPU with
    trainer.loader=device.

    Args:
        root: folder holding the extracted CIFAR python batches (root/cifar-10-batches-py), where they are downloaded to
            when missing.
    """
    from dlrecipes.data.torchvision_sets import CIFAR10, build_cifar
    from dlrecipes.data.transforms import CIFAR10_MEAN, CIFAR10_STD

    return build_cifar(
        root, CIFAR10, download, augment, CIFAR10_MEAN, CIFAR10_STD, image_size, (crop_padding, padding_mode, flip)
    )


@datasets.register(
    "cifar100",
    in_memory=True,
    paths=("root",),
    image_side=lambda p: p["image_size"],
    classes=lambda p: 100,
    channels=lambda p: 3,
)
def cifar100(
    root: str = "data/cifar100",
    download: CifarDownload = True,
    augment: CifarAugment = True,
    image_size: CifarSize = 32,
    crop_padding: CifarPadding = 4,
    padding_mode: CifarPaddingMode = "zeros",
    flip: CifarFlip = "random",
):
    """CIFAR-100, 32x32 colour, 100 classes; random crop (pad crop_padding) + flip when augment; as cifar10.

    Args:
        root: folder holding the extracted CIFAR python batches (root/cifar-100-python), where they are downloaded to
            when missing.
    """
    from dlrecipes.data.torchvision_sets import CIFAR100, build_cifar
    from dlrecipes.data.transforms import CIFAR100_MEAN, CIFAR100_STD

    return build_cifar(
        root, CIFAR100, download, augment, CIFAR100_MEAN, CIFAR100_STD, image_size, (crop_padding, padding_mode, flip)
    )


# datasets read from image files, decoded and transformed as image folders are, their factories in .image_factories
datasets.add(
    "image_folder",
    image_folder,
    pil_images=True,
    paths=("train_path", "val_path"),
    image_side=_crop_side,
    validator=_check_eval_sizes,
    source_side=lambda p: folder_side(p.get("train_path")),
    classes=_folder_classes("train_path"),
    channels=lambda p: 3,
)
datasets.add(
    "imagenet",
    imagenet,
    pil_images=True,
    paths=("root", "class_list"),
    image_side=_crop_side,
    validator=_check_eval_sizes,
    classes=_imagenet_classes,
    source_side=lambda p: folder_side(f"{p.get('root')}/train"),
    channels=lambda p: 3,
)
datasets.add_variant(
    "imagenet100",
    of="imagenet",
    subset="imagenet100",
    description="ImageNet restricted to the 100 CMC synsets (shipped list, or your own class_list file).",
)
datasets.add(
    "hf",
    hf,
    pil_images=True,
    image_side=_crop_side,
    validator=_check_eval_sizes,
    source_side=hf_side,
    channels=lambda p: 3,
)
datasets.add(
    "ffcv",
    ffcv,
    paths=("train_path", "val_path"),
    image_side=_crop_side,
    made_by=(
        "dlrecipes data convert DATASET PARAMS --out FOLDER (docs/fast-data-loading.md), e.g. dlrecipes data convert "
        "imagenet100 root=data/imagenet --out data/imagenet100_ffcv"
    ),
    channels=lambda p: 3,
)
datasets.add(
    "shards",
    shards,
    image_side=_crop_side,
    validator=_check_eval_sizes,
    data_check=lambda params, path, trainer: _check_shards(params, trainer),
    made_by=(
        "dlrecipes data convert DATASET PARAMS --format shards --out DEST (docs/fast-data-loading.md), "
        "e.g. dlrecipes data "
        "convert image_folder train_path=data/pets/train val_path=data/pets/val --format shards --out s3://bucket/pets"
    ),
    channels=lambda p: 3,
)


@datasets.register(
    "synthetic",
    in_memory=True,
    image_side=lambda p: min(p["input_shape"][1:]),
    classes=lambda p: p["num_classes"],
    pixels=False,
    channels=lambda p: p["input_shape"][0],
    held_samples=lambda p: p["train_samples"] + p["eval_samples"],
)
def synthetic(
    num_classes: Classes = 10,
    input_shape: tuple[int, int, int] = (3, 32, 32),
    train_samples: AtLeastOne = 256,
    eval_samples: AtLeastOne = 64,
    seed: int = 0,
):
    """Random images and labels of a given shape (smoke tests and benchmarks).

    Args:
        num_classes: how many classes the labels are drawn from (uniformly at random).
        input_shape: shape of each image as (channels, height, width); pixels are standard normal noise.
        train_samples: number of training samples.
        eval_samples: number of evaluation samples.
        seed: seed of the random images and labels: the same seed, the same data.
    """
    from dlrecipes.data.synthetic import build_synthetic

    return build_synthetic(num_classes, tuple(input_shape), train_samples, eval_samples, seed)


# Multi-input / multi-output data (recipes with a task: section). `io=` declares what a sample
# holds from the factory's parameters (all of them, defaults filled), so recipes are checked
# against it without loading data.
def _digits_two_view_io(params: dict):
    from dlrecipes.data.task_data import digits_two_view_io

    return digits_two_view_io(params["image_size"])


@datasets.register("digits_two_view", io=_digits_two_view_io)
def digits_two_view(
    image_size: Size = 28, augment: DigitsAugment = True, eval_fraction: EvalFraction = 0.2, split_seed: SplitSeed = 0
):
    """Embedded digits cut into left and right halves (two inputs) -> digit and parity (two outputs).

    Args:
        image_size: side in pixels the 8x8 scans are bilinearly upsampled to before being cut into a left half
            (image_size // 2 columns) and a right half (the rest).
    """
    from dlrecipes.data.task_data import build_digits_two_view

    return build_digits_two_view(image_size, augment, eval_fraction, split_seed)


def _synthetic_multi_io_io(params: dict):
    from dlrecipes.data.task_data import synthetic_multi_io_io

    return synthetic_multi_io_io(
        list(params["inputs"]), tuple(params["input_shape"]), params["classes"], list(params["regression"])
    )


_SYNTHETIC_CLASSES = {"label": 4}


@datasets.register("synthetic_multi_io", io=_synthetic_multi_io_io)
def synthetic_multi_io(
    inputs: tuple[str, ...] = ("left", "right"),
    input_shape: tuple[int, int, int] = (1, 8, 8),
    classes: dict[str, int] = _SYNTHETIC_CLASSES,
    regression: tuple[str, ...] = (),
    train_samples: AtLeastOne = 512,
    eval_samples: AtLeastOne = 128,
    noise: float = 1.0,
    seed: int = 0,
):
    """Generated (inputs..., labels..., values...) with a learnable signal; class and regression outputs by name.

    Args:
        inputs: names of the inputs: each sample holds one tensor of input_shape per name.
        input_shape: shape of every input tensor, such as (channels, height, width).
        classes: the class outputs, as output name -> number of classes (at least 2); each label adds a fixed random
            pattern of its class to the inputs.
        regression: names of the regression outputs: each a value drawn in [-1, 1] that scales a fixed random pattern
            added to the inputs.
        train_samples: number of training samples.
        eval_samples: number of evaluation samples.
        noise: standard deviation of the Gaussian noise added to every input (the patterns have 1); larger is
            harder to learn, 0 is none.
        seed: seed of the patterns, labels, values and noise: the same seed, the same data.
    """
    from dlrecipes.data.task_data import build_synthetic_multi_io

    return build_synthetic_multi_io(
        list(inputs), tuple(input_shape), dict(classes), list(regression), train_samples, eval_samples, noise, seed
    )
