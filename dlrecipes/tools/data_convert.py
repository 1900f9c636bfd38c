"""``dlrecipes data convert``: a registered dataset's splits written as FFCV ``.beton`` files.

The recipe-level steps (plugins, validating the dataset's parameters, building it) are here;
writing and reading the files is :mod:`dlrecipes.data.ffcv_files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dlrecipes.builders import build_datasets
from dlrecipes.config import COMPONENT_SECTIONS, check_component
from dlrecipes.data.ffcv_files import ConvertOptions, ConvertReport, RawImages, write_beton
from dlrecipes.errors import UserError
from dlrecipes.plugins import load_all


def convert_dataset(
    dataset: str, params: dict[str, Any], out_dir: str | Path, options: ConvertOptions, echo: Callable[[str], None] = print
) -> list[ConvertReport]:
    """Write a registered dataset's train and eval splits to ``out_dir/{train,val}.beton``."""
    load_all()
    component = check_component({"name": dataset, **params}, "dataset", COMPONENT_SECTIONS["dataset"])
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


def format_beton(info: dict[str, Any]) -> str:
    """``data inspect``'s view of a .beton file (the dict of :func:`dlrecipes.data.ffcv_files.inspect_beton`)."""
    res = info["resolution"]
    lines = [f"{info['path']}: {info['samples']} samples",
             f"fields: {', '.join(f'{k} ({v})' for k, v in info['fields'].items())}"]
    for side in ("height", "width"):
        r = res[side]
        lines.append(f"{side}: min {r['min']}, median {r['median']:g}, max {r['max']}")
    lines.append(f"stored as: {info['stored_as']['jpg']} JPEG, {info['stored_as']['raw']} raw")
    names = info.get("class_names")
    counts = ", ".join(f"{names[k] if names else k}: {v}" for k, v in info["classes"].items())
    lines.append(f"classes ({len(info['classes'])}): {counts}")
    return "\n".join(lines)
