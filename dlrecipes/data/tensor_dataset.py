"""The one dataset over in-memory images: uint8 images and labels, a per-sample transform, and what a
sample is made of (an (image, label) pair, or several views and targets of one image)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from dlrecipes.data.device_loader import BatchAugment, flipped_on_even_epochs


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
        transform: Callable | None = None,
        batch_augment: BatchAugment | None = None,
        sample: Callable[[Any, int], tuple] | None = None,
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
        return self._sample(self.images[index], index)

    def sample_in_epoch(self, index: int, epoch: int, seed: int):
        """Sample ``index`` as epoch ``epoch`` of a run seeded ``seed`` trains it (the torch loader's training
        order, :mod:`dlrecipes.data.order`): with alternating flips (``batch_augment.alternate_flip``) the image is
        mirrored before its transform where the device loader would mirror it, its seeded half on even epochs and
        the other half on odd ones (:func:`~dlrecipes.data.device_loader.flipped_on_even_epochs`)."""
        image = self.images[index]
        if self.batch_augment is not None and self.batch_augment.alternate_flip:
            if bool(flipped_on_even_epochs(len(self), seed)[index]) != (epoch % 2 == 1):
                image = image.flip(-1)
        return self._sample(image, index)

    def _sample(self, image: torch.Tensor, index: int):
        if self.transform is not None:
            image = self.transform(image)
        label = int(self.labels[index])
        return (image, label) if self.sample is None else self.sample(image, label)
