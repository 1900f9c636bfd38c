"""Past runs: one row per run directory under a runs folder (``dlrecipes runs``), newest first.

Everything comes from files a run writes whole (each by a rename): ``recipe.yaml`` at the start,
``history.csv`` per epoch, ``summary.json`` at the end (its status: finished, pruned, stopped, diverged,
failed), ``checkpoints/`` and ``run.lock`` (who trains in it now).  A run whose lock names a live
process is running; one with no summary and no live holder was killed (resumable when it has a
checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dlrecipes.core.addresses import RUNS_DIR
from dlrecipes.errors import UserError
from dlrecipes.records import run_files
from dlrecipes.records.layout import RECIPE_FILE, RunDir
from dlrecipes.records.run_files import DamagedRunFile

RUN_COLUMNS = (
    ("run", "run"),
    ("recipe", "recipe"),
    ("status", "status"),
    ("epochs", "epochs"),
    ("best", "best"),
    ("wall_time", "time"),
    ("device", "device"),
    ("precision", "precision"),
    ("started", "started"),
    ("torch", "torch"),
    ("commit", "commit"),
)
STATUS_SHOWN = {"finished": "done", "stopped": "stopped (resumable)"}


def _read_json(path: Path) -> dict | None:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read(reader: Callable[[Path], Any], run_dir: Path, damaged: list[DamagedRunFile]) -> Any:
    """``reader(run_dir)``; a damaged file is noted in ``damaged`` (the row says so) and read as missing."""
    try:
        return reader(run_dir)
    except DamagedRunFile as exc:
        damaged.append(exc)
        return None


def _planned_epochs(trainer: dict) -> int | None:
    duration = str(trainer.get("max_duration", ""))
    return int(duration[:-2]) if duration.endswith("ep") and duration[:-2].isdigit() else None


def _history_epochs(run_dir: Path, damaged: list[DamagedRunFile]) -> int:
    rows = _read(run_files.read_history, run_dir, damaged)
    return len(rows) if rows else 0


def _live_lease(run_dir: Path) -> dict | None:
    """The lease beside a bucket run's copy (written there only while it is live), unexpired; else None."""
    import json
    import time

    from dlrecipes.records.layout import LEASE_FILE

    try:
        held = json.loads((Path(getattr(run_dir, "path", run_dir)) / LEASE_FILE).read_text())
    except (OSError, ValueError):
        return None
    expires = held.get("expires") if isinstance(held, dict) else None
    return held if isinstance(expires, (int, float)) and expires > time.time() else None


def _status(run_dir: Path, summary: dict | None) -> str:
    from dlrecipes.records import run_lock
    from dlrecipes.records.run_dir import has_checkpoint

    leased = _live_lease(run_dir)
    if leased is not None:  # a bucket's run that a machine trains now (its lease, copied beside the run)
        return f"running (on {leased.get('host', '?')}, pid {leased.get('pid', '?')})"
    holder = run_lock.read_holder(run_dir)
    if holder is not None:
        alive = run_lock.holder_alive(holder)
        if alive:
            return f"running (pid {holder.get('pid')})"
        if alive is None:
            return f"running? (on host {holder.get('host')})"
    if summary is not None and summary.get("status"):
        status = str(summary["status"])
        if status == "stopped" and not has_checkpoint(run_dir):
            return "stopped"
        shown = STATUS_SHOWN.get(status, status)
        if summary.get("upload_incomplete"):  # its bucket lacks files its machine has: --resume uploads them
            return f"{shown}, upload incomplete"
        return shown
    return "killed (resumable)" if has_checkpoint(run_dir) else "killed"


def describe_run(run_dir: Path | RunDir) -> dict[str, Any]:
    """One run's row: name, recipe, status, epochs done and planned, best monitored metric, wall time, device,
    precision and start time."""
    import datetime

    run = RunDir(run_dir)
    recipe_path = run.recipe
    damaged: list[DamagedRunFile] = []  # what could not be read: the row says so, the command warns and exits non-zero
    recipe = _read(run_files.read_recipe, run, damaged) or {}
    summary = _read(run_files.read_summary, run, damaged)
    best = _read_json(run.best_info)
    trainer = recipe.get("trainer") if isinstance(recipe.get("trainer"), dict) else {}
    done = summary.get("epochs") if summary else _history_epochs(run, damaged)
    planned = _planned_epochs(trainer)
    checkpoint = recipe.get("checkpoint") if isinstance(recipe.get("checkpoint"), dict) else {}
    monitor = best.get("monitor") if best else checkpoint.get("monitor")
    value = best.get("value") if best else (summary or {}).get(f"best_{monitor}")
    started = datetime.datetime.fromtimestamp(recipe_path.stat().st_mtime) if recipe_path.exists() else None
    return {
        "run": run.name,
        "path": str(run),
        "recipe": recipe.get("name"),
        "status": f"damaged ({', '.join(d.path.name for d in damaged)})" if damaged else _status(run, summary),
        "damaged": [str(d) for d in damaged],
        "epochs_done": done,
        "epochs_planned": planned,
        "epochs": f"{done}/{planned}" if planned else str(done),
        "monitor": monitor,
        "best_value": value,
        "best": f"{monitor} {value:.4f}" if isinstance(value, (int, float)) else "-",
        "wall_time_sec": (summary or {}).get("wall_time_sec"),
        "wall_time": _duration((summary or {}).get("wall_time_sec")),
        "device": (summary or {}).get("device") or trainer.get("device"),
        "precision": trainer.get("precision"),
        "started": started.strftime("%Y-%m-%d %H:%M") if started else "-",
        "started_ts": started.timestamp() if started else 0.0,
        **_made_by((summary or {}).get("provenance")),
    }


def _made_by(provenance: Any) -> dict[str, Any]:
    """The row's torch and commit (``*``: uncommitted changes), and the whole provenance (``--json``)."""
    if not isinstance(provenance, dict):
        return {"torch": None, "commit": None, "provenance": None}
    versions = provenance.get("versions") if isinstance(provenance.get("versions"), dict) else {}
    commit = provenance.get("git_commit")
    shown = f"{commit[:8]}{'*' if provenance.get('git_dirty') else ''}" if isinstance(commit, str) else None
    return {"torch": versions.get("torch"), "commit": shown, "provenance": provenance}


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def find_runs(runs_dir: str | Path = RUNS_DIR, last: int | None = None) -> list[Path]:
    """The run directories under ``runs_dir`` (those holding a recipe.yaml, sweeps' nested ones too), newest
    first; ``last``: only that many."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise UserError(f"{root}: no runs folder here (train first, or give the folder: dlrecipes runs PATH)")
    return newest_first(
        [
            p.parent
            for p in root.rglob(RECIPE_FILE)
            if not any(part.startswith(".") for part in p.relative_to(root).parts)
        ],
        last,
    )


def newest_first(run_dirs: Sequence[Path], last: int | None = None) -> list[Path]:
    """Run directories by when their recipe was written, newest first; ``last``: only that many."""
    found = sorted(run_dirs, key=lambda p: RunDir(p).recipe.stat().st_mtime, reverse=True)
    if last is not None:
        if last < 1:
            raise UserError(f"--last: must be at least 1, got {last}")
        found = found[:last]
    return found


def list_runs(runs_dir: str | Path = RUNS_DIR, last: int | None = None) -> list[dict[str, Any]]:
    return [describe_run(p) for p in find_runs(runs_dir, last)]


__all__ = ["RUN_COLUMNS", "describe_run", "find_runs", "list_runs", "newest_first"]
