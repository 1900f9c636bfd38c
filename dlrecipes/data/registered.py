"""Datasets: the built-in dataset factories, registered in :data:`dlrecipes.registry.datasets`.

A dataset factory takes keyword parameters from the recipe and returns a
:class:`~dlrecipes.data.splits.DatasetSplits` (train and eval datasets yielding
``(image, label)``, the class count and the input shape).  The implementations (and
torch/torchvision) are imported inside each factory so that listing and validating recipes
stays fast.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import RecipeError
from dlrecipes.core.param_docs import Doc
from dlrecipes.core.ranges import AtLeastOne, Classes, Fraction, Range, Size
from dlrecipes.data.preprocess_params import (
    CROP_SIZE, EVAL_CROP_SIZE, HFLIP, IMAGENET_MEAN, IMAGENET_STD, MIN_SCALE, RESIZE_RATIO, RESIZE_SIZE, CropSize,
    EvalCropSize, Hflip, Mean, MinScale, ResizeRatio, ResizeSize, Std, shared_meanings,
)
from dlrecipes.data.source_sizes import folder_side, hf_side
from dlrecipes.registry import datasets

# Parameters two factories share (the CIFARs; the embedded digits' two layouts): each meaning written once, on its
# type (dlrecipes.core.param_docs), as the image-preprocessing ones are in preprocess_params.
CifarDownload = Annotated[bool, Doc("download and extract the archive into root when files are missing; false: a "
                                    "missing file is an error naming it.")]
CifarAugment = Annotated[bool, Doc("random 32x32 crops of the padded training images (crop_padding, padding_mode) "
                                   "and left-right flips (flip); false: training images as they are.")]
CifarSize = Annotated[int, Range(8, 8192), Doc("side in pixels the 32x32 images are bilinearly resized to (after augmentation) for "
                                "networks built for larger inputs, at least 8; 32 (the default) leaves them as they "
                                "are.")]
CifarPadding = Annotated[int, Range(0, 16), Doc("pixels each side of a training image is padded by before the random "
                                                "32x32 crop when augment is on (airbench94: 2, airbench96: 4).")]
CifarPaddingMode = Annotated[Literal["zeros", "reflect"], Doc("what the crop's padding holds: 'zeros' (black) or "
                                                              "'reflect' (the image mirrored at its edge, airbench's).")]
CifarFlip = Annotated[Literal["random", "alternate"], Doc(
    "left-right flips when augment is on: 'random' flips each image with probability 1/2 every epoch; 'alternate' "
    "flips a seeded half of the images on even epochs and the other half on odd ones (airbench's; "
    "trainer.loader torch or device, the same images flipped in the same epochs for the same trainer.seed).")]
DigitsAugment = Annotated[bool, Doc("random affine on training images (up to 10 degrees of rotation, 10% shift, "
                                    "0.9-1.1 scale; a 2-pixel random shift with trainer.loader=device); false: training "
                                    "images as they are.")]
EvalFraction = Annotated[Fraction, Doc("share of each class's images held out for evaluation (a stratified split), in "
                                       "(0, 1).")]
SplitSeed = Annotated[int, Doc("seed of the random train/eval split: the same seed, the same split.")]
Decode = Annotated[Literal["turbo", "device", "pil"], Doc(
    "how image files are decoded: turbo: by libjpeg-turbo through torchvision.io into tensors, a JPEG at 1/4 or 1/8 "
    "of its size where the crop box is that many times the crop or more (the same crops as pil within a "
    "small tolerance, faster); device: the loader's workers only read the files and draw the crops, and each batch "
    "is decoded on the training device (nvJPEG on a GPU), cropped, flipped and normalised there (trainer.loader "
    "torch); pil: by PIL, as torchvision's ImageFolder does. A run with Composer's randaugment or augmix (steps on "
    "PIL images) decodes with PIL.")]


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


@datasets.register("digits", in_memory=True, image_side=lambda p: p["image_size"], classes=lambda p: 10,
                   channels=lambda p: 1, held_samples=lambda p: DIGITS_SAMPLES)
def digits(image_size: Size = 28, augment: DigitsAugment = True, eval_fraction: EvalFraction = 0.2,
           split_seed: SplitSeed = 0):
    """Embedded handwritten digits (1,797 real 8x8 scans, upsampled; no download needed).

    Args:
        image_size: side in pixels the 8x8 scans are bilinearly upsampled to; 28 (the default) suits MNIST
            models, 8 keeps the scans as they are.
    """
    from dlrecipes.data.digits import build_digits

    return build_digits(image_size, augment, eval_fraction, split_seed)


@datasets.register("mnist", in_memory=True, paths=("root",), image_side=lambda p: 28, classes=lambda p: 10,
                   channels=lambda p: 1)
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


@datasets.register("cifar10", in_memory=True, paths=("root",), image_side=lambda p: p["image_size"],
                   classes=lambda p: 10, channels=lambda p: 3)
def cifar10(root: str = "data/cifar10", download: CifarDownload = True, augment: CifarAugment = True,
            image_size: CifarSize = 32, crop_padding: CifarPadding = 4, padding_mode: CifarPaddingMode = "zeros",
            flip: CifarFlip = "random"):
    """CIFAR-10, 32x32 colour, 10 classes; random crop (pad crop_padding, default 4) + flip when augment.

    image_size resizes the (augmented) images for networks built for larger inputs, on the GPU with
    trainer.loader=device.

    Args:
        root: folder holding the extracted CIFAR python batches (root/cifar-10-batches-py), where they are downloaded to
            when missing.
    """
    from dlrecipes.data.torchvision_sets import CIFAR10, build_cifar
    from dlrecipes.data.transforms import CIFAR10_MEAN, CIFAR10_STD

    return build_cifar(root, CIFAR10, download, augment, CIFAR10_MEAN, CIFAR10_STD, image_size,
                       (crop_padding, padding_mode, flip))


@datasets.register("cifar100", in_memory=True, paths=("root",), image_side=lambda p: p["image_size"],
                   classes=lambda p: 100, channels=lambda p: 3)
def cifar100(root: str = "data/cifar100", download: CifarDownload = True, augment: CifarAugment = True,
             image_size: CifarSize = 32, crop_padding: CifarPadding = 4, padding_mode: CifarPaddingMode = "zeros",
             flip: CifarFlip = "random"):
    """CIFAR-100, 32x32 colour, 100 classes; random crop (pad crop_padding) + flip when augment; as cifar10.

    Args:
        root: folder holding the extracted CIFAR python batches (root/cifar-100-python), where they are downloaded to
            when missing.
    """
    from dlrecipes.data.torchvision_sets import CIFAR100, build_cifar
    from dlrecipes.data.transforms import CIFAR100_MEAN, CIFAR100_STD

    return build_cifar(root, CIFAR100, download, augment, CIFAR100_MEAN, CIFAR100_STD, image_size,
                       (crop_padding, padding_mode, flip))


@datasets.register(
    "image_folder", pil_images=True, paths=("train_path", "val_path"), image_side=_crop_side, validator=_check_eval_sizes,
    source_side=lambda p: folder_side(p.get("train_path")),
    classes=_folder_classes("train_path"), channels=lambda p: 3,
)
@shared_meanings
def image_folder(
    train_path: str,
    val_path: str,
    crop_size: CropSize = CROP_SIZE,
    resize_size: ResizeSize = RESIZE_SIZE,
    eval_crop_size: EvalCropSize = EVAL_CROP_SIZE,
    min_scale: MinScale = MIN_SCALE,
    hflip: Hflip = HFLIP,
    mean: Mean = IMAGENET_MEAN,
    std: Std = IMAGENET_STD,
    bad_images: Literal["fail", "skip"] = "fail",
    decode: Decode = "turbo",
):
    """Any folders of <class>/<image> for train and val.

    Training takes random-resized crops of crop_size + flip; evaluation resizes the shorter side to
    resize_size and center-crops eval_crop_size (default: crop_size).

    Args:
        train_path: folder of training images, one subfolder per class (<class>/<image>); the subfolders' names
            are the class names.
        val_path: folder of evaluation images laid out as train_path, with the same class subfolders.
        bad_images: what an unreadable (corrupt, truncated, empty) image does: fail stops with an error naming it;
            skip replaces it by the next readable image and warns with its path.
    """
    from dlrecipes.data.image_folder import build_image_folders

    return build_image_folders(
        train_path, val_path, crop_size, resize_size, min_scale, hflip, mean, std, bad_images=bad_images,
        eval_crop_size=eval_crop_size, decode=decode,
    )


@datasets.register(
    "imagenet", pil_images=True, paths=("root", "class_list"), image_side=_crop_side, validator=_check_eval_sizes,
    classes=_imagenet_classes, source_side=lambda p: folder_side(f"{p.get('root')}/train"), channels=lambda p: 3,
)
@shared_meanings
def imagenet(
    root: str = "data/imagenet",
    crop_size: CropSize = CROP_SIZE,
    resize_size: ResizeSize = RESIZE_SIZE,
    eval_crop_size: EvalCropSize = EVAL_CROP_SIZE,
    min_scale: MinScale = MIN_SCALE,
    hflip: Hflip = HFLIP,
    subset: Literal["all", "imagenet100"] = "all",
    class_list: Optional[str] = None,
    bad_images: Literal["fail", "skip"] = "fail",
    decode: Decode = "turbo",
):
    """ImageNet-1k laid out as root/train/<synset>/ and root/val/<synset>/ (sizes as image_folder).

    subset imagenet100 keeps the 100 CMC synsets (a shipped list), class_list a file of synsets of your own.

    Normalised with ImageNet's mean and standard deviation.

    Args:
        root: the ImageNet folder, holding train/<synset>/ and val/<synset>/ image folders.
        subset: which classes are kept: all (every synset folder under root/train, 1,000 in ImageNet-1k) or
            imagenet100 (the 100 CMC synsets, a list shipped with dlrecipes).
        class_list: a text file of synsets, one a line, the only classes kept (it overrides subset); null: as
            subset says.
        bad_images: what an unreadable (corrupt, truncated, empty) image does: fail stops with an error naming it;
            skip replaces it by the next readable image and warns with its path.
    """
    from pathlib import Path

    from dlrecipes.data.image_folder import build_image_folders, imagenet100_classes
    from dlrecipes.errors import DataError

    classes = imagenet100_classes() if subset == "imagenet100" else None
    if class_list is not None:
        try:
            classes = [c.strip() for c in Path(class_list).read_text().splitlines() if c.strip()]
        except OSError as exc:
            raise DataError(f"dataset.class_list: cannot read {class_list}: {exc.strerror}") from None
    return build_image_folders(
        f"{root}/train", f"{root}/val", crop_size, resize_size, min_scale, hflip, IMAGENET_MEAN, IMAGENET_STD,
        only_classes=classes, bad_images=bad_images, eval_crop_size=eval_crop_size, decode=decode,
    )


datasets.add_variant(
    "imagenet100", of="imagenet", subset="imagenet100",
    description="ImageNet restricted to the 100 CMC synsets (shipped list, or your own class_list file).",
)


@datasets.register("hf", pil_images=True, image_side=_crop_side, validator=_check_eval_sizes, source_side=hf_side,
                   channels=lambda p: 3)
@shared_meanings
def hf(
    path: str,
    split: str = "train",
    eval_split: Optional[str] = None,
    image_column: str = "image",
    label_column: str = "label",
    config: Optional[str] = None,
    crop_size: CropSize = CROP_SIZE,
    resize_size: ResizeSize = RESIZE_SIZE,
    eval_crop_size: EvalCropSize = EVAL_CROP_SIZE,
    min_scale: MinScale = MIN_SCALE,
    hflip: Hflip = HFLIP,
    mean: Mean = IMAGENET_MEAN,
    std: Std = IMAGENET_STD,
):
    """A Hugging Face dataset: a hub id, or a folder from save_to_disk or of Parquet files (the hf extra).

    eval_split defaults to validation, else test; class names from the label column's ClassLabel; sizes as
    image_folder.

    Args:
        path: a hub id (such as ylecun/mnist), a folder written by save_to_disk, or a folder of data files such as
            Parquet.
        split: name of the split training reads.
        eval_split: name of the split evaluation reads; null: validation if the dataset has one, else test.
        image_column: name of the column holding the images.
        label_column: name of the column holding the integer class labels (a ClassLabel column also names the
            classes).
        config: name of the dataset's configuration (subset) to load, as datasets.load_dataset takes it; null:
            its default one.
    """
    from dlrecipes.data.hf_dataset import build_hf_dataset

    return build_hf_dataset(
        path, split, eval_split, image_column, label_column, config, crop_size, resize_size, eval_crop_size,
        min_scale, hflip, mean, std,
    )


@datasets.register("ffcv", paths=("train_path", "val_path"), image_side=_crop_side, made_by=(
    "dlrecipes data convert DATASET PARAMS --out FOLDER (docs/fast-data-loading.md), e.g. dlrecipes data convert "
    "imagenet100 root=data/imagenet --out data/imagenet100_ffcv"), channels=lambda p: 3)
@shared_meanings
def ffcv(
    train_path: str,
    val_path: str,
    crop_size: CropSize = CROP_SIZE,
    eval_crop_size: EvalCropSize = EVAL_CROP_SIZE,
    resize_ratio: ResizeRatio = RESIZE_RATIO,
    min_scale: MinScale = MIN_SCALE,
    hflip: Hflip = HFLIP,
    mean: Mean = IMAGENET_MEAN,
    std: Std = IMAGENET_STD,
    os_cache: bool = True,
    batches_ahead: int = 3,
):
    """FFCV .beton files (from `dlrecipes data convert`): crops decoded at size; needs the ffcv extra.

    Args:
        train_path: the .beton file of the training split (written by dlrecipes data convert).
        val_path: the .beton file of the evaluation split, with the same classes.
        os_cache: true: read the files through the operating system's page cache (fastest when they fit in
            memory, shared by every process); false: FFCV's own per-process cache, for files larger than memory.
        batches_ahead: how many batches FFCV's loader decodes ahead of the one training uses (more hides decoding
            stalls, at the cost of memory).
    """
    from dlrecipes.data.ffcv_files import beton_class_names, beton_num_classes
    from dlrecipes.data.ffcv_loader import FFCVSource
    from dlrecipes.data.preprocess import preprocess_spec

    def source(path: str, train: bool, size: int) -> FFCVSource:
        return FFCVSource(path, train, size, resize_ratio, min_scale, hflip, tuple(mean), tuple(std), os_cache, batches_ahead)

    num_classes = beton_num_classes(train_path)
    beton_num_classes(val_path)  # fail now, naming the file, if it is missing or damaged
    return DatasetSplits(
        train=source(train_path, True, crop_size),
        eval=source(val_path, False, eval_crop_size or crop_size),
        num_classes=num_classes,
        input_shape=(3, crop_size, crop_size),
        class_names=beton_class_names(train_path),
        # FFCV's centre-crop decoder: a centred square of resize_ratio of the shorter side, resized to the crop
        preprocess=preprocess_spec("RGB", mean, std, shorter_side=round((eval_crop_size or crop_size) / resize_ratio),
                                   center_crop=(eval_crop_size or crop_size,) * 2),
    )


@datasets.register("shards", image_side=_crop_side, validator=_check_eval_sizes, made_by=(
    "dlrecipes data convert DATASET PARAMS --format shards --out DEST (docs/fast-data-loading.md), e.g. dlrecipes data "
    "convert image_folder train_path=data/pets/train val_path=data/pets/val --format shards --out s3://bucket/pets"),
    channels=lambda p: 3)
@shared_meanings
def shards(
    remote: str,
    cache_dir: Optional[str] = None,
    cache_limit: Union[int, str] = "100GB",
    crop_size: CropSize = CROP_SIZE,
    resize_size: ResizeSize = RESIZE_SIZE,
    eval_crop_size: EvalCropSize = EVAL_CROP_SIZE,
    min_scale: MinScale = MIN_SCALE,
    hflip: Hflip = HFLIP,
    mean: Mean = IMAGENET_MEAN,
    std: Std = IMAGENET_STD,
    decode: Decode = "turbo",
):
    """Dataset shards (litdata) from a bucket or a local folder, streamed through a local cache; the shards extra.

    Written by `dlrecipes data convert SOURCE --format shards --out DEST`; images decoded and transformed as
    image_folder's (sizes as image_folder). Credentials and endpoint as runs_dir takes them (S3_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE).

    Args:
        remote: where the shards are: s3://BUCKET/PREFIX (gs:// and azure:// through litdata's clients, untested) or a
            local folder, as data convert --out wrote it.
        cache_dir: local folder the shards of a bucket are cached in while training reads them (one subfolder per
            split); null: ~/.cache/dlrecipes/shards/BUCKET/PREFIX. A local remote is read where it is.
        cache_limit: bytes each split's cache is kept near, as bytes or with a unit (10GB, 512MiB); older shards are
            evicted beyond it (it may pass it by up to a shard); at least one shard (a few shards' worth streams
            better).
    """
    from dlrecipes.data.shards import build_shards

    return build_shards(remote, cache_dir, cache_limit, crop_size, resize_size, eval_crop_size, min_scale, hflip,
                        mean, std, decode)


@datasets.register("synthetic", in_memory=True, image_side=lambda p: min(p["input_shape"][1:]),
                   classes=lambda p: p["num_classes"], pixels=False, channels=lambda p: p["input_shape"][0],
                   held_samples=lambda p: p["train_samples"] + p["eval_samples"])
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
def digits_two_view(image_size: Size = 28, augment: DigitsAugment = True, eval_fraction: EvalFraction = 0.2,
                    split_seed: SplitSeed = 0):
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

