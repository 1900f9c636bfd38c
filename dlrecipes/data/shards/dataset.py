"""Dataset shards (litdata's format) read from a local folder or a bucket: a map-style dataset per split whose
samples are read by index from their shards, a bucket's through this node's cache of whole shards
(:mod:`dlrecipes.data.shards.cache`: dlrecipes's own reader and eviction, kept within the cache limit), decoded by
libjpeg-turbo (PIL where a step on PIL images was added) and transformed as image folders are.

A shards dataset (written by ``dlrecipes data convert SOURCE --format shards --out DEST``,
:mod:`dlrecipes.data.shards.write`) is ``DEST/train/`` and ``DEST/val/`` (litdata's ``chunk-*.bin`` shards and its
``index.json``) and ``DEST/dlrecipes-shards.json`` (class names; each split's shards: file, samples, bytes), written
last: a dataset without it was not written to the end and is refused.

Bad input is one line (a :class:`~dlrecipes.errors.DataError`, exit 2): an address without a shards dataset, wrong
credentials (asked once of the bucket before anything is built), a shard shorter than its index says or that cannot be
read (named, with its samples), a cache limit smaller than one shard or than the shards the loaders read at once
(:meth:`ShardsDataset.check_cache`), a bucket that stops answering (a shard waited for ``DLRECIPES_BUCKET_STALL``
seconds without a byte, a minute by default, then the line), a cache folder that is full or cannot be written.
The dataset's own files are data: litdata's
``index.json`` of each split and ``dlrecipes-shards.json`` are checked against each other before any sample is read
(:func:`check_index`, :func:`check_meta_counts`): no object format that runs code as it is read, no shard name that
leads out of its split, no count the two disagree on.
"""

from __future__ import annotations

import io
import json
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.data.shards.cache import SHARD_NAME, Damaged, ShardCache, check_room, read_from, samples_in_flight
from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import DataError, UserError, first_line, shown

if TYPE_CHECKING:
    from dlrecipes.config.sections import TrainerConfig

META = "dlrecipes-shards.json"  # written last: its presence says the conversion finished
SPLITS = ("train", "val")
FORMAT = {"library": "litdata", "version": 1}
INSTALL_HINT = "pip install 'dlrecipes[shards]' (litdata)"
UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_bytes(value: Any, key_path: str) -> int:
    """``value`` as bytes: an integer, or a string such as ``"10GB"``, ``"512MiB"`` (one line when it is neither)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    text = str(value).strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number) :]
    try:
        amount = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        amount = 0
    if amount < 1:
        raise UserError(
            f"{key_path}: {value!r} is no size: give bytes (an integer) or a number with a unit, such as "
            "10GB, 512MB or 2GiB"
        )
    return int(amount)


def import_litdata():
    try:
        import litdata
    except ImportError as exc:
        raise UserError(f"dataset shards need litdata: {INSTALL_HINT} ({exc})") from None
    return litdata


class ShardsPlace:
    """Where a shards dataset is: a local folder, or a bucket (credentials and endpoint as ``runs_dir`` takes
    them: :func:`dlrecipes.records.store.dataset_bucket`)."""

    def __init__(self, address: str, key_path: str):
        from dlrecipes.records.store import dataset_bucket

        self.address, self.key_path = str(address).rstrip("/"), key_path
        self.bucket = dataset_bucket(self.address, key_path)

    def refused(self, exc: BaseException) -> UserError:
        """The one line for a bucket that refused a read (wrong credentials, most often)."""
        code = str(((getattr(exc, "response", None) or {}).get("Error") or {}).get("Code", ""))
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return UserError(
                f"{self.key_path}: {self.address}: access denied with the credentials found ({code}; check "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
            )
        first = first_line(exc, 200, "")
        return UserError(f"{self.key_path}: {self.address}: the bucket refused a read ({type(exc).__name__}: {first})")

    def url(self, *parts: str) -> str:
        return "/".join([self.address, *parts])

    def key(self, *parts: str) -> str:
        return self.bucket.root.key(*parts)

    def read(self, name: str) -> bytes | None:
        if self.bucket is not None:
            try:
                return self.bucket.backend.read(self.key(name))
            except Exception as exc:  # botocore's ClientError and the like, answered by the bucket
                raise self.refused(exc) from None
        path = Path(self.address, name)
        return path.read_bytes() if path.is_file() else None

    def sizes(self, split: str) -> dict[str, int]:
        """Each file of a split with its size."""
        if self.bucket is not None:
            try:
                listed = self.bucket.backend.listing(self.key(split) + "/")
            except Exception as exc:  # as read's
                raise self.refused(exc) from None
            return {name: size for name, (size, _) in listed.items()}
        folder = Path(self.address, split)
        return {p.name: p.stat().st_size for p in folder.iterdir()} if folder.is_dir() else {}

    def storage_options(self) -> dict:
        return {"endpoint_url": self.bucket.endpoint} if self.bucket is not None and self.bucket.endpoint else {}


def read_meta(place: ShardsPlace) -> dict:
    """The dataset's ``dlrecipes-shards.json``; one line when there is none (nothing there, or a conversion that did
    not finish) or it is not one."""
    data = place.read(META)
    if data is None:
        raise DataError(
            f"{place.key_path}: no shards dataset at {place.address} ({META} missing: nothing was "
            "converted there, or the conversion did not finish; write it with dlrecipes data convert "
            "SOURCE --format shards --out ADDRESS)"
        )
    try:
        meta = json.loads(data)
        assert meta["format"]["library"] == FORMAT["library"] and all(meta["splits"][s]["shards"] for s in SPLITS)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise DataError(
            f"{place.key_path}: {place.url(META)} is not a dlrecipes shards index; convert the dataset again"
        ) from None
    return meta


INDEX = "index.json"  # litdata's index of a split's shards, which its reader follows
DATA_FORMATS = (["bytes", "int"],)  # how write_split stores a sample: the image file's bytes, its label
MOST_SAMPLES = 10**9  # per shard: a count beyond it is no count a dataset of images has


def check_index(place: ShardsPlace, split: str, shards: Sequence[dict]) -> None:
    """The split's ``index.json`` (litdata's own index) checked as data against ``dlrecipes-shards.json``
    before anything reads a sample: its samples stored as dlrecipes writes them (an image's bytes and an int label;
    litdata's ``pickle`` and other object formats would run code as each sample is read), no compression or
    encryption, and exactly the shards ``dlrecipes-shards.json`` lists (plain names, in order: no ``..``, no
    absolute path, nothing outside the split's folder or prefix), each with the samples it counts. Anything else is
    one line naming the file (:class:`~dlrecipes.errors.DataError`)."""
    where = place.url(split, INDEX)
    data = place.read(f"{split}/{INDEX}")
    try:
        index = json.loads(data) if data is not None else None
        config, chunks = index["config"], index["chunks"]
        listed = [(str(c["filename"]), c["chunk_size"]) for c in chunks]
    except (ValueError, KeyError, TypeError):
        raise DataError(
            f"{place.key_path}: {where} is {'missing' if data is None else 'not a litdata index'}: the dataset is "
            "damaged; convert it again"
        ) from None
    problem = None
    if config.get("data_format") not in DATA_FORMATS:
        problem = (
            f"its samples are stored as {shown(config.get('data_format'))}, not as dlrecipes writes them "
            f"({DATA_FORMATS[0]}: an image's bytes and its label); other formats, pickle among them, can run code as "
            "they are read"
        )
    elif config.get("compression") or config.get("encryption") or config.get("item_loader") != "PyTreeLoader":
        problem = "its shards are compressed, encrypted or read by another loader, which dlrecipes never writes"
    else:
        bad = next((name for name, _ in listed if not SHARD_NAME.fullmatch(name)), None)
        if bad is not None:
            problem = f"it names the shard {shown(bad)}, which is no shard file name (chunk-N-N.bin)"
        elif [(name, count) for name, count in listed] != [(s["file"], s["samples"]) for s in shards]:
            problem = f"its shards or their sample counts are not those {META} lists"
    if problem is not None:
        raise DataError(
            f"{place.key_path}: {where}: {problem}; refused before any sample was read (convert the dataset again "
            "with dlrecipes data convert)"
        )


def check_meta_counts(place: ShardsPlace, meta: dict) -> None:
    """``dlrecipes-shards.json``'s names and counts are data too: each shard a plain name with a whole number of
    samples from 1 to its bytes (one line for 1e12, -3 or a path), and the class names a list of strings."""
    classes = meta.get("class_names")
    ok = isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)
    for split in SPLITS if ok else ():
        for shard in meta["splits"][split]["shards"]:
            samples, size = shard.get("samples"), shard.get("bytes")
            ok = ok and isinstance(shard.get("file"), str) and SHARD_NAME.fullmatch(shard["file"]) is not None
            ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in (samples, size))
            ok = ok and 1 <= samples <= min(size, MOST_SAMPLES)
    if not ok:
        raise DataError(
            f"{place.key_path}: {place.url(META)} holds a shard name, a count or class names no conversion "
            "writes; convert the dataset again"
        )


def check_labels(place: ShardsPlace, meta: dict) -> None:
    """Each shard's label range, where the conversion recorded it (``labels``: [lowest, highest]), within the
    dataset's classes, in both splits, before anything is trained: one line naming the shard."""
    classes = len(meta["class_names"])
    for split in SPLITS:
        start = 0
        for shard in meta["splits"][split]["shards"]:
            end, held = start + shard["samples"], shard.get("labels")
            plain = isinstance(held, list) and len(held) == 2 and all(type(v) is int for v in held)
            if held is not None and not (plain and 0 <= held[0] <= held[1] < classes):
                raise DataError(
                    f"{place.key_path}: shard {place.url(split, shard['file'])} (samples {start}-{end - 1} of "
                    f"{split}) holds labels {_brief(held)}, outside the dataset's {classes} classes (0-{classes - 1}); "
                    "convert the dataset again"
                )
            start = end


def _brief(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, list) or len(value) != 2 else f"{value[0]}-{value[1]}"
    return text if len(text) <= 40 else text[:37] + "..."


def check_shards(place: ShardsPlace, split: str, shards: Sequence[dict], cache_limit: int | None) -> None:
    """One line for a shard missing or not of the size its index says (truncated or replaced: named, with its
    samples), and for a cache limit smaller than the largest shard."""
    found, start = place.sizes(split), 0
    for shard in shards:
        end = start + shard["samples"]
        size = found.get(shard["file"])
        if size != shard["bytes"]:
            what = "is missing" if size is None else f"is {size:,} bytes where its index says {shard['bytes']:,}"
            raise DataError(
                f"{place.key_path}: shard {place.url(split, shard['file'])} (samples {start}-{end - 1} of "
                f"{split}) {what}: truncated or damaged; convert the dataset again"
            )
        start = end
    largest = max(shard["bytes"] for shard in shards)
    if cache_limit is not None and place.bucket is not None and cache_limit < largest:
        raise DataError(
            f"dataset.cache_limit: {cache_limit:,} bytes is smaller than one shard of {place.address} "
            f"({largest:,} bytes, {split}); give at least {largest:,} (a few shards' worth streams better)"
        )


class ShardsDataset:
    """One split: ``len()`` samples, ``dataset[i] -> (image tensor, label)`` read from its shard (a local dataset's
    where it is; a bucket's through this node's :class:`~dlrecipes.data.shards.cache.ShardCache`, whole shards kept
    within ``cache_limit``); ``shard_sizes``: samples per shard, in index order (a sampler can visit shards whole)."""

    def __init__(
        self,
        place: ShardsPlace,
        split: str,
        shards: Sequence[dict],
        transform: Callable | None,
        cache_dir: str | None,
        cache_limit: int | None,
    ):
        self.url, self.split, self.key_path = place.url(split), split, place.key_path
        self.shards = [dict(shard) for shard in shards]
        self.shard_sizes = [int(shard["samples"]) for shard in shards]
        self.starts = [0, *accumulate(self.shard_sizes)]
        self.transform = transform  # the torchvision convention: Composer's RandAugment/AugMix insert theirs here
        self.pil_steps = len(getattr(transform, "transforms", ()))
        self.bucket, self.cache = place.bucket, None
        if self.bucket is not None and cache_dir is not None and cache_limit is not None:
            folder = str(Path(cache_dir, split))
            self.cache = ShardCache(folder, cache_limit, self.fetch, self.bucket.stall, self.cache_identity())
        self.tables: dict = {}  # a local dataset's shard tables, read once per process
        self.num_classes: int | None = None  # set by build_shards: each label read is checked against it

    def __len__(self) -> int:
        return self.starts[-1]

    def cache_identity(self) -> str:
        """What a cache folder of this split must hold: its address and shards (a folder that holds another's is
        emptied first: :class:`~dlrecipes.data.shards.cache.ShardCache`)."""
        return json.dumps({"dataset": self.url, "shards": self.shards}, sort_keys=True)

    def __getstate__(self) -> dict:  # a DataLoader worker (spawned) reads each shard's table again
        return {**self.__dict__, "tables": {}}

    def shard_of(self, index: int) -> tuple[str, int, int]:
        """The shard holding sample ``index``: its address and its first and last sample."""
        k = bisect_right(self.starts, index) - 1
        return f"{self.url}/{self.shards[k]['file']}", self.starts[k], self.starts[k + 1] - 1

    def fetch(self, name: str, path: str) -> None:
        """Shard ``name`` of a bucket's split downloaded to ``path`` (the bucket's client made once per process)."""
        if not self.bucket.download(self.bucket.root.key(self.split, name), path):
            raise Damaged("it is no longer in the bucket")

    def raw(self, index: int) -> tuple[bytes, int]:
        """Sample ``index``'s stored image bytes and label."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        k = bisect_right(self.starts, index) - 1
        shard, at = self.shards[k], index - self.starts[k]
        try:
            if self.cache is not None:
                data, label = self.cache.sample(shard["file"], shard["bytes"], shard["samples"], at)
            else:
                fd = os.open(Path(self.url, shard["file"]), os.O_RDONLY)
                try:
                    data, label = read_from(self.tables, fd, shard["file"], shard["bytes"], shard["samples"], at)
                finally:
                    os.close(fd)
        except (Damaged, OSError) as exc:  # bytes not what the index says, or a local shard gone
            raise self.damaged(index, exc) from None
        except UserError as exc:
            if self.bucket is None or not self.bucket.stalled(exc):
                raise
            shard_url, first, last = self.shard_of(index)
            raise DataError(
                f"{self.key_path}: shard {shard_url} (samples {first}-{last} of {self.split}) did not arrive within "
                f"{self.bucket.stall():.0f} s: {self.bucket.server} stopped answering; the run's checkpoints are "
                "kept: --resume when it answers again"
            ) from None
        if self.num_classes is not None and not 0 <= label < self.num_classes:
            raise DataError(
                f"{self.where(index)}: its label is {label}, outside the dataset's {self.num_classes} classes "
                f"(0-{self.num_classes - 1}); convert the dataset again"
            )
        return data, label

    def check_cache(self, span: int, shuffled: bool) -> None:
        """One line when the cache limit cannot hold the shards ``span`` consecutive samples of this split's order
        fall in (:func:`~dlrecipes.data.shards.cache.check_room`)."""
        if self.cache is not None:
            check_room(self.shards, self.cache.limit, span, shuffled, self.split)

    def where(self, index: int) -> str:
        """Sample ``index`` in an error line: its shard and the shard's samples."""
        shard, first, last = self.shard_of(index)
        return (
            f"{self.key_path}: shard {shard} (samples {first}-{last} of {self.split}) cannot be read at sample {index}"
        )

    def damaged(self, index: int, exc: BaseException) -> DataError:
        from PIL import Image

        from dlrecipes.data.jpeg import bomb_line, damaged_in_shard

        if isinstance(exc, Image.DecompressionBombError):
            return DataError(f"{self.where(index)}: {bomb_line(exc, 'convert the dataset again without it')}")
        reason = first_line(exc, 160)
        return damaged_in_shard(self.where(index), f"{type(exc).__name__}: {reason}")

    turbo = (
        None  # a transform of the stored bytes (dlrecipes.data.jpeg, device_decode): while ``transform`` is as built
    )
    device_decode = None  # decode: device: (size, mean, std, bad_images, key) of the batches' decoder

    def __getitem__(self, index: int):
        from PIL import Image

        data, label = self.raw(index)
        if self.turbo is not None and len(getattr(self.transform, "transforms", ())) == self.pil_steps:
            try:
                sample = self.turbo(data)
            except (OSError, Image.DecompressionBombError) as exc:
                raise self.damaged(index, exc) from None
            if isinstance(sample, dict):  # decoded later, on the device: where it is, for the line if it cannot be
                sample["shard_sample"] = self.where(index)
            return sample, label
        try:
            with Image.open(io.BytesIO(data)) as opened:
                image = opened.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise self.damaged(index, exc) from None
        return (self.transform(image) if self.transform is not None else image), label


def check_cache_room(place: ShardsPlace, meta: dict, limit: int, trainer: TrainerConfig) -> None:
    """validate's check of the cache limit against what the recipe's loaders read at once (training checks it as it
    builds them)."""
    spans = samples_in_flight(trainer.batch_size, trainer.eval_batch_size or trainer.batch_size, trainer.num_workers)
    for split in SPLITS if place.bucket is not None else ():
        check_room(meta["splits"][split]["shards"], limit, *spans[split], split)


def open_shards(remote: str, cache_limit: Any) -> tuple[ShardsPlace, dict, int]:
    """The shards at ``remote``: where they are, their ``dlrecipes-shards.json`` and the cache's limit in bytes, each
    split's shards checked against it."""
    limit = parse_bytes(cache_limit, "dataset.cache_limit")
    place = ShardsPlace(remote, "dataset.remote")
    meta = read_meta(place)
    check_meta_counts(place, meta)
    check_labels(place, meta)
    for split in SPLITS:
        check_shards(place, split, meta["splits"][split]["shards"], limit)
        check_index(place, split, meta["splits"][split]["shards"])
    return place, meta, limit


def build_shards(
    remote: str,
    cache_dir: str | None,
    cache_limit: Any,
    crop_size: int,
    resize_size: int,
    eval_crop_size: int | None,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
    decode: str = "turbo",
) -> DatasetSplits:
    """Both splits of the shards dataset at ``remote``, with image folders' transforms, decoding (``decode``: turbo,
    device or pil, as image folders') and preprocessing."""
    from dlrecipes.data.preprocess import preprocess_spec
    from dlrecipes.data.transforms import crop_settings, imagenet_transforms

    place, meta, limit = open_shards(remote, cache_limit)
    cache_dir = cache_dir or str(default_cache_dir(place))
    eval_crop_size = eval_crop_size or crop_size

    def dataset(split: str) -> ShardsDataset:
        size = crop_size if split == "train" else eval_crop_size
        transform = imagenet_transforms(size, resize_size, min_scale, hflip, mean, std, train=split == "train")
        return ShardsDataset(place, split, meta["splits"][split]["shards"], transform, cache_dir, limit)

    made = {split: dataset(split) for split in SPLITS}
    for split in SPLITS:
        made[split].num_classes = len(meta["class_names"])
    set_decoding(
        made["train"], made["val"], decode, crop_size, eval_crop_size, resize_size, min_scale, hflip, mean, std
    )
    classes = list(meta["class_names"])
    return DatasetSplits(
        train=made["train"],
        eval=made["val"],
        num_classes=len(classes),
        input_shape=(len(mean), crop_size, crop_size),
        class_names=classes,
        augment=crop_settings(crop_size, eval_crop_size, resize_size, min_scale, hflip, mean, std),
        preprocess=preprocess_spec(
            "RGB", mean, std, shorter_side=resize_size, center_crop=(eval_crop_size, eval_crop_size)
        ),
    )


def set_decoding(
    train: ShardsDataset,
    val: ShardsDataset,
    decode: str,
    crop_size: int,
    eval_crop_size: int,
    resize_size: int,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> None:
    """Each split decoded as image folders are: by libjpeg-turbo in the workers (``turbo``), in batches on the
    training device after the workers drew the crops (``device``), or by PIL (``pil``, the transforms as built)."""
    from dlrecipes.data.device_decode import split_decoder

    train.turbo = split_decoder(decode, True, crop_size, resize_size, min_scale, hflip, mean, std)
    val.turbo = split_decoder(decode, False, eval_crop_size, resize_size, min_scale, hflip, mean, std)
    if decode == "device":
        train.device_decode = (crop_size, mean, std, "fail", "dataset.remote")
        val.device_decode = (eval_crop_size, mean, std, "fail", "dataset.remote")


def default_cache_dir(place: ShardsPlace) -> Path:
    """``~/.cache/dlrecipes/shards/BUCKET/PREFIX`` (a bucket's dataset; a local one is read where it is)."""
    if place.bucket is None:
        return Path(place.address)
    return Path.home() / ".cache" / "dlrecipes" / "shards" / place.bucket.root.local_part()
