"""Image folders: any root with one subfolder per class, ImageNet, and ImageNet-100.

ImageNet-100 is ImageNet restricted to the 100 classes of the CMC paper (Tian et al.,
2019); the synset list ships with the package as ``imagenet100_classes.txt``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def imagenet100_classes() -> list[str]:
    text = resources.files(__package__).joinpath("imagenet100_classes.txt").read_text()
    return [line.strip() for line in text.splitlines() if line.strip()]


def find_classes(root: Path, key: str, only: Sequence[str] | None = None) -> list[str]:
    """Class folder names under ``root`` (all of them, or exactly ``only``, in that order)."""
    if not root.is_dir():
        raise DataError(f"{key}: folder not found: {root}")
    present = sorted(p.name for p in root.iterdir() if p.is_dir())
    if only is None:
        if not present:
            raise DataError(f"{key}: {root} has no class subfolders (expected {root}/<class>/<image>.jpg)")
        return present
    missing = [c for c in only if c not in present]
    if missing:
        listed = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        raise DataError(f"{key}: {root} lacks {len(missing)} of the {len(only)} expected class folders: {listed}")
    return list(only)


def shared_classes(train_path: str, val_path: str, key: str, only: Sequence[str] | None = None) -> list[str]:
    """The class folders train_path and val_path both hold (all of them, or exactly ``only``); one line when they
    differ."""
    classes = find_classes(Path(train_path), f"{key}.train_path", only)
    val_classes = find_classes(Path(val_path), f"{key}.val_path", only)
    if val_classes != classes:
        extra = sorted(set(val_classes) ^ set(classes))
        raise DataError(
            f"{key}: train ({train_path}) and val ({val_path}) have different class folders: {', '.join(extra[:20])}"
        )
    return classes


def build_image_folder_split(
    root: Path, key: str, classes: list[str], transform, bad_images: str = "fail", turbo=None, device_decode=None
):
    """A torchvision ImageFolder over ``classes``; unreadable images fail naming the file, or are skipped.

    ``bad_images="skip"`` replaces an unreadable (corrupt, truncated, zero-byte) image by the next readable one,
    warns with its path, and flags it in ``dataset.unreadable`` (shared memory: DataLoader workers' flags are seen).
    ``turbo`` (a transform of a file's bytes: :mod:`dlrecipes.data.jpeg`, :mod:`dlrecipes.data.device_decode`) is
    used while ``transform`` (the PIL path, where Composer's RandAugment and AugMix insert theirs) has no step added."""
    import multiprocessing

    from torchvision.datasets import ImageFolder

    from dlrecipes.data.jpeg import unreadable

    skip = bad_images == "skip"
    pil_steps = len(getattr(transform, "transforms", ()) or ())

    class _CheckedImageFolder(ImageFolder):
        def find_classes(self, directory):
            return classes, {c: i for i, c in enumerate(classes)}

        def decodes_with_turbo(self) -> bool:
            """Whether samples are decoded by libjpeg-turbo: a turbo transform, and the PIL path as it was built."""
            steps = getattr(self.transform, "transforms", None)
            return turbo is not None and self.transform is transform and len(steps or ()) == pil_steps

        def load(self, i: int):
            if not self.decodes_with_turbo():
                return super().__getitem__(i)
            path, target = self.samples[i]
            with open(path, "rb") as f:
                sample = turbo(f.read())
            return (dict(sample, path=path) if isinstance(sample, dict) else sample), target  # device: its path

        def __getitem__(self, index):
            for attempt in range(len(self.samples)):
                i = (index + attempt) % len(self.samples)
                try:
                    return self.load(i)
                except OSError as exc:  # PIL: unidentified, truncated or unreadable file
                    path = self.samples[i][0]
                    reason = str(exc).split(" (")[0] if str(exc) else type(exc).__name__
                    if not skip:
                        raise unreadable(key, path, reason) from None
                    if not self.unreadable[i]:  # first time any worker meets it
                        self.unreadable[i] = 1
                        # one write: print's two (text, newline) from two workers could share one line
                        sys.stderr.write(f"warning: skipping unreadable image {path} ({reason})\n")
                        sys.stderr.flush()
            raise DataError(f"{key}: none of the {len(self.samples)} images under {root} can be read")

    try:
        dataset = _CheckedImageFolder(str(root), transform=transform)
    except FileNotFoundError as exc:  # a class folder without any image
        raise DataError(f"{key}: {exc}") from None
    # one flag per image, in shared memory: DataLoader workers (forked) mark what they skipped
    dataset.unreadable = multiprocessing.Array("b", len(dataset.samples), lock=False)
    dataset.device_decode = device_decode or None  # (size, mean, std, bad_images, key): decoded on the device
    return dataset


def build_image_folders(
    train_path: str,
    val_path: str,
    crop_size: int,
    resize_size: int,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
    only_classes: Sequence[str] | None = None,
    key: str = "dataset",
    bad_images: str = "fail",
    eval_crop_size: int | None = None,
    decode: str = "turbo",
) -> DatasetSplits:
    """Train and eval ImageFolders: ``crop_size`` random-resized crops for training; for evaluation
    the shorter side resized to ``resize_size``, then an ``eval_crop_size`` centre crop; ``decode``: ``turbo``
    (libjpeg-turbo, :mod:`dlrecipes.data.jpeg`), ``device`` (in batches on the training device) or ``pil``."""
    from dlrecipes.data.device_decode import split_decoder
    from dlrecipes.data.preprocess import preprocess_spec
    from dlrecipes.data.transforms import crop_settings, imagenet_transforms

    eval_crop_size = eval_crop_size or crop_size
    classes = shared_classes(train_path, val_path, key, only_classes)

    def split(path: str, which: str, train: bool, size: int):
        transform = imagenet_transforms(size, resize_size, min_scale, hflip, mean, std, train=train)
        turbo = split_decoder(decode, train, size, resize_size, min_scale, hflip, mean, std)
        # decode: device: the workers read and draw the crops, the training process decodes the batch
        later = decode == "device" and (size, mean, std, bad_images, f"{key}.{which}")
        return build_image_folder_split(Path(path), f"{key}.{which}", classes, transform, bad_images, turbo, later)

    return DatasetSplits(
        train=split(train_path, "train_path", True, crop_size),
        eval=split(val_path, "val_path", False, eval_crop_size),
        num_classes=len(classes),
        input_shape=(len(mean), crop_size, crop_size),
        class_names=classes,
        augment=crop_settings(crop_size, eval_crop_size, resize_size, min_scale, hflip, mean, std),
        preprocess=preprocess_spec(
            "RGB", mean, std, shorter_side=resize_size, center_crop=(eval_crop_size, eval_crop_size)
        ),
    )
