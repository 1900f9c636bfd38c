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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

FORMAT = "dlrecipes-preprocess/1"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def preprocess_spec(channels: str, mean: Sequence[float], std: Sequence[float], *, shorter_side: Optional[int] = None,
                    size: Optional[Sequence[int]] = None, center_crop: Optional[Sequence[int]] = None) -> dict[str, Any]:
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

    with Image.open(path) as opened:
        image = opened.convert(spec["channels"])
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


def image_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files named, and the image files under the folders named (sorted), in the order given."""
    found: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found += sorted(p for p in entry.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        else:
            found.append(entry)
    return found


__all__ = ["FORMAT", "IMAGE_SUFFIXES", "image_files", "load_image", "preprocess_spec"]
