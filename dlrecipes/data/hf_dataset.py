"""Hugging Face datasets (the ``hf`` extra), read through the ``datasets`` library (memory-mapped Arrow).

``dataset.path`` is a hub id (``ylecun/mnist``), a folder written by ``Dataset.save_to_disk`` or
``DatasetDict.save_to_disk``, or a folder of data files the library reads itself (Parquet: ``train.parquet``,
``test.parquet``, or ``data/train-*.parquet``, ...).  A hub id is asked of the hub once (see
:mod:`dlrecipes.runtime.hub`): offline, a dataset in the local cache loads and any other fails in one line.

Images are decoded one sample at a time, as an image folder's files are, with the same sizes and transforms
(``image_folder``'s crop_size, resize_size, ...); the class names are the label column's ``ClassLabel``
names.  Each split is an :class:`ArrowImages`, which the tensor cache and ``dlrecipes data convert`` read
too (:meth:`ArrowImages.pil_image`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torchvision.datasets import VisionDataset

from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import DataError, RecipeError, UserError, did_you_mean, first_line, shown

if TYPE_CHECKING:
    import datasets

INSTALL_HINT = "Hugging Face datasets is not installed: pip install 'dlrecipes[hf]' (or pip install datasets)"
EVAL_SPLITS = ("validation", "test")  # what eval_split picks when the recipe names none, in this order


def import_datasets():
    """``import datasets``, with the install hint when it is missing."""
    try:
        import datasets
    except ImportError as exc:
        raise UserError(f"{INSTALL_HINT} ({exc})") from None
    return datasets


class ArrowImages(VisionDataset):
    """One split as ``(transformed image, label)``, decoding each image from the Arrow table when asked.

    A torchvision ``VisionDataset`` with a ``transform`` attribute, so Composer's RandAugment and AugMix
    can insert their PIL transform as they do in an image folder's.
    """

    def __init__(self, table: datasets.Dataset, image_column: str, labels: np.ndarray, transform, name: str):
        super().__init__(name, transform=transform)
        self.table = table.select_columns([image_column])  # decode only the images
        self.image_column = image_column
        self.labels = labels
        self.name = name

    def __len__(self) -> int:
        return len(self.labels)

    def pil_image(self, index: int):
        """The sample's image as RGB PIL, before any transform; an image that cannot be decoded is refused
        naming its row."""
        try:
            return self.table[int(index)][self.image_column].convert("RGB")
        except (OSError, ValueError, SyntaxError) as exc:  # PIL: unidentified, truncated or damaged data
            reason = str(exc).split(" (")[0] if str(exc) else type(exc).__name__
            raise DataError(
                f"dataset.path: cannot decode the image of row {int(index)} of {self.name} ({reason}); "
                "fix or remove that row"
            ) from None

    def sample_name(self, index: int) -> str:
        return f"{self.name}[{index}]"

    def cache_fingerprint(self) -> dict:
        """What the tensor cache compares to know that its copy is this split's."""
        return {"rows": len(self), "fingerprint": self.table._fingerprint}

    def cache_home(self) -> Path | None:
        """The folder of the split's Arrow files (None when the table is held in memory)."""
        files = self.table.cache_files
        return Path(files[0]["filename"]).resolve().parent if files else None

    def __getitem__(self, index: int):
        image = self.pil_image(index)
        return (self.transform(image) if self.transform is not None else image), int(self.labels[index])


def load_splits(path: str, config: str | None) -> dict[str, Any]:
    """``{split name: datasets.Dataset}`` of a local folder or a hub id."""
    datasets = import_datasets()
    folder = Path(path).expanduser()
    if (folder / "dataset_dict.json").is_file():
        return saved_splits(folder)
    if folder.is_dir():
        saved = (folder / "state.json").is_file()
        if saved:
            check_state(folder)
        try:
            loaded = datasets.load_from_disk(str(folder)) if saved else datasets.load_dataset(str(folder), config)
        except (OSError, ValueError, datasets.exceptions.DatasetsError) as exc:
            raise DataError(
                f"dataset.path: cannot read {folder} as a Hugging Face dataset ({type(exc).__name__}: "
                f"{first_line(exc, 200, '')}); give a folder written by save_to_disk, or one of Parquet files"
            ) from None
    else:
        from dlrecipes.runtime.hub import hub_offline_unless_reachable

        with hub_offline_unless_reachable() as online:
            try:
                loaded = datasets.load_dataset(path, config)
            except (OSError, ValueError, datasets.exceptions.DatasetsError) as exc:
                why = (
                    f"{type(exc).__name__}: {first_line(exc, 200, '')}"
                    if online
                    else "offline, and not in the local cache"
                )
                raise DataError(
                    f"dataset.path: cannot download the Hugging Face dataset '{path}' ({why}); download it on a "
                    f"connected machine (datasets.load_dataset('{path}').save_to_disk(FOLDER)) and set dataset.path "
                    "to that folder"
                ) from None
    if isinstance(loaded, datasets.Dataset):  # one split saved alone
        return {str(loaded.split or "train"): loaded}
    return dict(loaded)


class SavedSplit:
    """One split of a ``DatasetDict.save_to_disk`` folder, opened only when a recipe uses it (the library opens
    every split at once, and fails on an empty one with an IndexError)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def rows_files(self) -> list:
        import json

        try:
            return json.loads((self.folder / "state.json").read_text()).get("_data_files") or []
        except (OSError, ValueError) as exc:
            raise DataError(
                f"dataset.path: cannot read {self.folder / 'state.json'} ({exc}); save the dataset "
                "again with save_to_disk"
            ) from None

    def open(self) -> datasets.Dataset:
        datasets = import_datasets()
        check_state(self.folder)
        try:
            return datasets.Dataset.load_from_disk(str(self.folder))
        except (OSError, ValueError, IndexError, datasets.exceptions.DatasetsError) as exc:
            raise DataError(
                f"dataset.path: cannot read the split {self.folder} ({type(exc).__name__}: "
                f"{first_line(exc, 200, '')}); save the dataset again with save_to_disk"
            ) from None


def saved_splits(folder: Path) -> dict[str, Any]:
    """``{split: SavedSplit}`` of a saved DatasetDict, as its ``dataset_dict.json`` lists them."""
    import json

    try:
        names = json.loads((folder / "dataset_dict.json").read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"dataset.path: cannot read {folder / 'dataset_dict.json'} ({type(exc).__name__}: {exc}); "
            "save the dataset again with save_to_disk"
        ) from None
    for name in names if isinstance(names, list) else [names]:
        plain_name(name, folder / "dataset_dict.json", "a split")
    return {str(name): SavedSplit(folder / str(name)) for name in names}


def plain_name(name: Any, where: Path, what: str) -> None:
    """A name a saved dataset's metadata gives for one of its own files or folders: plain (no separator, no ``..``,
    not absolute), or one line naming the metadata file; nothing outside the dataset's folder is read."""
    if not (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name):
        raise DataError(
            f"dataset.path: {where} names {what} {name!r}, which is not a plain name in its folder: refused (a "
            "dataset saved by save_to_disk names its own files); save the dataset again"
        )


def check_state(folder: Path) -> None:
    """The files a split's ``state.json`` lists (which ``load_from_disk`` opens) are plain names in its folder."""
    for entry in SavedSplit(folder).rows_files():
        plain_name(entry.get("filename") if isinstance(entry, dict) else entry, folder / "state.json", "the file")


def pick_split(splits: dict[str, Any], name: str | None, key: str, path: str) -> tuple[str, Any]:
    """The split ``name`` (for ``eval_split`` unset: validation, else test), or one line naming the splits there are."""
    if name is None:
        name = next((s for s in EVAL_SPLITS if s in splits), None)
        if name is None:
            raise RecipeError(
                f"{key}: {path} has neither a validation nor a test split; name one of its splits: {', '.join(splits)}"
            )
    if name not in splits:
        raise RecipeError(
            f"{key}: {path} has no split {name!r}{did_you_mean(name, splits)}; its splits: {', '.join(splits)}"
        )
    chosen = splits[name]
    if isinstance(chosen, SavedSplit):
        if not chosen.rows_files():
            full = [s for s, v in splits.items() if not isinstance(v, SavedSplit) or v.rows_files()]
            raise DataError(
                f"{key}: the {name!r} split of {path} is empty (0 rows); name a split with samples: "
                f"{', '.join(full) or 'none has any'}"
            )
        chosen = chosen.open()
    if len(chosen) == 0:
        full = [s for s, v in splits.items() if not hasattr(v, "__len__") or len(v)]
        raise DataError(
            f"{key}: the {name!r} split of {path} is empty (0 rows); name a split with samples: "
            f"{', '.join(full) or 'none has any'}"
        )
    return name, chosen


def check_columns(table: datasets.Dataset, image_column: str, label_column: str, path: str) -> list[str] | None:
    """Both columns exist, hold images and integer labels; returns the ``ClassLabel`` names (None: plain integers)."""
    datasets = import_datasets()
    features = table.features
    columns = list(features)
    for which, column in (("image_column", image_column), ("label_column", label_column)):
        if column not in features:
            raise RecipeError(
                f"dataset.{which}: {path} has no column {column!r}{did_you_mean(column, columns)}; "
                f"its columns: {', '.join(columns)}"
            )
    if not isinstance(features[image_column], datasets.Image):
        images = [c for c in columns if isinstance(features[c], datasets.Image)]
        raise RecipeError(
            f"dataset.image_column: column {image_column!r} of {path} holds "
            f"{shown(features[image_column])}, not images; its image columns: {', '.join(images) or 'none'}"
        )
    label = features[label_column]
    if isinstance(label, datasets.ClassLabel):
        return list(label.names)
    if isinstance(label, datasets.Value) and label.dtype.startswith(("int", "uint")):
        return None
    labels = [c for c in columns if isinstance(features[c], datasets.ClassLabel)]
    raise RecipeError(
        f"dataset.label_column: column {label_column!r} of {path} holds {shown(label)}, not class labels "
        f"(a ClassLabel or integers); its ClassLabel columns: {', '.join(labels) or 'none'}"
    )


def read_labels(table: datasets.Dataset, label_column: str) -> np.ndarray:
    return np.asarray(table.with_format("numpy")[label_column], dtype=np.int64)


def build_hf_dataset(
    path: str,
    split: str,
    eval_split: str | None,
    image_column: str,
    label_column: str,
    config: str | None,
    crop_size: int,
    resize_size: int,
    eval_crop_size: int | None,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> DatasetSplits:
    """Train and eval :class:`ArrowImages` of a Hugging Face dataset, sized as image folders are."""
    from dlrecipes.data.preprocess import preprocess_spec
    from dlrecipes.data.transforms import crop_settings, imagenet_transforms

    eval_crop_size = eval_crop_size or crop_size
    splits = load_splits(path, config)
    split, train_table = pick_split(splits, split, "dataset.split", path)
    eval_split, eval_table = pick_split(splits, eval_split, "dataset.eval_split", path)
    names = check_columns(train_table, image_column, label_column, path)
    eval_names = check_columns(eval_table, image_column, label_column, path)
    if eval_names != names:
        raise DataError(
            f"dataset.label_column: the {split} and {eval_split} splits of {path} name their classes "
            f"differently ({names} and {eval_names})"
        )
    train_labels, eval_labels = read_labels(train_table, label_column), read_labels(eval_table, label_column)
    num_classes = (
        len(names) if names is not None else int(max(train_labels.max(initial=-1), eval_labels.max(initial=-1))) + 1
    )
    train_tf = imagenet_transforms(crop_size, resize_size, min_scale, hflip, mean, std, train=True)
    eval_tf = imagenet_transforms(eval_crop_size, resize_size, min_scale, hflip, mean, std, train=False)
    return DatasetSplits(
        train=ArrowImages(train_table, image_column, train_labels, train_tf, f"{path}:{split}"),
        eval=ArrowImages(eval_table, image_column, eval_labels, eval_tf, f"{path}:{eval_split}"),
        num_classes=num_classes,
        input_shape=(len(mean), crop_size, crop_size),
        class_names=names if names is not None else [str(i) for i in range(num_classes)],
        augment=crop_settings(crop_size, eval_crop_size, resize_size, min_scale, hflip, mean, std),
        preprocess=preprocess_spec(
            "RGB", mean, std, shorter_side=resize_size, center_crop=(eval_crop_size, eval_crop_size)
        ),
    )
