"""A sweep's results: how each point ended, the line printed as each training ends, the table (terminal,
``summary.csv``, ``summary.md``) and ``summary.png``.

A point's outcome is how its latest training ended: ``done``, ``pruned``, ``stopped (resumable)``,
``diverged``, ``failed`` or ``refused`` (the trainer refused the recipe, exit 2), each but ``done`` with a
one-line reason; a point no training has tried yet is ``not run``.  The reason is the run's ``summary.json``
``reason`` or, where the run left no directory (a failure before its first checkpoint, a refusal), the last
line of the point's log.  The sweep records the outcome in ``logs/<point>.outcome.json`` as each training
ends, so a later run of the sweep (or one stopped before it reached the point again) still knows it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

from dlrecipes.records.layout import RunDir
from dlrecipes.tools.sweep.plan import Point, SweepPlan, short_names, value_text

LOG_DIR = "logs"  # in the sweep's folder: <point>.log (each training's output) and <point>.outcome.json
FINISHED = ("done", "pruned")  # the outcomes a sweep exits 0 with: an Optuna search prunes on purpose
_ORDER = ("diverged", "failed", "refused", "stopped", "killed", "running", "not run")  # in the closing line


def swept_keys(plan: SweepPlan) -> list[str]:
    """The keys that are columns of the table: the swept ones (the seed only when it is swept, not --seeds)."""
    return [k for k in plan.points[0].values if k != "trainer.seed" or not plan.seeds] if plan.points else []


def point_run(folder: Path, name: str) -> RunDir:
    """A point's run directory: the sweep's folder holds one per point, named after it."""
    return RunDir(folder / name)


def log_path(folder: Path, name: str) -> Path:
    return folder / LOG_DIR / f"{name}.log"


def _outcome_path(folder: Path, name: str) -> Path:
    return folder / LOG_DIR / f"{name}.outcome.json"


def forget_outcome(folder: Path, name: str) -> None:
    """A point's training starts again: until it ends, its outcome is its run directory's."""
    _outcome_path(folder, name).unlink(missing_ok=True)


def _summary(run: RunDir) -> dict[str, Any]:
    from dlrecipes.records.run_files import DamagedRunFile, read_summary

    try:
        return read_summary(run) or {}
    except DamagedRunFile:
        return {}


def _last_line(log: Path) -> str:
    """The last line the point's latest training printed (its one-line error, ``error: `` left off); empty
    when it printed nothing after its command line."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("$ "):  # the command the sweep started it with
            return ""
        if line.strip():
            return line.strip().removeprefix("error: ")
    return ""


def record_outcome(folder: Path, name: str, returncode: int, signalled: bool = False) -> dict[str, str]:
    """How a point's training ended, from its exit code, its run's ``summary.json`` and its log, written to
    ``logs/<point>.outcome.json``.  ``signalled``: the sweep was stopped by a signal, which it passed on (a
    training that then ended by a signal, or before it had a run directory, was stopped, not failed)."""
    from dlrecipes.records.runs import describe_run

    run = point_run(folder, name)
    ran = run.is_run()
    if returncode in (0, 75) and ran:
        status = describe_run(run)["status"]  # done, pruned, stopped (resumable)
    elif returncode == 75 or (signalled and returncode < 0):
        status = "stopped"
    else:
        status = {2: "refused", 3: "diverged"}.get(returncode, "failed")
    summary = _summary(run) if ran and status != "refused" else {}  # a refusal leaves an earlier run as it was
    if status == "done":
        reason = ""
    elif returncode < 0:
        reason = (
            f"killed by {signal.Signals(-returncode).name}"
            if -returncode in signal.valid_signals()
            else f"killed by signal {-returncode}"
        )
    elif summary.get("status") == status.split(" (")[0] and summary.get("reason"):
        reason = str(summary["reason"])
    else:
        reason = _last_line(log_path(folder, name)) or f"exit code {returncode}"
    outcome = {"status": status, "reason": reason, "exit_code": returncode}
    path = _outcome_path(folder, name)
    path.with_suffix(".partial").write_text(json.dumps(outcome) + "\n")
    os.replace(path.with_suffix(".partial"), path)
    return outcome


def point_outcome(folder: Path, name: str) -> dict[str, Any]:
    """A point's latest outcome: the one the sweep recorded (unless its run ended again since, outside the
    sweep), else its run directory's, else ``not run``."""
    from dlrecipes.records.runs import describe_run

    run, recorded = point_run(folder, name), _outcome_path(folder, name)
    try:
        outcome = json.loads(recorded.read_text())
        summary = run.summary
        if summary.is_file() and summary.stat().st_mtime > recorded.stat().st_mtime:
            outcome = None
    except (OSError, ValueError):
        outcome = None
    if isinstance(outcome, dict) and outcome.get("status"):
        return {"status": str(outcome["status"]), "reason": str(outcome.get("reason") or "")}
    if not run.is_run():
        return {"status": "not run", "reason": ""}
    status = describe_run(run)["status"]
    return {"status": status, "reason": "" if status == "done" else str(_summary(run).get("reason") or "")}


def unfinished(plan: SweepPlan) -> dict[str, dict[str, Any]]:
    """The points that did not finish (nor were pruned), each with its outcome, in the sweep's order."""
    assert plan.folder is not None
    outcomes = {point.name: point_outcome(plan.folder, point.name) for point in plan.points}
    return {name: outcome for name, outcome in outcomes.items() if outcome["status"] not in FINISHED}


def closing_line(plan: SweepPlan, left: dict[str, dict[str, Any]]) -> str:
    """``2 of 6 points did not finish: 1 diverged, 1 failed; ...``: the sweep's last line when not all finished."""
    kinds = [outcome["status"].split(" (")[0] for outcome in left.values()]
    counts = sorted(
        {k: kinds.count(k) for k in kinds}.items(),
        key=lambda kc: _ORDER.index(kc[0]) if kc[0] in _ORDER else len(_ORDER),
    )
    what = "trials" if plan.search == "optuna" else "points"
    return (
        f"{len(left)} of {len(plan.points)} {what} did not finish: {', '.join(f'{n} {k}' for k, n in counts)}; "
        f"see {plan.folder / 'summary.md'}"
    )


def _point_row(folder: Path, name: str) -> dict[str, Any]:
    from dlrecipes.records.runs import describe_run

    row: dict[str, Any] = {**point_outcome(folder, name), "monitor": None}
    run = point_run(folder, name)
    if not run.path.is_dir():
        return row
    described = describe_run(run)
    summary = _summary(run)  # a damaged one: the row says so (its status), the table is still written
    history = history_rows(run)
    monitor = described.get("monitor") or "top1"
    final = history[-1].get(f"eval_{monitor}") if history else None
    return {
        **row,
        "monitor": monitor,
        "best": described.get("best_value"),
        "final": float(final) if final not in (None, "", "nan") else None,
        "wall_time_sec": summary.get("wall_time_sec"),
        "images_per_sec": summary.get("images_per_sec"),
        "peak_memory_mb": summary.get("peak_memory_mb"),
    }


def history_rows(run: RunDir) -> list[dict[str, str]]:
    try:
        with open(run.history, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def summarize(plan: SweepPlan) -> list[dict[str, Any]]:
    """One row per grid point: the swept keys, then the best and final monitored metric, wall time, images/s
    and peak memory (mean ± std over the seeds, with their count), the runs' outcomes and their reasons."""
    assert plan.folder is not None
    keys = swept_keys(plan)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for point in plan.points:  # an Optuna search's trials each have a row (two may pick the same values)
        group = tuple(value_text(point.values[k]) for k in keys) + ((point.trial,) if point.trial is not None else ())
        groups.setdefault(group, []).append(_point_row(plan.folder, point.name))
    rows = []
    for group, runs in groups.items():
        row: dict[str, Any] = {"trial": group[-1]} if plan.search == "optuna" else {}
        row.update(zip(keys, group))
        for metric in ("best", "final", "wall_time_sec", "images_per_sec", "peak_memory_mb"):
            values = [r[metric] for r in runs if isinstance(r.get(metric), (int, float)) and r["status"] in FINISHED]
            row[metric] = statistics.mean(values) if values else None
            row[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else None
        row["monitor"] = next((r["monitor"] for r in runs if r.get("monitor")), None)
        row["runs"] = sum(r["status"] == "done" for r in runs)
        statuses = sorted({r["status"] for r in runs})
        row["status"] = statuses[0] if len(statuses) == 1 else ", ".join(statuses)
        row["reason"] = " / ".join(dict.fromkeys(r["reason"] for r in runs if r["reason"]))
        rows.append(row)
    return rows


def _cell(row: dict[str, Any], metric: str, digits: str) -> str:
    value, std = row.get(metric), row.get(f"{metric}_std")
    if value is None:
        return "-"
    text = format(value, digits)
    return f"{text} ± {format(std, digits)}" if std is not None else text


def table_rows(plan: SweepPlan, rows: list[dict[str, Any]], short: bool = False) -> tuple[list[str], list[list[str]]]:
    """The table's header and cells; ``short``: each swept key by its last part (``key_legend`` names them)."""
    keys = (["trial"] if plan.search == "optuna" else []) + swept_keys(plan)
    names = short_names(keys) if short else {k: k for k in keys}
    monitor = next((r["monitor"] for r in rows if r.get("monitor")), "top1")
    header = [
        *(names[k] for k in keys),
        f"best {monitor}",
        f"final {monitor}",
        "wall s",
        "img/s",
        "peak MiB",
        *(["runs"] if plan.seeds else []),
        "status",
    ]
    body = [
        [
            *(str(r[k]) for k in keys),
            _cell(r, "best", ".4f"),
            _cell(r, "final", ".4f"),
            _cell(r, "wall_time_sec", ".1f"),
            _cell(r, "images_per_sec", ",.0f"),
            _cell(r, "peak_memory_mb", ".0f"),
            *([f"{r['runs']}/{plan.seeds}"] if plan.seeds else []),
            r["status"],
        ]
        for r in rows
    ]
    return header, body


def key_legend(plan: SweepPlan) -> str:
    """``lr = optimizer.lr, width = model.width``: the full name of each key a short table header stands for."""
    return ", ".join(f"{short} = {key}" for key, short in short_names(swept_keys(plan)).items() if short != key)


def write_summary(plan: SweepPlan, rows: list[dict[str, Any]]) -> None:
    """``summary.csv`` (numbers, std in their own columns), ``summary.md`` (the table, with each row's
    reason) and ``summary.png``."""
    assert plan.folder is not None
    fields = list(rows[0]) if rows else []
    with open(plan.folder / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    header, body = table_rows(plan, rows)
    lines = ["| " + " | ".join([*header, "reason"]) + " |", "|" + "---|" * (len(header) + 1)]
    lines += [
        "| " + " | ".join(c.replace("|", "\\|") for c in [*cells, row["reason"]]) + " |"
        for cells, row in zip(body, rows)
    ]
    (plan.folder / "summary.md").write_text(f"# sweep {plan.name}\n\n" + "\n".join(lines) + "\n")
    try:
        plot_sweep(plan, rows, plan.folder / "summary.png")
    except Exception as exc:  # a plot must not lose the table
        print(f"warning: could not draw summary.png ({type(exc).__name__}: {exc})", file=sys.stderr)


def number(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def best_value(history: list[dict[str, str]], monitor: str, mode: str) -> float | None:
    """The best finite value of the evaluations' ``monitor`` in a run's history rows (``mode``: max or min)."""
    values = [v for v in (number(h.get(f"eval_{monitor}")) for h in history) if v is not None and math.isfinite(v)]
    return (max(values) if mode == "max" else min(values)) if values else None


def finished_line(
    plan: SweepPlan, point: Point, outcome: dict[str, Any], seconds: float, done: int, total: int, eta: float | None
) -> str:
    """``[3/8] lr=0.01,seed=1  done  top1 0.9471  24s  ETA 1:10  (log: ...)``, and below it the reason of a
    training that did not finish (``eta``: the seconds the points left will take, None when none is left)."""
    from dlrecipes.records.runs import describe_run

    assert plan.folder is not None
    run = point_run(plan.folder, point.name)
    kept = outcome["status"] in FINISHED or outcome["status"].startswith("stopped")
    best = describe_run(run)["best"] if kept and run.is_run() else "-"
    eta_text = f"  ETA {int(eta) // 60}:{int(eta) % 60:02d}" if eta is not None else ""
    line = (
        f"[{done}/{total}] {point.name}  {outcome['status']}  {best}  {seconds:.0f}s"
        f"{eta_text}  (log: {log_path(plan.folder, point.name)})"
    )
    return line + (f"\n    {outcome['reason']}" if outcome["reason"] else "")


def _heat_map(fig: Any, ax: Any, keys: list[str], rows: list[dict[str, Any]]) -> None:
    """The best monitored metric for each pair of values of two swept keys."""
    xs = list(dict.fromkeys(r[keys[0]] for r in rows))
    ys = list(dict.fromkeys(r[keys[1]] for r in rows))
    grid = [[math.nan] * len(xs) for _ in ys]
    for r in rows:
        grid[ys.index(r[keys[1]])][xs.index(r[keys[0]])] = r["best"] if r["best"] is not None else math.nan
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(keys[0])
    ax.set_ylabel(keys[1])
    for i, row_values in enumerate(grid):
        for j, value in enumerate(row_values):
            if not math.isnan(value):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", color="white")


def _lines(ax: Any, keys: list[str], rows: list[dict[str, Any]], monitor: str) -> None:
    """The best monitored metric against the first swept key, one line per value of the others."""
    x_key, others = keys[0], keys[1:]
    lines: dict[tuple, list[tuple[Any, float]]] = {}
    for r in rows:
        if r["best"] is not None:
            lines.setdefault(tuple(r[k] for k in others), []).append((r[x_key], r["best"]))
    numeric = all(number(x) is not None for pts in lines.values() for x, _ in pts)
    if numeric:  # a search's points come in the order they were drawn
        lines = {other: sorted(pts, key=lambda p: number(p[0]) or 0.0) for other, pts in lines.items()}
    for other, pts in lines.items():
        label = ", ".join(f"{k}={v}" for k, v in zip(others, other)) or None
        xs = [number(x) if numeric else x for x, _ in pts]
        ax.plot(xs, [v for _, v in pts], marker="o", label=label)
    if numeric and all((number(x) or 0) > 0 for pts in lines.values() for x, _ in pts) and len(lines):
        values = [number(x) for pts in lines.values() for x, _ in pts]
        if max(values) / min(values) >= 100:  # learning rates and the like
            ax.set_xscale("log")
    ax.set_xlabel(x_key)
    ax.set_ylabel(f"best eval {monitor}")
    if any(other for other in lines):
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def plot_sweep(plan: SweepPlan, rows: list[dict[str, Any]], path: Path) -> None:
    """The best monitored metric against the swept key (a line per value of the other keys), or a heat map
    for two keys; beside it the evaluation curves of every run."""
    from dlrecipes.records.plots import pyplot

    plt = pyplot()
    keys = swept_keys(plan)
    monitor = next((r["monitor"] for r in rows if r.get("monitor")), "top1")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    if len(keys) == 2:
        _heat_map(fig, left, keys, rows)
    elif keys:
        _lines(left, keys, rows, monitor)
    assert plan.folder is not None
    for point in plan.points:
        history = history_rows(point_run(plan.folder, point.name))
        points = [
            (int(h["epoch"]), float(h[f"eval_{monitor}"]))
            for h in history
            if h.get(f"eval_{monitor}") not in (None, "", "nan")
        ]
        if points:
            right.plot(*zip(*points), marker=".", label=point.name)
    from matplotlib.ticker import MaxNLocator

    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("epoch")
    right.set_ylabel(f"eval {monitor}")
    right.grid(alpha=0.3)
    if right.get_lines() and len(right.get_lines()) <= 12:
        right.legend(fontsize=7)
    fig.suptitle(f"sweep {plan.name}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


__all__ = [
    "FINISHED",
    "LOG_DIR",
    "best_value",
    "closing_line",
    "finished_line",
    "forget_outcome",
    "history_rows",
    "key_legend",
    "log_path",
    "number",
    "plot_sweep",
    "point_outcome",
    "record_outcome",
    "summarize",
    "swept_keys",
    "table_rows",
    "unfinished",
    "write_summary",
]
