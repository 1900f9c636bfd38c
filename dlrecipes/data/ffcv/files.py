"""FFCV ``.beton`` files: write any registered dataset, and read one's contents back.

FFCV is an optional extra: :func:`import_ffcv` gives an install hint when it is missing and
undoes FFCV's ``torch.set_num_threads(1)`` at import, which would otherwise slow CPU
training to a crawl, and makes FFCV's numba-compiled pipelines cacheable on disk
(:mod:`dlrecipes.data.ffcv.compile`).  Each ``.beton`` gets a ``.json`` sidecar naming its classes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dlrecipes.errors import DataError, UserError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

FFCV_INSTALL_HINT = (
    "FFCV is not installed. It builds from source: first the system packages "
    "(apt-get install pkg-config libturbojpeg0-dev libopencv-dev), then pip install -e '.[ffcv]' "
    "(or pip install 'dlrecipes[ffcv]')"
)
WriteMode = Literal["smart", "jpg", "raw", "proportion"]


def import_ffcv():
    """``import ffcv`` with a clear error when missing, keeping torch's thread count."""
    import torch

    threads = torch.get_num_threads()
    try:
        import ffcv  # noqa: F401
        import ffcv.fields.decoders  # noqa: F401
        import ffcv.loader  # noqa: F401
        import ffcv.transforms  # noqa: F401
    except ImportError as exc:
        raise UserError(f"{FFCV_INSTALL_HINT} ({exc})") from None
    finally:
        torch.set_num_threads(threads)  # importing ffcv sets it to 1 for the whole process
    from dlrecipes.data.ffcv.compile import install

    install()  # compiled pipelines cached on disk: only a machine's first run compiles
    return ffcv


class RawImages:
    """Index -> (HWC uint8 RGB array, label) over a dataset's original images, and a name for each."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        if hasattr(dataset, "samples") and hasattr(dataset, "loader"):  # torchvision ImageFolder
            self.kind = "files"
        elif hasattr(dataset, "pil_image"):  # decoded one at a time (a Hugging Face dataset's ArrowImages)
            self.kind = "decoded"
        elif hasattr(dataset, "images") and hasattr(dataset, "labels"):  # in-memory uint8 tensors
            self.kind = "tensors"
        else:
            raise DataError(
                f"cannot write a {type(dataset).__name__} to FFCV: it holds neither image files nor uint8 images"
            )

    def __len__(self) -> int:
        return len(self.dataset.samples) if self.kind == "files" else len(self.dataset.labels)

    def name(self, index: int) -> str:
        if self.kind == "decoded":
            return self.dataset.sample_name(index)
        return str(self.dataset.samples[index][0]) if self.kind == "files" else f"sample {index}"

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if self.kind == "files":
            from PIL import Image

            path, label = self.dataset.samples[index]
            with Image.open(path) as img:
                return np.asarray(img.convert("RGB")), int(label)
        if self.kind == "decoded":
            return np.asarray(self.dataset.pil_image(index)), int(self.dataset.labels[index])
        chw = self.dataset.images[index].numpy()
        if chw.shape[0] == 1:
            chw = np.repeat(chw, 3, axis=0)  # FFCV stores RGB; grey images become three equal channels
        return np.ascontiguousarray(chw.transpose(1, 2, 0)), int(self.dataset.labels[index])


def find_unreadable(
    source: RawImages, skip_bad: bool, progress: Callable[[int], None] | None = None
) -> list[tuple[str, str]]:
    """Decode every file once; returns (path, error) for each bad one, or raises at the first if not skipping."""
    bad = []
    if source.kind != "files":
        return bad
    from PIL import Image

    for index in range(len(source)):
        path = source.name(index)
        try:
            if os.path.getsize(path) == 0:
                raise OSError("empty file")
            with Image.open(path) as img:
                img.convert("RGB").load()
        except Exception as exc:  # PIL raises many types for broken files
            if not skip_bad:
                raise DataError(f"unreadable image {path} ({exc}); fix or remove it, or pass --skip-bad") from None
            bad.append((path, str(exc)))
        if progress is not None:
            progress(1)
    return bad


@dataclass
class ConvertOptions:
    max_resolution: int | None = 256  # longer side is downscaled to this (None: keep full size)
    write_mode: WriteMode = "smart"
    jpeg_quality: int = 90
    compress_probability: float = 0.5  # for write_mode=proportion
    page_size: int = 1 << 23
    num_workers: int = -1
    overwrite: bool = False
    skip_bad: bool = False


@dataclass
class ConvertReport:
    path: Path
    samples: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def write_beton(
    source: RawImages,
    path: Path,
    options: ConvertOptions,
    class_names: list[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> ConvertReport:
    """Write ``source`` to ``path`` atomically (temporary name, fsync, rename) with a JSON sidecar."""
    import_ffcv()
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    start = time.perf_counter()
    path = Path(path)
    if path.exists() and not options.overwrite:
        raise UserError(f"{path} already exists; pass --overwrite to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    bad = find_unreadable(source, options.skip_bad, progress)
    bad_names = {name for name, _ in bad}
    indices = [i for i in range(len(source)) if source.kind != "files" or source.name(i) not in bad_names]
    if not indices:
        raise DataError(f"no readable images to write to {path}")
    image_field = RGBImageField(
        write_mode=options.write_mode,
        max_resolution=options.max_resolution,
        jpeg_quality=options.jpeg_quality,
        compress_probability=options.compress_probability,
    )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        writer = DatasetWriter(
            str(tmp),
            {"image": image_field, "label": IntField()},
            page_size=options.page_size,
            num_workers=options.num_workers,
        )
        writer.from_indexed_dataset(source, indices=indices)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        labels = [
            source.dataset.samples[i][1] if source.kind == "files" else int(source.dataset.labels[i]) for i in indices
        ]
        sidecar = {
            "samples": len(indices),
            "num_classes": len(class_names) if class_names else int(max(labels)) + 1,
            "class_names": class_names,
            "skipped": [name for name, _ in bad],
            "options": {k: v for k, v in asdict(options).items() if k not in ("overwrite", "skip_bad")},
        }
        Path(f"{tmp}.json").write_text(json.dumps(sidecar, indent=2) + "\n")
        os.replace(f"{tmp}.json", f"{path}.json")
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, Path(f"{tmp}.json")):
            if leftover.exists():
                leftover.unlink()
    return ConvertReport(path, len(indices), bad, time.perf_counter() - start)


def open_reader(path: str | Path):
    """FFCV's Reader for ``path``, or a DataError naming the file if it is missing or damaged."""
    import_ffcv()
    from ffcv.reader import Reader

    path = Path(path)
    if not path.is_file():
        raise DataError(f"FFCV file not found: {path}")
    size = path.stat().st_size
    try:
        reader = Reader(str(path))
    except Exception as exc:
        raise DataError(
            f"{path}: not a readable FFCV file (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None
    # The allocation table is written last: a complete file ends exactly where it ends.
    expected = int(reader.header["alloc_table_ptr"]) + reader.alloc_table.nbytes
    data_end = int((reader.alloc_table["ptr"] + reader.alloc_table["size"]).max()) if len(reader.alloc_table) else 0
    if size != expected or data_end > size or len(reader.alloc_table) < reader.num_samples:
        raise DataError(
            f"{path}: truncated or damaged FFCV file ({size} bytes; its header expects {expected}). Convert it again."
        )
    fields = [type(handler).__name__ for handler in reader.handlers.values()]
    if fields != list(FIELDS):  # other fields (an NDArrayField's dtype is any the file names) are not read
        raise DataError(
            f"{path}: its fields are {fields}, not those data convert writes ({list(FIELDS)}: an image and its "
            "label); convert the dataset with dlrecipes data convert"
        )
    return reader


FIELDS = ("RGBImageField", "IntField")  # what write_beton stores, in order
MOST_CLASSES = 10**6  # a sidecar's class count beyond it is no dataset's


def _sidecar(path: str | Path) -> dict | None:
    """The ``.json`` beside a ``.beton`` (class names and count), checked as data: the count a whole number from 1 to
    :data:`MOST_CLASSES`, the names (if any) that many strings; one line naming the file otherwise."""
    sidecar = Path(f"{path}.json")
    if not sidecar.is_file():
        return None
    try:
        held = json.loads(sidecar.read_text())
        count, names = held["num_classes"], held.get("class_names")
        ok = type(count) is int and 1 <= count <= MOST_CLASSES
        ok = ok and (names is None or (isinstance(names, list) and len(names) == count))
        ok = ok and all(isinstance(name, str) for name in names or ())
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise DataError(f"{sidecar}: not the class names and count data convert writes; convert the dataset again")
    return held


def beton_class_names(path: str | Path) -> list[str] | None:
    """The class names ``data convert`` recorded next to the file, if any."""
    held = _sidecar(path)
    return (held.get("class_names") or None) if held is not None else None


def beton_num_classes(path: str | Path) -> int:
    """The classes of the file's labels: its sidecar's count, which its labels must lie within (else one line)."""
    held = _sidecar(path)
    labels = open_reader(path).metadata["f1"]
    highest = int(labels.max()) if len(labels) else 0
    if held is None:
        return highest + 1
    if highest >= held["num_classes"] or (len(labels) and int(labels.min()) < 0):
        raise DataError(
            f"{path}: holds labels up to {highest}, outside the {held['num_classes']} classes {path}.json names; "
            "convert the dataset again"
        )
    return int(held["num_classes"])


def inspect_beton(path: str | Path) -> dict[str, Any]:
    """Samples, fields, resolution statistics and class counts of a ``.beton`` file."""
    reader = open_reader(path)
    meta = reader.metadata
    fields = {name: type(f).__name__ for name, f in reader.handlers.items()} if hasattr(reader, "handlers") else {}
    info: dict[str, Any] = {"path": str(path), "samples": int(reader.num_samples), "fields": fields}
    image, label = meta["f0"], meta["f1"]
    heights, widths = image["height"].astype(int), image["width"].astype(int)
    info["resolution"] = {
        "height": {"min": int(heights.min()), "median": float(np.median(heights)), "max": int(heights.max())},
        "width": {"min": int(widths.min()), "median": float(np.median(widths)), "max": int(widths.max())},
    }
    modes = image["mode"].astype(int)
    info["stored_as"] = {"jpg": int((modes == 0).sum()), "raw": int((modes == 1).sum())}  # FFCV: jpg=0, raw=1
    values, counts = np.unique(label.astype(int), return_counts=True)
    info["classes"] = {int(v): int(c) for v, c in zip(values, counts)}
    sidecar = Path(f"{path}.json")
    if sidecar.is_file():
        extra = json.loads(sidecar.read_text())
        if extra.get("class_names"):
            info["class_names"] = extra["class_names"]
        info["skipped_when_written"] = len(extra.get("skipped", []))
    return info
