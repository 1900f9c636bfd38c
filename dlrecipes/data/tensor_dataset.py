"""The one dataset over in-memory images: uint8 images and labels, a per-sample transform, and what a
sample is made of (an (image, label) pair, or several views and targets of one image)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.data import Dataset

from dlrecipes.data.device_loader import BatchAugment


class TransformedTensorDataset(Dataset):
    """``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64, transformed on access.

    ``batch_augment`` describes the same augmentation for whole batches, used when the
    recipe asks for ``trainer.loader: device``.  ``sample`` makes a sample of the transformed
    image and its label (default: the pair; e.g. two halves of the image, its class and parity).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: Optional[Callable] = None,
        batch_augment: Optional[BatchAugment] = None,
        sample: Optional[Callable[[Any, int], tuple]] = None,
    ):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.transform = transform
        self.batch_augment = batch_augment
        self.sample = sample

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        label = int(self.labels[index])
        return (image, label) if self.sample is None else self.sample(image, label)
