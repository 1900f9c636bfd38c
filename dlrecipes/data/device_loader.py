"""Batches straight from uint8 tensors kept on the training device.

For datasets that fit in device memory (digits, MNIST, CIFAR), the per-sample Python
transform path costs more than the network does.  :class:`DeviceTensorLoader` keeps the
whole uint8 dataset on the device and does random crop, flip and normalisation on whole
batches there, the approach of the CIFAR-10 speed-record scripts.  Order is a seeded
permutation per epoch; with several processes each rank takes its own shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class BatchAugment:
    """The train-time augmentation, in batched form: pad-and-crop and horizontal flip; then a
    resize to ``size`` (train and eval: the images a model built for larger inputs sees)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_padding: int = 0
    hflip: bool = False
    size: int | None = None
    padding_mode: str = "zeros"  # or "reflect"
    alternate_flip: bool = False  # hflip on alternate epochs: a seeded half of the images on even ones, the rest on odd


def random_crop(
    images: torch.Tensor, padding: int, generator: torch.Generator | None, mode: str = "zeros"
) -> torch.Tensor:
    """Each image cropped back to its size at its own random offset after zero-padding.

    The offsets are drawn on the images' device (``generator`` lives there), so nothing waits
    for a copy from the host.
    """
    if padding <= 0:
        return images
    b, c, h, w = images.shape
    if mode == "reflect":
        padded = F.pad(images.float(), (padding, padding, padding, padding), mode="reflect")
    else:
        padded = F.pad(images, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (2, b), generator=generator, device=images.device)
    rows = (offsets[0, :, None] + torch.arange(h, device=images.device))[:, None, :, None]
    cols = (offsets[1, :, None] + torch.arange(w, device=images.device))[:, None, None, :]
    batch = torch.arange(b, device=images.device)[:, None, None, None]
    channel = torch.arange(c, device=images.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


def random_hflip(images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    flip = torch.rand(images.shape[0], generator=generator, device=images.device) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(3), images)


@lru_cache(maxsize=2)
def flipped_on_even_epochs(count: int, seed: int) -> torch.Tensor:
    """Alternating flips: which of ``count`` images are flipped on even epochs (the others on odd ones), a seeded
    half drawn from the run's ``seed`` alone; every loader asks this (the same flips from the device loader and the
    torch loader). Read it, never change it (it is kept for the next caller)."""
    return torch.rand(count, generator=torch.Generator().manual_seed(seed + 7_919)) < 0.5


def device_generator(device: torch.device, seed: int) -> torch.Generator | None:
    """A generator on ``device`` seeded with ``seed`` (None on the meta device, which has none)."""
    if device.type == "meta":
        return None
    return torch.Generator(device=device).manual_seed(seed)


class DeviceTensorLoader:
    """Iterate ``(float images, labels)`` batches from uint8 ``images`` on ``device``."""

    fixed_batches = True  # batch i holds min(batch_size, num_samples - i * batch_size) samples (the engine)

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        augment: BatchAugment | None,
        train: bool,
        device: torch.device | str = "cpu",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.device = torch.device(device)
        self.images = images.to(self.device)
        self.labels = labels.to(self.device)
        self.batch_size = batch_size
        self.augment = augment
        self.train = train
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.flipped_first = None
        if augment is not None and augment.alternate_flip:  # which images are flipped on even epochs
            self.flipped_first = flipped_on_even_epochs(len(self.labels), seed).to(self.device)
        if augment is not None:
            shape = (1, len(augment.mean), 1, 1)
            self.mean = torch.tensor(augment.mean, device=self.device).view(shape)
            self.std = torch.tensor(augment.std, device=self.device).view(shape)

    def _indices(self) -> torch.Tensor:
        """This rank's sample order for the current epoch, on the host (the same on every rank)."""
        n = len(self.labels)
        if self.train:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
            order = order[: n - n % self.world_size]  # equal shards, so every rank takes the same steps
        else:
            order = torch.arange(n)  # evaluation: every sample once across ranks, none repeated
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        n = len(self._indices())
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch (what Composer counts)."""
        return len(self) * self.batch_size if self.train else len(self._indices())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # one copy of the epoch's order to the device, from pinned memory without waiting
        indices = self._indices()
        if self.device.type == "cuda":
            indices = indices.pin_memory().to(self.device, non_blocking=True)
        else:
            indices = indices.to(self.device)
        generator = device_generator(self.device, 10_007 * (self.seed + 1) + self.epoch)
        odd = self.epoch % 2 == 1
        self.epoch += 1
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            idx = indices[start : start + self.batch_size]
            yield self._prepare(self.images[idx], generator, self._flips(idx, odd)), self.labels[idx]

    def _flips(self, idx: torch.Tensor, odd: bool) -> torch.Tensor | None:
        """Alternating flips: which of these images are flipped this epoch (None: random flips or none)."""
        if self.flipped_first is None or not self.train:
            return None
        return self.flipped_first[idx] != odd

    def leading_images(self, count: int) -> torch.Tensor:
        """The first ``count`` images of the dataset, normalised and not augmented (patch whitening's)."""
        images = self.images[:count].float()
        if self.augment is None:
            return images
        return (images / 255.0 - self.mean) / self.std

    def _prepare(
        self, images: torch.Tensor, generator: torch.Generator | None, flips: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.augment is None:
            return images.float()
        if self.train:
            images = random_crop(images, self.augment.crop_padding, generator, self.augment.padding_mode)
            if flips is not None:
                images = torch.where(flips[:, None, None, None], images.flip(3), images)
            elif self.augment.hflip:
                images = random_hflip(images, generator)
        images = images.float()
        if self.augment.size is not None and images.shape[-1] != self.augment.size:
            images = F.interpolate(images, size=(self.augment.size,) * 2, mode="bilinear", align_corners=False)
        return (images / 255.0 - self.mean) / self.std
