"""``dataset.decode: device``: JPEGs decoded in batches on the training device (nvJPEG on a GPU).

The DataLoader workers only read each file's bytes and draw its crop (:class:`DecodeLater`: the random-resized crop's
box and the flip as :class:`~dlrecipes.data.jpeg.TurboTrain` draws them, under the sample's own seed; for evaluation the
centre box that resizing the shorter side to ``resize_size`` and cropping ``size`` would keep). The training process
decodes the whole batch at once on the device (``torchvision.io.decode_jpeg(list, device=...)``: nvJPEG on a GPU,
libjpeg-turbo on the CPU, where this path runs as well and is tested), then crops each box to ``size`` with its area's
mean (``roi_align``), flips and normalises there (:class:`DecodeOnDevice`, a Composer ``DataSpec`` batch transform).
Progressive resizing sets that size (:class:`EncodedLoader`'s ``set_resolution``, as for FFCV), so each box is cropped
once at the scheduled size. A file that is not a JPEG is decoded in the worker and crosses as pixels.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from dlrecipes.data.jpeg import (
    RATIO,
    TurboEval,
    TurboTrain,
    damaged_in_shard,
    decode,
    ends_whole,
    header_size,
    resized_box,
    unreadable,
)
from dlrecipes.errors import DataError

if TYPE_CHECKING:
    from composer.core import Batch


class DecodeLater:
    """Worker side: an image file's bytes and its crop, for :class:`DecodeOnDevice`."""

    def __init__(self, train: bool, size: int, min_scale: float, hflip: bool, resize_size: int):
        self.train, self.size, self.scale, self.hflip, self.resize_size = (
            train,
            size,
            (min_scale, 1.0),
            hflip,
            resize_size,
        )

    def box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """(top, left, height, width) in the full image's pixels: training's random box; evaluation's the region
        torchvision's Resize(resize_size) then CenterCrop(size) keep (its rounding included)."""
        from torchvision.transforms import RandomResizedCrop

        if self.train:
            return RandomResizedCrop.get_params(torch.empty(0, height, width), list(self.scale), list(RATIO))
        short, long = sorted((height, width))
        resized = (self.resize_size, int(self.resize_size * long / short))  # Resize's own rounding
        rh, rw = resized if height <= width else resized[::-1]
        top, left = int(round((rh - self.size) / 2.0)), int(round((rw - self.size) / 2.0))
        fy, fx = height / rh, width / rw
        return top * fy, left * fx, self.size * fy, self.size * fx

    def __call__(self, data: bytes) -> dict[str, Any]:
        width, height, jpeg = header_size(data)
        top, left, h, w = self.box(width, height)
        flip = bool(self.train and self.hflip and torch.rand(1) < 0.5)
        # plain numbers: reading a tensor's back in the training process would be a read-back per sample there
        sample = {"box": (float(top), float(left), float(h), float(w)), "size": (int(height), int(width)), "flip": flip}
        if jpeg and ends_whole(data):
            sample["jpeg"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:  # not a JPEG, or a truncated one: decoded here, where a file that cannot be read is skipped or named
            sample["pixels"] = decode(data)
        return sample


def split_decoder(
    decode: str,
    train: bool,
    size: int,
    resize_size: int,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> DecodeLater | TurboTrain | TurboEval | None:
    """A split's transform of an image file's bytes for ``dataset.decode`` (image folders and shards alike):
    ``device``: :class:`DecodeLater` (the batch decoded on the device); ``turbo``: libjpeg-turbo's
    (:class:`~dlrecipes.data.jpeg.TurboTrain`, :class:`~dlrecipes.data.jpeg.TurboEval`); ``pil``: None."""
    if decode == "device":
        return DecodeLater(train, size, min_scale, hflip, resize_size)
    if decode == "turbo":
        return TurboTrain(size, min_scale, hflip, mean, std) if train else TurboEval(size, resize_size, mean, std)
    return None


class EncodedLoader(DataLoader):
    """The training DataLoader of :class:`DecodeLater` samples: progressive resizing sets the crop size its
    ``decoder`` (:class:`DecodeOnDevice`) crops each batch to (``set_resolution``, as FFCV's loader has), so a batch
    is cropped once at the scheduled size, never cropped large only to be shrunk."""

    decoder: DecodeOnDevice

    @property
    def full_resolution(self) -> int:
        """The crop size the recipe asks for (progressive resizing grows to it)."""
        return self.decoder.full_size

    def set_resolution(self, size: int) -> None:
        """Crop the next batches to ``size`` (the crop boxes, drawn in the workers, do not depend on it)."""
        self.decoder.size = int(size)


def collate_encoded(samples: Sequence[tuple[Any, int]]):
    """A batch of :class:`DecodeLater` samples as (their list, labels); decoded samples (a run that fell back to
    PIL) as the default collation does."""
    from torch.utils.data import default_collate

    if not samples or not isinstance(samples[0][0], dict):
        return default_collate(samples)
    return [image for image, _ in samples], torch.tensor([label for _, label in samples])


class DecodeOnDevice:
    """Training-process side: a batch of :class:`DecodeLater` samples decoded, cropped to ``size``, flipped and
    normalised on ``device``; any other batch (already decoded) as it is."""

    def __init__(
        self,
        device: torch.device,
        size: int,
        mean: Sequence[float],
        std: Sequence[float],
        bad_images: str = "fail",
        key: str = "dataset",
    ):
        self.device, self.size, self.full_size = device, size, size
        self.skip, self.key, self.skipped = bad_images == "skip", key, set()
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)

    def __call__(self, batch: Batch) -> Batch:
        if not (isinstance(batch, (list, tuple)) and isinstance(batch[0], list)):
            return batch
        items, labels = batch
        images, kept = self.decoded(items)
        items, labels = [items[i] for i in kept], labels[kept]  # a skipped image's place: the next readable one's
        crops = []
        for item, image in zip(items, images):
            crop = resized_box(image, tuple(item["box"]), tuple(item["size"]), self.size)
            crops.append(crop.flip(-1) if item["flip"] else crop)
        images = torch.stack(crops).float().div_(255.0)
        return (images - self.mean) / self.std, labels.to(self.device, non_blocking=True)

    def decoded(self, items: Sequence[dict]) -> tuple[list[torch.Tensor], list[int]]:
        """Each item's whole image on the device: the JPEGs in one batched decode, and the index of the item each
        place holds. A JPEG the decoder refuses (damaged though its header and end are whole, or a kind nvJPEG does
        not read) fails the batch: then each is decoded alone (:meth:`decoded_alone`), and one that cannot be is
        named in ``dataset.bad_images: fail``'s line, or (``skip``) warned of once and its place given to the batch's
        next readable sample, as the workers give an unreadable file's to the next readable one."""
        from torchvision.io import ImageReadMode, decode_jpeg

        jpegs = [item["jpeg"] for item in items if "jpeg" in item]
        try:
            whole = iter(decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=self.device) if jpegs else [])
            return [next(whole) if "jpeg" in item else item["pixels"].to(self.device) for item in items], list(
                range(len(items))
            )
        except RuntimeError:
            pass
        images: list = []
        for item in items:
            try:
                images.append(self.decoded_alone(item))
            except OSError as exc:
                path, reason = item.get("path", "(a sample)"), str(exc) or "cannot decode the image"
                if "shard_sample" in item:  # a dataset shard's: converted again, not skipped
                    raise damaged_in_shard(item["shard_sample"], reason) from None
                if not self.skip:
                    raise unreadable(self.key, path, reason) from None
                if path not in self.skipped:
                    self.skipped.add(path)
                    sys.stderr.write(f"warning: skipping unreadable image {path} ({reason})\n")
                images.append(None)
        return self.replaced(images)

    def decoded_alone(self, item: dict) -> torch.Tensor:
        """One item's image on the device; a JPEG the device's decoder refuses (nvJPEG reads fewer kinds than
        libjpeg-turbo) decoded on the CPU instead. OSError: the file cannot be decoded at all."""
        from torchvision.io import ImageReadMode, decode_jpeg

        if "jpeg" not in item:
            return item["pixels"].to(self.device)
        try:
            return decode_jpeg(item["jpeg"], mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return decode(item["jpeg"].numpy().tobytes()).to(self.device)

    def replaced(self, images: list) -> tuple[list[torch.Tensor], list[int]]:
        """``images`` with each None (an unreadable image, skipped) replaced by the next readable one, and the
        index of the item each place now holds."""
        n = len(images)
        if all(image is None for image in images):
            raise DataError(f"{self.key}: none of the {n} images of a batch can be decoded")
        kept = [next((i + k) % n for k in range(n) if images[(i + k) % n] is not None) for i in range(n)]
        return [images[i] for i in kept], kept


def samples_in(batch: Batch) -> int:
    """Samples in a batch before or after :class:`DecodeOnDevice`."""
    return len(batch[1])
