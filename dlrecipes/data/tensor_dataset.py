"""A dataset over in-memory uint8 images with a per-sample transform."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.utils.data import Dataset

from dlrecipes.data.device_loader import BatchAugment


class TransformedTensorDataset(Dataset):
    """``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64, transformed on access.

    ``batch_augment`` describes the same augmentation for whole batches, used when the
    recipe asks for ``trainer.loader: device``.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: Optional[Callable] = None,
        batch_augment: Optional[BatchAugment] = None,
    ):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.transform = transform
        self.batch_augment = batch_augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])
