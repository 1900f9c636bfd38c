"""How large a dataset's source images are, where that is known before training, and the warning when the recipe
would upsample them several-fold (``dataset.crop_size`` far above the images' side: slower, and no detail gained).

A dataset registers ``source_side=fn(params)`` (:mod:`dlrecipes.registry`), returning ``(side, where)`` (the
shorter side of a sample image, and which image) or None when it cannot tell cheaply; the functions here are those
of the image folders (one image header read) and of Hugging Face datasets (one image decoded).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
UPSAMPLE_FACTOR = 2  # warn when the crop is more than this many times the source's side


def first_image(root: Path) -> Path | None:
    """The first image file of ``root/<class>/`` (sorted), or None."""
    if not root.is_dir():
        return None
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for file in sorted(folder.iterdir()):
            if file.suffix.lower() in IMAGE_SUFFIXES and file.is_file():
                return file
    return None


def folder_side(root: Any) -> tuple[int, str] | None:
    """The shorter side of an image folder's first image (its header only), or None."""
    if not isinstance(root, str):
        return None
    file = first_image(Path(root))
    if file is None:
        return None
    try:
        from PIL import Image

        with Image.open(file) as image:
            return min(image.size), str(file)
    except OSError:  # unreadable: the data's own checks name it
        return None


def hf_side(params: dict) -> tuple[int, str] | None:
    """The shorter side of the first image of a Hugging Face dataset's training split, for a local folder (a hub id
    is not fetched for this), or None."""
    path = params.get("path")
    if not isinstance(path, str) or not Path(path).expanduser().is_dir():
        return None
    try:
        from dlrecipes.data.hf_dataset import load_splits, pick_split

        split, table = pick_split(
            load_splits(path, params.get("config")), params.get("split", "train"), "dataset.split", path
        )
        image = table[0][params.get("image_column", "image")]
        return min(image.size), f"{path} ({split}[0])"
    except Exception:  # whatever is wrong with it, building the data says so, in one line
        return None


def upsampling_notes(config: RecipeConfig) -> list[str]:
    """One warning when the recipe's crop is more than :data:`UPSAMPLE_FACTOR` times its source images' side."""
    from dlrecipes import registry

    dataset = config.dataset
    if dataset.name not in registry.datasets:
        return []
    entry = registry.datasets.get(dataset.name)
    measure = entry.metadata.get("source_side")
    default = entry.parameters.get("crop_size")
    crop = dataset.params.get("crop_size", default.default if default is not None else None)
    if measure is None or not isinstance(crop, int):
        return []
    found = measure(dataset.params)
    if found is None or crop <= UPSAMPLE_FACTOR * found[0]:
        return []
    side, where = found
    return [
        f"warning: dataset.crop_size={crop} is {crop / side:.0f}x the source images' side ({side} px, {where}): "
        f"each image is upsampled, which costs time and adds no detail; set dataset.crop_size (and "
        f"resize_size) near {side}"
    ]
