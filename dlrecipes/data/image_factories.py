"""Factories of the datasets read from image files (image folders, ImageNet, a Hugging Face dataset, FFCV .beton
files, shards), which :mod:`.registered` adds by name with what is known of each: they share the image-preprocessing
keys of :mod:`.preprocess_params` (each factory's meanings of hflip, mean and std added by :func:`shared_meanings`).
Light, as validation imports them: each implementation (and torch) loads when a recipe uses it."""

from __future__ import annotations

from typing import Literal

from dlrecipes.data.dataset_params import Decode
from dlrecipes.data.preprocess_params import (
    CROP_SIZE,
    EVAL_CROP_SIZE,
    HFLIP,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MIN_SCALE,
    RESIZE_RATIO,
    RESIZE_SIZE,
    CropSize,
    EvalCropSize,
    Hflip,
    Mean,
    MinScale,
    ResizeRatio,
    ResizeSize,
    Std,
    shared_meanings,
)
from dlrecipes.data.splits import DatasetSplits


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
        train_path,
        val_path,
        crop_size,
        resize_size,
        min_scale,
        hflip,
        mean,
        std,
        bad_images=bad_images,
        eval_crop_size=eval_crop_size,
        decode=decode,
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
    class_list: str | None = None,
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
        f"{root}/train",
        f"{root}/val",
        crop_size,
        resize_size,
        min_scale,
        hflip,
        IMAGENET_MEAN,
        IMAGENET_STD,
        only_classes=classes,
        bad_images=bad_images,
        eval_crop_size=eval_crop_size,
        decode=decode,
    )


@shared_meanings
def hf(
    path: str,
    split: str = "train",
    eval_split: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    config: str | None = None,
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
        path,
        split,
        eval_split,
        image_column,
        label_column,
        config,
        crop_size,
        resize_size,
        eval_crop_size,
        min_scale,
        hflip,
        mean,
        std,
    )


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
    from dlrecipes.data.ffcv.files import beton_class_names, beton_num_classes
    from dlrecipes.data.ffcv.loader import FFCVSource
    from dlrecipes.data.preprocess import preprocess_spec

    def source(path: str, train: bool, size: int) -> FFCVSource:
        return FFCVSource(
            path, train, size, resize_ratio, min_scale, hflip, tuple(mean), tuple(std), os_cache, batches_ahead
        )

    num_classes = beton_num_classes(train_path)
    beton_num_classes(val_path)  # fail now, naming the file, if it is missing or damaged
    return DatasetSplits(
        train=source(train_path, True, crop_size),
        eval=source(val_path, False, eval_crop_size or crop_size),
        num_classes=num_classes,
        input_shape=(3, crop_size, crop_size),
        class_names=beton_class_names(train_path),
        # FFCV's centre-crop decoder: a centred square of resize_ratio of the shorter side, resized to the crop
        preprocess=preprocess_spec(
            "RGB",
            mean,
            std,
            shorter_side=round((eval_crop_size or crop_size) / resize_ratio),
            center_crop=(eval_crop_size or crop_size,) * 2,
        ),
    )


@shared_meanings
def shards(
    remote: str,
    cache_dir: str | None = None,
    cache_limit: int | str = "100GB",
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
        remote: where the shards are: s3://BUCKET/PREFIX (gs:// and azure:// through Composer's stores, untested) or a
            local folder, as data convert --out wrote it.
        cache_dir: local folder the shards of a bucket are cached in while training reads them (one subfolder per
            split); null: ~/.cache/dlrecipes/shards/BUCKET/PREFIX. A local remote is read where it is.
        cache_limit: bytes each split's cache on a node holds (plus at most the shard coming in), as bytes or with a
            unit (10GB, 512MiB); the least recently used shards not being read are evicted beyond it. A limit that
            cannot hold the shards the loaders read at once is refused before training, with the least that can.
    """
    from dlrecipes.data.shards.dataset import build_shards

    return build_shards(
        remote, cache_dir, cache_limit, crop_size, resize_size, eval_crop_size, min_scale, hflip, mean, std, decode
    )
