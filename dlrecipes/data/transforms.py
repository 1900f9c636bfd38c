"""Standard train/eval transforms and normalisation constants, per kind of data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)


def small_image_transforms(
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    crop_padding: int,
    hflip: bool,
    train: bool,
    resize: int | None = None,
    padding_mode: str = "zeros",
    alternate_flip: bool = False,
):
    """For uint8 CHW tensors (CIFAR, MNIST): random crop with padding ('zeros' or 'reflect') and flip, then
    normalise (with ``resize``: bilinearly resized first, as the on-device loader does).  ``alternate_flip``: no
    flip here (flipped by epoch: by the device loader, or by the dataset in the torch loader's order)."""
    import torch
    from torchvision.transforms import v2

    steps = []
    if train and crop_padding > 0:
        mode = "constant" if padding_mode == "zeros" else padding_mode
        steps.append(v2.RandomCrop(size, padding=crop_padding, padding_mode=mode))
    if train and hflip and not alternate_flip:
        steps.append(v2.RandomHorizontalFlip())
    steps.append(v2.ToDtype(torch.float32, scale=True))
    if resize is not None and resize != size:
        steps.append(v2.Resize((resize, resize), antialias=False))
    steps.append(v2.Normalize(list(mean), list(std)))
    return v2.Compose(steps)


def imagenet_transforms(
    crop_size: int,
    resize_size: int,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
    train: bool,
):
    """For PIL images: random-resized-crop + flip (train) or resize + center-crop (eval).

    A classic ``transforms.Compose`` with ``ToTensor``: Composer's RandAugment and AugMix
    insert their PIL-image transform just before that ``ToTensor``.
    """
    from torchvision import transforms

    if train:
        steps = [transforms.RandomResizedCrop(crop_size, scale=(min_scale, 1.0), antialias=True)]
        if hflip:
            steps.append(transforms.RandomHorizontalFlip())
    else:
        steps = [transforms.Resize(resize_size, antialias=True), transforms.CenterCrop(crop_size)]
    steps += [transforms.ToTensor(), transforms.Normalize(list(mean), list(std))]
    return transforms.Compose(steps)


def crop_settings(
    crop_size: int,
    eval_crop_size: int,
    resize_size: int,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> dict[str, Any]:
    """:func:`imagenet_transforms`' settings of a dataset of image files, as its ``DatasetSplits.augment`` records
    them (the tensor cache decodes with them, ``data convert`` reads its resize)."""
    return {
        "crop_size": crop_size,
        "eval_crop_size": eval_crop_size,
        "resize_size": resize_size,
        "min_scale": min_scale,
        "hflip": hflip,
        "mean": tuple(mean),
        "std": tuple(std),
    }
