"""Any dataset dlrecipes reads, written as dataset shards (litdata's format) to a local folder or a bucket:
``dlrecipes data convert SOURCE --format shards --out DEST`` (:mod:`dlrecipes.data.shards.dataset` reads them).

Encoded images are kept as they are (an image folder's files, a Hugging Face column's bytes); in-memory uint8 images
(CIFAR, MNIST, the digits) are encoded losslessly as PNG; ``reencode_quality`` re-encodes every image as JPEG, and
``max_resolution`` stores an image whose longer side is larger at that side (as FFCV's files store ImageNet, what
makes them fast to decode), re-encoded as JPEG (at ``reencode_quality``, else 90).  The
shards are made by litdata's writer in a temporary folder, then moved to ``DEST`` in one rename (a local folder) or
uploaded with ``dlrecipes-shards.json`` last (a bucket): a conversion that fails leaves no dataset a reader accepts.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlrecipes.data.shards.dataset import FORMAT, META, SPLITS, ShardsPlace, import_litdata
from dlrecipes.errors import DataError, UserError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from dlrecipes.data.splits import DatasetSplits


@dataclass
class ShardsOptions:
    """How ``--format shards`` writes: bytes per shard, JPEG quality to re-encode at (None: images kept as they are),
    whether an existing dataset at ``--out`` is replaced, and the longest side stored (None: as they are)."""

    shard_bytes: int = 64 * 10**6
    reencode_quality: int | None = None
    overwrite: bool = False
    max_resolution: int | None = None


@dataclass
class ShardsReport:
    """One split after conversion: where, samples, shards and bytes written, seconds."""

    split: str
    address: str
    samples: int
    shards: int
    bytes: int
    seconds: float


class EncodedImages:
    """Index -> (encoded image bytes, label) over a split as a dataset factory built it."""

    def __init__(self, dataset: Dataset, reencode_quality: int | None, max_resolution: int | None = None):
        self.dataset, self.quality, self.max_side = dataset, reencode_quality, max_resolution
        if hasattr(dataset, "samples") and hasattr(dataset, "loader"):  # torchvision ImageFolder: the files
            self.kind, self.count = "files", len(dataset.samples)
        elif hasattr(dataset, "pil_image") and hasattr(dataset, "table"):  # a Hugging Face split: its stored bytes
            from datasets import Image as ImageFeature

            self.kind, self.count = "arrow", len(dataset.labels)
            self.table = dataset.table.cast_column(dataset.image_column, ImageFeature(decode=False))
        elif hasattr(dataset, "images") and hasattr(dataset, "labels"):  # in-memory uint8 CHW images
            self.kind, self.count = "tensors", len(dataset.labels)
        else:
            raise DataError(f"--format shards: a {type(dataset).__name__} holds neither image files nor uint8 images")

    def name(self, index: int) -> str:
        if self.kind == "files":
            return str(self.dataset.samples[index][0])
        return self.dataset.sample_name(index) if self.kind == "arrow" else f"sample {index}"

    def stored(self, index: int) -> tuple[bytes, int]:
        if self.kind == "files":
            path, label = self.dataset.samples[index]
            return Path(path).read_bytes(), int(label)
        label = int(self.dataset.labels[index])
        if self.kind == "arrow":
            cell = self.table[int(index)][self.dataset.image_column]
            return cell.get("bytes") or Path(cell["path"]).read_bytes(), label
        return png(self.dataset.images[index].numpy()), label

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        """The sample's bytes (re-encoded when asked), checked to be an image PIL opens."""
        from PIL import Image

        data, label = self.stored(index)
        try:
            with Image.open(io.BytesIO(data)) as image:
                larger = self.max_side is not None and max(image.size) > self.max_side
                if self.quality is None and not larger:
                    image.verify()
                    return data, label
                image = image.convert("RGB")
                if larger:  # the longer side to max_side, the other in proportion (FFCV's rounding)
                    ratio = self.max_side / max(image.size)
                    image = image.resize(
                        (max(1, int(image.width * ratio)), max(1, int(image.height * ratio))), Image.Resampling.LANCZOS
                    )
                out = io.BytesIO()
                image.save(out, format="JPEG", quality=self.quality or 90)
                return out.getvalue(), label
        except Image.DecompressionBombError as exc:
            from dlrecipes.data.jpeg import bomb_line

            raise DataError(f"image {self.name(index)}: {bomb_line(exc, 'remove it from the source')}") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise DataError(f"unreadable image {self.name(index)} ({exc}); fix or remove it") from None


def png(chw) -> bytes:
    """A uint8 CHW array as a lossless PNG (one channel: greyscale; three: RGB)."""
    from PIL import Image

    hwc = chw.transpose(1, 2, 0)
    out = io.BytesIO()
    Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc).save(out, format="PNG")
    return out.getvalue()


def write_split(source: EncodedImages, folder: Path, shard_bytes: int) -> list[dict]:
    """The split as litdata shards in ``folder``; returns each shard's file, samples and bytes (from litdata's
    index)."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(folder), chunk_bytes=shard_bytes)
    labels = []
    for index in range(source.count):
        data, label = source[index]
        writer[index] = {"image": data, "label": label}
        labels.append(int(label))
    writer.done()
    writer.merge()
    chunks = json.loads((folder / "index.json").read_text())["chunks"]
    shards, start = [], 0
    for c in chunks:  # each shard's label range: a reader checks it against the classes before training
        held = labels[start : start + int(c["chunk_size"])]
        start += int(c["chunk_size"])
        size = (folder / c["filename"]).stat().st_size
        shards.append(
            {"file": c["filename"], "samples": int(c["chunk_size"]), "bytes": size, "labels": [min(held), max(held)]}
        )
    return shards


def existing(place: ShardsPlace) -> bool:
    if place.bucket is not None:
        return place.read(META) is not None
    folder = Path(place.address)
    return folder.exists() and (not folder.is_dir() or any(folder.iterdir()))


# written and deleted before converting: a bucket that will not take it is one line
WRITE_CHECK = ".dlrecipes-write-check"


def write_shards(
    splits: DatasetSplits, out: str, options: ShardsOptions, echo: Callable[[str], None] = print
) -> list[ShardsReport]:
    """Both splits of a built dataset (a :class:`~dlrecipes.data.splits.DatasetSplits`) as shards at ``out``."""
    import_litdata()
    place = ShardsPlace(out, "--out")
    if existing(place) and not options.overwrite:
        raise UserError(f"--out: {place.address} already holds a dataset or files; pass --overwrite to replace it")
    local = Path(place.address) if place.bucket is None else None
    if local is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
    else:
        place.bucket.check_writable(place.key(WRITE_CHECK), "--out")
    with tempfile.TemporaryDirectory(dir=local.parent if local else None, prefix=".shards-partial-") as tmp:
        meta = {"format": FORMAT, "class_names": list(splits.class_names or range(splits.num_classes)), "splits": {}}
        reports = []
        for split, dataset in zip(SPLITS, (splits.train, splits.eval)):
            source, started = (
                EncodedImages(dataset, options.reencode_quality, options.max_resolution),
                time.perf_counter(),
            )
            echo(f"writing {split}: {source.count} images -> {place.url(split)}")
            shards = write_split(source, Path(tmp, split), options.shard_bytes)
            meta["splits"][split] = {"samples": source.count, "shards": shards}
            reports.append(
                ShardsReport(
                    split,
                    place.url(split),
                    source.count,
                    len(shards),
                    sum(s["bytes"] for s in shards),
                    time.perf_counter() - started,
                )
            )
        Path(tmp, META).write_text(json.dumps(meta, indent=1))
        publish(place, Path(tmp), options.overwrite)
    for report in reports:
        echo(
            f"  {report.split}: {report.samples} samples in {report.shards} shards, {report.bytes / 2**20:.1f} MiB, "
            f"{report.seconds:.1f}s"
        )
    echo(f"train from it with dataset.name=shards dataset.remote={place.address}")
    return reports


def publish(place: ShardsPlace, tmp: Path, overwrite: bool) -> None:
    """The written folder made the dataset at ``place``: one rename (a local folder, an old one set aside first), or
    every file uploaded with the index last (a bucket; an old index deleted first, so no reader meets a mixture)."""
    if place.bucket is None:
        target = Path(place.address)
        aside = target.with_name(f".{target.name}.replaced") if target.exists() else None
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
            target.rename(aside)
        (tmp / "done").mkdir()
        for child in list(tmp.iterdir()):
            if child.name != "done":
                child.rename(tmp / "done" / child.name)
        (tmp / "done").rename(target)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return
    backend = place.bucket.backend
    if overwrite and place.read(META) is not None:
        backend.delete(place.key(META), f"--out: replacing the dataset at {place.address}")
    for split in SPLITS:
        for path in sorted((tmp / split).iterdir(), key=lambda p: p.name == "index.json"):
            backend.upload(place.key(split, path.name), str(path))
    backend.upload(place.key(META), str(tmp / META))
