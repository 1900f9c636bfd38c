"""How an image file becomes a model input, as a dataset's evaluation does it: ``preprocess.json``.

A dataset factory describes its evaluation preprocessing as plain data (:func:`preprocess_spec`);
``dlrecipes predict`` applies it to image files (:func:`load_image`, PIL and numpy only), and every
export directory carries it, so that an exported model can be used without dlrecipes::

    {"channels": "RGB",                      # PIL mode the file is converted to (RGB, or L for grey)
     "resize": {"shorter_side": 256},        # or {"size": [height, width]}
     "center_crop": [224, 224],              # or null
     "interpolation": "bilinear",
     "scale": 255,                           # pixel values are divided by this...
     "mean": [0.485, 0.456, 0.406],          # ...then (x - mean) / std per channel
     "std": [0.229, 0.224, 0.225],
     "layout": "NCHW", "dtype": "float32", "input_shape": [3, 224, 224]}

Resizing follows torchvision's ``Resize`` on PIL images (the shorter side to the size, the longer one
scaled and truncated; PIL's bilinear filter) and ``CenterCrop`` (offsets rounded), so for image-folder
data :func:`load_image` gives the evaluation split's tensors exactly.

Files are read the way an image viewer shows them (:func:`read_image`): the EXIF orientation applied,
the first frame of an animation, and pixel formats beyond 8 bits (16-bit and 32-bit integers, floats)
scaled to the 8-bit range the model was trained on rather than clipped to white.  An image larger
than Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``) is refused before it is
decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

FORMAT = "dlrecipes-preprocess/1"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def preprocess_spec(
    channels: str,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    shorter_side: int | None = None,
    size: Sequence[int] | None = None,
    center_crop: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The evaluation preprocessing of a dataset, as ``preprocess.json`` holds it."""
    if (shorter_side is None) == (size is None):
        raise ValueError("give exactly one of shorter_side and size")
    final = list(center_crop) if center_crop is not None else list(size)  # type: ignore[arg-type]
    return {
        "format": FORMAT,
        "channels": channels,
        "resize": {"shorter_side": int(shorter_side)} if shorter_side is not None else {"size": [int(s) for s in size]},
        "center_crop": [int(c) for c in center_crop] if center_crop is not None else None,
        "interpolation": "bilinear",
        "scale": 255,
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "layout": "NCHW",
        "dtype": "float32",
        "input_shape": [len(mean), *final],
    }


def load_image(path: str | Path, spec: dict[str, Any]):
    """The image file at ``path`` as the model's input for one sample: a float32 array (C, H, W)."""
    import numpy as np
    from PIL import Image

    image = read_image(path, spec["channels"])
    resize = spec["resize"]
    if "shorter_side" in resize:
        side, (w, h) = resize["shorter_side"], image.size
        if (w <= h and w != side) or (h < w and h != side):
            new = (side, int(side * h / w)) if w <= h else (int(side * w / h), side)
            image = image.resize(new, Image.BILINEAR)
    else:
        height, width = resize["size"]
        if image.size != (width, height):
            image = image.resize((width, height), Image.BILINEAR)
    if spec.get("center_crop"):
        crop_h, crop_w = spec["center_crop"]
        w, h = image.size
        top, left = int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0))
        image = image.crop((left, top, left + crop_w, top + crop_h))
    array = np.asarray(image, dtype=np.float32) / float(spec["scale"])
    if array.ndim == 2:
        array = array[:, :, None]
    mean = np.asarray(spec["mean"], dtype=np.float32)
    std = np.asarray(spec["std"], dtype=np.float32)
    return ((array - mean) / std).transpose(2, 0, 1).copy()


def read_image(path: str | Path, channels: str):
    """The image file at ``path`` as a PIL image in mode ``channels`` (``RGB`` or ``L``), as a viewer shows it:
    the first frame, turned upright by its EXIF orientation, more than 8 bits per channel scaled to 0..255,
    alpha dropped (as evaluation's ``convert("RGB")`` drops it).  An image above ``PIL.Image.MAX_IMAGE_PIXELS``
    raises Pillow's ``DecompressionBombWarning`` (raised here, not only warned) or, above twice that,
    ``DecompressionBombError``, before it is decoded; a file that cannot be read raises ``OSError`` or
    ``ValueError``."""
    import warnings

    from PIL import Image, ImageOps

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as opened:
            opened.seek(0)  # an animation's first frame
            image = ImageOps.exif_transpose(opened)  # a loaded copy, upright
    return eight_bit(image).convert(channels)


def eight_bit(image):
    """``image`` with 8 bits per channel: 16-bit images (``I;16*``) divided by 257; 32-bit integer (``I``) and
    float (``F``) images by what their values span: 0..1 (floats) times 255, 0..255 as they are, 0..65535
    divided by 257, anything else stretched from its minimum to its maximum.  Pillow's own ``convert`` would
    clip them, so a 16-bit photograph would become white.  A palette image with transparency becomes RGBA
    first (what Pillow asks for); other modes are left to ``convert``."""
    import numpy as np
    from PIL import Image

    if image.mode == "P" and "transparency" in image.info:
        return image.convert("RGBA")
    if not (image.mode in ("I", "F") or image.mode.startswith("I;16")):
        return image
    values = np.asarray(image).astype(np.float64)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if image.mode.startswith("I;16"):
        values = values / 257
    elif image.mode == "F" and 0 <= low and high <= 1:
        values = values * 255
    elif 0 <= low and high <= 255:
        pass
    elif 0 <= low and high <= 65535:
        values = values / 257
    else:
        values = (values - low) * (255 / (high - low)) if high > low else np.zeros_like(values)
    return Image.fromarray(np.clip(np.rint(np.nan_to_num(values)), 0, 255).astype(np.uint8), "L")


SPEC_CHANNELS = {"L": 1, "RGB": 3}


def spec_problem(spec: Any) -> str | None:
    """What is wrong with a ``preprocess.json`` as :func:`load_image` reads it, or ``None``."""
    from dlrecipes.errors import shown

    def sizes(value: Any, count: int) -> bool:
        return (
            isinstance(value, list)
            and len(value) == count
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        )

    def numbers(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)

    if not isinstance(spec, dict):
        return f"expected a JSON object (mapping), got a {type(spec).__name__}"
    missing = [k for k in ("channels", "resize", "scale", "mean", "std") if k not in spec]
    if missing:
        return f"missing key(s) {', '.join(missing)}"
    if spec["channels"] not in SPEC_CHANNELS:
        return f"channels: expected one of {', '.join(SPEC_CHANNELS)}, got {shown(spec['channels'])}"
    resize = spec["resize"]
    if not (
        isinstance(resize, dict)
        and (
            list(resize) == ["shorter_side"]
            and sizes([resize["shorter_side"]], 1)
            or list(resize) == ["size"]
            and sizes(resize["size"], 2)
        )
    ):
        return 'resize: expected {"shorter_side": N} or {"size": [height, width]} with whole numbers >= 1'
    if spec.get("center_crop") is not None and not sizes(spec["center_crop"], 2):
        return "center_crop: expected null or [height, width], whole numbers >= 1"
    if not (isinstance(spec["scale"], (int, float)) and not isinstance(spec["scale"], bool) and spec["scale"] > 0):
        return "scale: expected a number above 0"
    bands = SPEC_CHANNELS[spec["channels"]]
    for key in ("mean", "std"):
        if not (numbers(spec[key]) and len(spec[key]) == bands):
            return f"{key}: expected a list of {bands} number(s), one per {spec['channels']} channel"
    if any(s == 0 for s in spec["std"]):
        return "std: a value of 0 (each must be non-zero: inputs are divided by it)"
    return None


def image_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files named, and the image files under the folders named (sorted), in the order given."""
    found: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found += sorted(p for p in entry.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        else:
            found.append(entry)
    return found


__all__ = [
    "FORMAT",
    "IMAGE_SUFFIXES",
    "SPEC_CHANNELS",
    "eight_bit",
    "image_files",
    "load_image",
    "preprocess_spec",
    "read_image",
    "spec_problem",
]
