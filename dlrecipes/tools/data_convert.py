"""``dlrecipes data convert``: a registered dataset's splits written as FFCV ``.beton`` files, as the
tensor cache that ``trainer.loader: tensor_cache`` reads (``--format tensor_cache``), or as dataset shards that
``dataset: {name: shards}`` streams from a bucket or a folder (``--format shards``).

The recipe-level steps (plugins, validating the dataset's parameters, building it) are here; writing and reading the
files is :mod:`dlrecipes.data.ffcv.files`, :mod:`dlrecipes.data.tensor_cache` and :mod:`dlrecipes.data.shards.write`
(each imported only for its format: FFCV need not be installed to write the tensor cache).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes import registry
from dlrecipes.builders import build_datasets
from dlrecipes.config import COMPONENT_SECTIONS, check_component
from dlrecipes.data.ffcv.files import ConvertOptions, ConvertReport, RawImages, write_beton
from dlrecipes.errors import UserError
from dlrecipes.plugins import load_all

if TYPE_CHECKING:
    from dlrecipes.config.sections import Component
    from dlrecipes.data.shards.write import ShardsOptions, ShardsReport

CONVERT_FORMATS = ("ffcv", "tensor_cache", "shards")  # FFCV .beton files; trainer.loader=tensor_cache's cache; shards


@dataclass
class CacheOptions:
    """How ``--format tensor_cache`` writes: the cached images' side (``trainer.cache_size``; None: the dataset's
    ``resize_size``), decoding processes (-1: all cores), and whether an up-to-date cache is rebuilt."""

    cache_size: int | None = None
    num_workers: int = -1
    overwrite: bool = False


@dataclass
class CacheReport:
    """One split's tensor cache after ``data convert``: where, what it holds, and whether it was written now."""

    split: str
    images: Path
    samples: int
    classes: int  # distinct labels in the split
    size: int
    bytes: int  # the images', labels' and fingerprint's files together
    seconds: float
    written: bool  # False: it was up to date and left as it was


FORMAT_OPTIONS = {
    "ffcv": ("max_resolution", "write_mode", "jpeg_quality", "compress_probability", "page_size", "skip_bad"),
    "tensor_cache": ("cache_size",),
    "shards": ("shard_size", "reencode_quality", "max_resolution"),
}


def options_of_other_format(format: str, given: Sequence[str]) -> None:
    """One line for an option given on the command line that only the other format reads (it would be ignored)."""
    for other, names in FORMAT_OPTIONS.items():
        wrong = [name for name in names if name in given and name not in FORMAT_OPTIONS.get(format, ())]
        if format in FORMAT_OPTIONS and other != format and wrong:
            option = "--" + wrong[0].replace("_", "-")
            raise UserError(
                f"{option}: only with --format {other}; --format {format} reads "
                f"{', '.join('--' + n.replace('_', '-') for n in FORMAT_OPTIONS[format])}, --out, "
                "--workers and --overwrite"
            )


def convert_dataset(
    dataset: str,
    params: dict[str, Any],
    out_dir: str | Path | None,
    options: ConvertOptions | CacheOptions | None,
    echo: Callable[[str], None] = print,
    format: str = "ffcv",
) -> list[ConvertReport] | list[CacheReport]:
    """Write a registered dataset's train and eval splits to ``out_dir/{train,val}.beton`` (``format="ffcv"``), or
    as the tensor cache in ``out_dir`` (default: where ``trainer.loader: tensor_cache`` looks for it)."""
    if format not in CONVERT_FORMATS:
        raise UserError(
            f"--format: expected {', '.join(CONVERT_FORMATS[:-1])} or {CONVERT_FORMATS[-1]}, got {format!r}"
        )
    load_all()
    component = check_component({"name": dataset, **params}, "dataset", COMPONENT_SECTIONS["dataset"])
    if format == "tensor_cache":
        return write_tensor_cache(component, out_dir, options or CacheOptions(), echo)
    if format == "shards":
        return write_shards(component, out_dir, options, echo)
    if out_dir is None:
        raise UserError("--out: give the folder for train.beton and val.beton")
    options = options or ConvertOptions()
    out_dir = Path(out_dir)
    targets = {"train": out_dir / "train.beton", "val": out_dir / "val.beton"}
    existing = [str(p) for p in targets.values() if p.exists()]
    if existing and not options.overwrite:
        raise UserError(f"{', '.join(existing)} already exist(s); pass --overwrite to replace")
    splits = build_datasets(component)
    reports = []
    for split, dataset_obj in (("train", splits.train), ("val", splits.eval)):
        source = RawImages(dataset_obj)
        echo(f"writing {split}: {len(source)} images -> {targets[split]}")
        report = write_beton(source, targets[split], options, class_names=splits.class_names)
        for path, error in report.skipped:
            echo(f"  skipped unreadable image {path}: {error}")
        echo(f"  {report.samples} samples written, {len(report.skipped)} skipped, {report.seconds:.1f}s")
        reports.append(report)
    return reports


def write_tensor_cache(
    component, out_dir: str | Path | None, options: CacheOptions, echo: Callable[[str], None] = print
) -> list[CacheReport]:
    """Both splits' tensor caches, where and as training with ``trainer.loader: tensor_cache`` (``trainer.cache_dir``
    = ``out_dir``, ``trainer.cache_size`` = ``options.cache_size``) looks for them; one up to date is kept."""
    from dlrecipes.data.tensor_cache import (
        build_cache,
        cache_files,
        cache_is_current,
        cache_location,
        cache_split,
        image_source,
    )

    if not registry.datasets.get(component.name).metadata.get("pil_images"):
        usable = ", ".join(e.name for e in registry.datasets if e.metadata.get("pil_images"))
        raise UserError(
            f"--format tensor_cache: the tensor cache decodes datasets of PIL images ({usable}); "
            f"'{component.name}' has none (use --format ffcv, or train it with trainer.loader=device or torch)"
        )
    splits = build_datasets(component)
    out_dir = Path(out_dir).resolve() if out_dir is not None else None  # trainer.cache_dir: from the working directory
    workers = options.num_workers if options.num_workers > 0 else os.cpu_count() or 1
    reports = []
    for train, dataset in ((True, splits.train), (False, splits.eval)):
        source, split, started = image_source(dataset), cache_split(train), time.perf_counter()
        cache_dir, size = cache_location(dataset, out_dir, options.cache_size, splits.augment["resize_size"])
        images = cache_files(cache_dir, split, size)["images"]
        written = options.overwrite or not cache_is_current(source, cache_dir, split, size)
        if written:
            echo(f"caching {split}: {len(source)} images -> {images}")
            build_cache(source, cache_dir, split, size, workers, rebuild=True)
        else:
            echo(f"{split}: {images} is up to date (--overwrite rebuilds it)")
        report = _cache_report(split, cache_dir, size, time.perf_counter() - started, written)
        echo(
            f"  {report.samples} samples, {report.classes} classes, {size}x{size} RGB uint8, {_amount(report.bytes)}"
            + (f", {report.seconds:.1f}s" if written else "")
        )
        reports.append(report)
    hint = ["trainer.loader=tensor_cache"] + [f"trainer.cache_dir={out_dir}"] * (out_dir is not None)
    echo(
        "train from it with " + " ".join(hint + [f"trainer.cache_size={options.cache_size}"] * bool(options.cache_size))
    )
    return reports


def convert_options(format: str, values: dict, given: Sequence[str]) -> ConvertOptions | CacheOptions | ShardsOptions:
    """The options ``data convert --format FORMAT`` writes with, from the command's ``values`` (one line for an option
    of another format among ``given``, the options named on the command line, or a value out of range)."""
    if values["write_mode"] not in ("smart", "jpg", "raw", "proportion"):
        raise UserError(f"--write-mode: expected smart, jpg, raw or proportion, got {values['write_mode']!r}")
    options_of_other_format(format, given)
    if format == "shards":
        return shards_options(
            values["shard_size"], values["reencode_quality"], values["overwrite"], values["max_resolution"]
        )
    if format == "tensor_cache":
        return CacheOptions(values["cache_size"], values["workers"], values["overwrite"])
    resolution = values["max_resolution"]
    return ConvertOptions(
        max_resolution=256 if resolution is None else resolution or None,
        write_mode=values["write_mode"],
        jpeg_quality=values["jpeg_quality"],
        compress_probability=values["compress_probability"],
        page_size=values["page_size"],
        num_workers=values["workers"],
        overwrite=values["overwrite"],
        skip_bad=values["skip_bad"],
    )


def shards_options(
    shard_size: str, reencode_quality: int | None, overwrite: bool, max_resolution: int | None = None
) -> ShardsOptions:
    """``--format shards``' options, checked (one line for a size that is none, a quality outside 1-100, a negative
    resolution); ``max_resolution`` 0 or None: images kept at their size."""
    from dlrecipes.data.shards.dataset import parse_bytes
    from dlrecipes.data.shards.write import ShardsOptions

    if reencode_quality is not None and not 1 <= reencode_quality <= 100:
        raise UserError(f"--reencode-quality: expected a JPEG quality from 1 to 100, got {reencode_quality}")
    if max_resolution is not None and max_resolution < 0:
        raise UserError(
            f"--max-resolution: expected a side in pixels (0: images kept at their size), got {max_resolution}"
        )
    return ShardsOptions(parse_bytes(shard_size, "--shard-size"), reencode_quality, overwrite, max_resolution or None)


def write_shards(
    component: Component, out: str | Path | None, options: ShardsOptions | None, echo: Callable[[str], None] = print
) -> list[ShardsReport]:
    """Both splits as dataset shards at ``out`` (a local folder or ``s3://BUCKET/PREFIX``; ``options``: a
    :class:`dlrecipes.data.shards.write.ShardsOptions`)."""
    from dlrecipes.data.shards.write import ShardsOptions
    from dlrecipes.data.shards.write import write_shards as write

    if out is None:
        raise UserError("--out: give where the shards go: a local folder or s3://BUCKET/PREFIX")
    return write(build_datasets(component), str(out), options or ShardsOptions(), echo)


def _cache_report(split: str, cache_dir: Path, size: int, seconds: float, written: bool) -> CacheReport:
    import numpy as np

    from dlrecipes.data.tensor_cache import cache_files

    files = cache_files(cache_dir, split, size)
    labels = np.load(files["labels"])
    return CacheReport(
        split,
        files["images"],
        len(labels),
        len(np.unique(labels)),
        size,
        sum(p.stat().st_size for p in files.values()),
        seconds,
        written,
    )


def _amount(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def format_beton(info: dict[str, Any]) -> str:
    """``data inspect``'s view of a .beton file (the dict of :func:`dlrecipes.data.ffcv.files.inspect_beton`)."""
    res = info["resolution"]
    lines = [
        f"{info['path']}: {info['samples']} samples",
        f"fields: {', '.join(f'{k} ({v})' for k, v in info['fields'].items())}",
    ]
    for side in ("height", "width"):
        r = res[side]
        lines.append(f"{side}: min {r['min']}, median {r['median']:g}, max {r['max']}")
    lines.append(f"stored as: {info['stored_as']['jpg']} JPEG, {info['stored_as']['raw']} raw")
    names = info.get("class_names")
    counts = ", ".join(f"{names[k] if names else k}: {v}" for k, v in info["classes"].items())
    lines.append(f"classes ({len(info['classes'])}): {counts}")
    return "\n".join(lines)
