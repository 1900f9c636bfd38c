"""Reading a run's records back, strictly: ``summary.json``, ``history.csv`` and the recorded ``recipe.yaml``.

A run writes each of them whole (by a rename), so a file that does not parse was damaged afterwards
(a disk, a copy, an editor).  Each reader names the file and what is wrong in a
:class:`DamagedRunFile`, one line, instead of passing a half-read record on; a missing file is
``None`` (or no rows), since a run that is still training or stopped early has not written it yet.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from dlrecipes.errors import DataError, UserError
from dlrecipes.recipe import RUN_RECIPE_END, SAFE_LOADER, cut_short
from dlrecipes.records.layout import RunDir


class DamagedRunFile(DataError):
    """A record in a run directory does not read back as what the run wrote."""

    def __init__(self, path: Path, what: str):
        super().__init__(
            f"{path}: {what}; nothing was changed (the run wrote it whole, so it was damaged "
            "since: restore it from a copy)"
        )
        self.path = path


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise DamagedRunFile(path, "is a folder, not a file") from None
    except OSError as exc:
        raise DamagedRunFile(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedRunFile(path, f"is not UTF-8 text (bad byte at offset {exc.start}; {len(data):,} bytes)") from None


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json as a dict, or None when it has none (yet)."""
    path = RunDir(run_dir).summary
    text = _text(path)
    if text is None:
        return None
    if not text.strip():
        raise DamagedRunFile(path, "is empty")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DamagedRunFile(path, f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise DamagedRunFile(path, f"holds a JSON {type(data).__name__}, not the run's summary (an object)")
    return data


def read_history(run_dir: Path, missing_ok: bool = True) -> list[dict[str, float]]:
    """The rows of the run's history.csv, each value a float (an empty cell: NaN); [] when it has none (yet), or,
    without ``missing_ok``, one line saying so (a folder given as a run that is none)."""
    path = RunDir(run_dir).history
    if not missing_ok and not path.exists():
        raise UserError(f"{path} not found: is {run_dir} a dlrecipes run directory?")
    text = _text(path)
    if text is None or not text.strip():
        return []
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    if "epoch" not in header:
        raise DamagedRunFile(path, f"has no epoch column (its first line is {','.join(header)[:80]!r})")
    rows = []
    for line, cells in enumerate(reader, start=2):
        if len(cells) != len(header):
            raise DamagedRunFile(path, f"line {line} has {len(cells)} values for {len(header)} columns (cut short?)")
        try:
            rows.append({k: float(v) if v != "" else math.nan for k, v in zip(header, cells)})
        except ValueError:
            bad = next(v for v in cells if v != "" and not _is_number(v))
            raise DamagedRunFile(path, f"line {line} holds {bad[:40]!r} where a number belongs") from None
    return rows


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_recipe(run_dir: Path) -> dict[str, Any] | None:
    """The resolved recipe the run recorded, or None when it has none."""
    import yaml

    path = RunDir(run_dir).recipe
    text = _text(path)
    if text is None:
        return None
    if cut_short(text):
        raise DamagedRunFile(path, f"is cut short (it stops before its last line, {RUN_RECIPE_END.strip()!r})")
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - safe_load's loader, libyaml's parser
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DamagedRunFile(path, f"is not valid YAML{where}") from None
    if data is None:
        raise DamagedRunFile(path, "is empty")
    if not isinstance(data, dict):
        raise DamagedRunFile(path, f"holds a {type(data).__name__}, not the run's recipe (a mapping of sections)")
    return data


def file_digest(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, hex (best.json records best.pt's: readers check that they belong together)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_best_record(run: RunDir, refuse: bool = True) -> None:
    """``best.pt`` is the file ``best.json`` describes (its SHA-256, where the run recorded one): a bucket's upload that
    was cut off, or landed out of order, leaves a best.json of one evaluation beside the best.pt of another, and
    evaluating it would report the wrong weights. One line when they differ; without ``refuse`` (the user vouches
    for the file: ``--trust-checkpoint``) a note, and the file is used."""
    text = _text(run.best_info)
    if text is None:
        return
    try:
        info = json.loads(text)
    except ValueError:
        raise DamagedRunFile(run.best_info, "is not JSON") from None
    recorded = info.get("sha256") if isinstance(info, dict) else None
    if not isinstance(recorded, str) or file_digest(run.best) == recorded:
        return
    what = (
        f"{run.best}: not the best checkpoint {run.best_info.name} describes (epoch {info.get('epoch')}, batch "
        f"{info.get('batch')}: another file, as an upload cut off or landed out of order leaves)"
    )
    if not refuse:
        import sys

        print(f"note: {what}; used as given (--trust-checkpoint)", file=sys.stderr)
        return
    raise DataError(f"{what}; resume the run (--resume) to upload its own, or give --checkpoint latest")


__all__ = ["DamagedRunFile", "check_best_record", "file_digest", "read_history", "read_recipe", "read_summary"]
