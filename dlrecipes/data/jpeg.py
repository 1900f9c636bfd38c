"""Images decoded by libjpeg-turbo, at a reduced size where the crop is much smaller than the image.

The PIL path (``transforms.imagenet_transforms``) decodes every image whole into a PIL image, crops, resizes and
converts. Here an image file's bytes go to libjpeg-turbo through ``torchvision.io.decode_jpeg`` (other formats
through ``decode_image``, and PIL for those torchvision does not read), straight into a uint8 tensor; the crop
and resize then work on that tensor. Where the crop box is at least four times the crop's side, the JPEG is decoded
at 1/4 or 1/8 of its size by libjpeg-turbo's DCT scaling (PIL's ``draft``, the libjpeg-turbo inside Pillow's
wheel: torchvision's decoder has no scaled decoding), so nothing is decoded large only to be shrunk.

The random crop box and the flip are drawn as torchvision's ``RandomResizedCrop`` and ``RandomHorizontalFlip`` draw
them (the same calls on torch's global random state, in the same order, from the image's size read from its
header): the same seed gives the same box and flip as the PIL path, and the output differs from the PIL path's
only by the decoder's and the resize's rounding (tests/test_jpeg_decode.py states the tolerance).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import torch

from dlrecipes.errors import first_line

SCALES = (8, 4)  # libjpeg-turbo's DCT scaling, largest first (1/2, through PIL, cost more than it saved)
RATIO = (3.0 / 4.0, 4.0 / 3.0)  # RandomResizedCrop's default aspect ratios


def decode(data: bytes, scale: int = 1) -> torch.Tensor:
    """``data`` (an image file's bytes) as a uint8 RGB tensor (3, H, W); a JPEG at ``1/scale`` of its size (at
    least; libjpeg-turbo picks the nearest scale not below). An unreadable image raises OSError, as PIL does."""
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    jpeg = data[:3] == b"\xff\xd8\xff"
    try:
        if jpeg and scale > 1:
            return _pil_draft(data, scale)
        if jpeg:
            return decode_jpeg(encoded, mode=ImageReadMode.RGB)
        if data[:8] == b"\x89PNG\r\n\x1a\n" or data[:4] == b"RIFF" or data[:3] == b"GIF":
            return decode_image(encoded, mode=ImageReadMode.RGB)
    except RuntimeError as exc:  # torchvision's decoders: a damaged or truncated file
        raise OSError(first_line(exc, default="cannot decode the image")) from None
    return _pil_draft(data, 1)  # BMP, TIFF, PPM, ...: PIL reads them


def _pil_draft(data: bytes, scale: int) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if scale > 1:
            image.draft("RGB", (math.ceil(image.width / scale), math.ceil(image.height / scale)))
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def unreadable(key: str, path: str, reason: str):
    """The one line for an image that cannot be decoded (``dataset.bad_images: fail``), a DataError to raise."""
    from dlrecipes.errors import DataError

    return DataError(
        f"{key}: cannot read image {path} ({reason}); fix or remove it, or set "
        "dataset.bad_images=skip to skip unreadable images"
    )


def damaged_in_shard(where: str, reason: str):
    """The one line for an image in a dataset shard that cannot be decoded (``where``: the shard and sample), a
    DataError to raise."""
    from dlrecipes.errors import DataError

    return DataError(f"{where} ({reason}): truncated or corrupted; convert the dataset again")


def bomb_line(exc: BaseException, fix: str) -> str:
    """What to say of an image above Pillow's decompression-bomb limit (Pillow's own words give its pixels), and
    ``fix``."""
    from PIL import Image

    return (
        f"{first_line(exc, 120)}: above Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS, "
        f"{Image.MAX_IMAGE_PIXELS:,} pixels), refused before it was decoded; {fix} (or, for a real image that large, "
        "raise PIL.Image.MAX_IMAGE_PIXELS in a plugin)"
    )


def ends_whole(data: bytes) -> bool:
    """Whether a JPEG's end marker is in its last KiB (a truncated file's is not; some writers add a trailer)."""
    return b"\xff\xd9" in data[-1024:]


def header_size(data: bytes) -> tuple[int, int, bool]:
    """An image's (width, height) from its header, without decoding it, and whether it is a JPEG."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.width, image.height, image.format == "JPEG"


# A reduced decode keeps at least this many times the pixels needed (PIL's draft: 1). Measured on 1600x1200 photo-like
# JPEGs, 160 px crops, one core (2026-11-28): 6.8 ms an image at 1, 11.3 ms at 2 (less reduction, and roi_align over
# more pixels), 10.7 ms for the PIL path.
REDUCING_GAP = 1


def largest_scale(side: int, needed: int, jpeg: bool) -> int:
    """The largest DCT scale at which ``side`` pixels still give ``REDUCING_GAP`` times ``needed`` (1: decode
    whole)."""
    if jpeg:
        for scale in SCALES:
            if side // scale >= REDUCING_GAP * needed:
                return scale
    return 1


def resized_box(image: torch.Tensor, box: tuple[float, ...], full: tuple[int, int], size: int) -> torch.Tensor:
    """``box`` (top, left, height, width, in the full image's pixels) of ``image`` (that image, decoded at a reduced
    size or whole), resized to ``size`` x ``size``: each output pixel the mean of bilinear samples over its area
    (torchvision's ``roi_align``, which takes a box at any fraction of a pixel), rounded back to uint8."""
    from torchvision.ops import roi_align

    top, left, h, w = box
    fy, fx = image.shape[1] / full[0], image.shape[2] / full[1]
    rois = torch.tensor([[0.0, left * fx, top * fy, (left + w) * fx, (top + h) * fy]], device=image.device)
    out = roi_align(image[None].float(), rois, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    return out[0].round_().clamp_(0, 255).to(torch.uint8)


def resized(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``image`` (uint8, C x H x W, on the CPU) resized to ``height`` x ``width`` by antialiased bilinear
    interpolation in uint8: torch's kernel made to match Pillow's. torchvision's ``resize`` takes that kernel only on
    a CPU whose capability it reads as AVX2 and otherwise (AVX512 included) resizes in float32, 3-4x slower here."""
    from torch.nn.functional import interpolate

    return interpolate(image[None], size=(height, width), mode="bilinear", antialias=True)[0]


def _normalized(image: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (image.float().div_(255.0) - mean) / std


class TurboTrain:
    """Training: a random-resized crop of ``size`` (area in ``(min_scale, 1)``) and a random flip, from an image
    file's bytes, normalised."""

    def __init__(self, size: int, min_scale: float, hflip: bool, mean: Sequence[float], std: Sequence[float]):
        self.size, self.scale, self.hflip = size, (min_scale, 1.0), hflip
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def box(self, width: int, height: int) -> tuple[int, int, int, int]:
        """RandomResizedCrop's box (top, left, height, width), drawn as it draws it."""
        from torchvision.transforms import RandomResizedCrop

        return RandomResizedCrop.get_params(torch.empty(0, height, width), list(self.scale), list(RATIO))

    def __call__(self, data: bytes) -> torch.Tensor:
        width, height, jpeg = header_size(data)
        top, left, h, w = self.box(width, height)
        flip = self.hflip and torch.rand(1) < 0.5
        image = decode(data, largest_scale(min(h, w), self.size, jpeg))
        if image.shape[1:] == (height, width):
            crop = resized(image[:, top : top + h, left : left + w], self.size, self.size)
        else:  # decoded smaller: the box, in the decoded image's pixels, is not a whole number of them
            crop = resized_box(image, (top, left, h, w), (height, width), self.size)
        return _normalized(crop.flip(-1) if flip else crop, self.mean, self.std)


class TurboEval:
    """Evaluation: the shorter side resized to ``resize_size``, a centre crop of ``size``, normalised."""

    def __init__(self, size: int, resize_size: int, mean: Sequence[float], std: Sequence[float]):
        self.size, self.resize_size = size, resize_size
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def __call__(self, data: bytes) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        width, height, jpeg = header_size(data)
        image = decode(data, largest_scale(min(width, height), self.resize_size, jpeg))
        short, long = sorted(image.shape[1:])
        shape = (self.resize_size, int(self.resize_size * long / short))  # torchvision's Resize's rounding
        whole = resized(image, *(shape if image.shape[1] <= image.shape[2] else shape[::-1]))
        return _normalized(F.center_crop(whole, [self.size, self.size]), self.mean, self.std)
