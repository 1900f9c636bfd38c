"""A run's records as pandas DataFrames (the ``notebook`` extra): history.csv, and tables of runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlrecipes.errors import UserError
from dlrecipes.records.layout import RunDir


def pandas():
    """pandas, or one line saying how to install it."""
    try:
        import pandas
    except ImportError:
        raise UserError("pandas is not installed: pip install 'dlrecipes[notebook]' (or pip install pandas)") from None
    return pandas


def history_frame(run_dir: str | Path):
    """history.csv as a DataFrame: one row per epoch, its columns as written."""
    path = RunDir(Path(run_dir)).history
    if not path.is_file():
        raise UserError(f"{path} not found: is {run_dir} a dlrecipes run directory?")
    return pandas().read_csv(path)


def table_frame(rows: Sequence[dict[str, Any]], index: str | None = None):
    """Rows of dicts (``runs``, ``compare``) as a DataFrame; nested values (a comparison's ``settings``) become
    columns of their own."""
    pd = pandas()
    flat = []
    for row in rows:
        row = dict(row)
        settings = row.pop("settings", None) or {}
        flat.append({**row, **settings})
    frame = pd.DataFrame(flat)
    return frame.set_index(index) if index and index in frame.columns else frame
