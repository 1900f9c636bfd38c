"""Plots of a run's history (loss, accuracy, learning rate) and a comparison of runs.

matplotlib runs headless (Agg).  ``dlrecipes plot RUN_DIR`` redraws a run's plots;
``dlrecipes compare RUN_DIR...`` tabulates runs and plots accuracy against wall-clock time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlrecipes.errors import UserError
from dlrecipes.records import run_files
from dlrecipes.records.layout import HISTORY_FILE, RunDir


def pyplot():
    """matplotlib's pyplot on the headless Agg backend (the sweep report's figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_figure(**kwargs: Any):
    """A matplotlib Figure that is not pyplot's (no backend is chosen or changed, nothing to close): saved with
    ``savefig``, and shown inline when it is a notebook cell's value (it renders itself as PNG)."""
    return _shown_figure_class()(**kwargs)


@functools.cache
def _shown_figure_class():
    from matplotlib.figure import Figure

    class ShownFigure(Figure):
        def _repr_png_(self) -> bytes:
            import io

            buffer = io.BytesIO()
            self.savefig(buffer, format="png")
            return buffer.getvalue()

    return ShownFigure


def _series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["epoch"], r[key]) for r in rows if not math.isnan(r.get(key, math.nan))]
    return [p[0] for p in points], [p[1] for p in points]


HISTORY_FIGURES = {  # name -> (y label, [(history.csv column, legend label)])
    "loss": ("loss", [("train_loss", "train"), ("eval_loss", "eval")]),
    "accuracy": ("accuracy", [("eval_top1", "eval top-1"), ("eval_top5", "eval top-5")]),
    "lr": ("learning rate", [("lr", "lr (end of epoch)")]),
}


def _history_rows(run_dir: Path) -> list[dict[str, float]]:
    rows = run_files.read_history(Path(run_dir), missing_ok=False)
    if not rows:
        raise UserError(f"{run_dir}/{HISTORY_FILE} has no rows yet")
    return rows


def _draw_history(ax, rows: list[dict[str, float]], figure: str, title: str) -> None:
    ylabel, series = HISTORY_FIGURES[figure]
    series = list(series)
    if figure == "accuracy":  # multi-output models: eval_<output>/top1 (and top5) beside the single-output columns
        series += [
            (k, "eval " + k.removeprefix("eval_"))
            for k in rows[0]
            if k.startswith("eval_") and k.endswith(("/top1", "/top5"))
        ]
    for key, label in series:
        x, y = _series(rows, key)
        if y:
            ax.plot(x, y, marker="o", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend()


def plot_history(run_dir: str | Path) -> list[Path]:
    """Write loss.png, accuracy.png and lr.png into ``run_dir`` from its history.csv."""
    run_dir = Path(run_dir)
    run = RunDir(run_dir)
    rows = _history_rows(run_dir)
    written = []
    for figure, (ylabel, _) in HISTORY_FIGURES.items():
        fig = new_figure(figsize=(6, 4), dpi=100)
        _draw_history(fig.subplots(), rows, figure, f"{run_dir.name}: {ylabel}")
        fig.tight_layout()
        path = run.plot(figure)
        fig.savefig(path)
        written.append(path)
    return written


def history_figure(run_dir: str | Path):
    """One Figure of a run's history: loss, accuracy and learning rate side by side (a notebook shows it inline)."""
    run_dir = Path(run_dir)
    rows = _history_rows(run_dir)
    fig = new_figure(figsize=(13, 3.6), dpi=100)
    for ax, (figure, (ylabel, _)) in zip(fig.subplots(1, len(HISTORY_FIGURES)), HISTORY_FIGURES.items()):
        _draw_history(ax, rows, figure, ylabel)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    return fig


COMPARE_COLUMNS = (
    ("run", "run"),
    ("status", "status"),
    ("recipe", "recipe"),
    ("precision", "precision"),
    ("batch_size", "batch"),
    ("microbatch", "microbatch"),
    ("wall_time_sec", "wall s"),
    ("images_per_sec", "img/s"),
    ("peak_memory_mb", "peak MiB"),
    ("best_top1", "best top-1"),
    ("epochs", "epochs"),
)


def load_summary(run_dir: Path) -> dict[str, Any]:
    """A run's summary.json; a run without one (it failed early, or is still training) gets a row saying so."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a run directory (no such folder)")
    summary = run_files.read_summary(run_dir)
    if summary is None:
        return {"run": run_dir.name, "status": "no summary (training, or stopped before its first epoch)"}
    summary.setdefault("status", "finished")  # summaries written before runs recorded their status
    return summary


IGNORED_DIFFERENCES = ("run_name", "runs_dir", "description")


def recipe_differences(run_dirs: Sequence[str | Path]) -> dict[str, list[Any]]:
    """The resolved-recipe keys (dotted) whose values differ among the runs, with each run's value."""
    from dlrecipes.records.resume_check import flatten

    flat: list[Any] = []
    for run_dir in run_dirs:
        recipe = run_files.read_recipe(Path(run_dir))
        flat.append(flatten(recipe) if recipe is not None else None)  # None: no recipe to compare
    known = [f for f in flat if f is not None]
    keys = sorted({k for f in known for k in f if k.split(".")[0] not in IGNORED_DIFFERENCES})
    differing = [k for k in keys if len({repr(f.get(k)) for f in known}) > 1]
    return {k: [f.get(k) if f is not None else None for f in flat] for k in differing}


def compare_runs(
    run_dirs: Sequence[str | Path], plot_path: str | Path | None = None
) -> tuple[list[dict[str, Any]], Path | None]:
    """Summaries of the runs (for the table; ``settings``: the recipe values that differ among them) and,
    with ``plot_path``, a plot of eval top-1 against wall-clock time written there."""
    summaries = [load_summary(Path(d)) for d in run_dirs]
    if len(summaries) > 1:
        differences = recipe_differences(run_dirs)
        environment = environment_differences(summaries)
        for i, summary in enumerate(summaries):
            summary["settings"] = {k: values[i] for k, values in differences.items()}
            summary["environment"] = {k: values[i] for k, values in environment.items()}
    if plot_path is None:
        return summaries, None
    fig = comparison_figure(run_dirs, summaries)
    plot_path = Path(plot_path)
    try:
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot_path)
    except OSError as exc:
        raise UserError(f"--out: cannot write {plot_path}: {exc.strerror or exc}") from None
    return summaries, plot_path


# provenance items that differ between any two runs by nature, not by what made their numbers
NOT_COMPARED = ("command", "recipe_file", "seed")


def environment_differences(summaries: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """``{item: [value per run]}`` of the provenance items (:mod:`dlrecipes.records.provenance`) that differ
    among the runs: another torch, GPU, commit or plugin file."""
    from dlrecipes.records.provenance import flat

    flats = [
        flat({k: v for k, v in (s.get("provenance") or {}).items() if k not in NOT_COMPARED}, "")
        if isinstance(s.get("provenance"), dict)
        else {}
        for s in summaries
    ]
    keys = dict.fromkeys(k for f in flats for k in f)
    return {
        k.removeprefix("versions/"): [f.get(k) for f in flats] for k in keys if len({repr(f.get(k)) for f in flats}) > 1
    }


def comparison_figure(run_dirs: Sequence[str | Path], summaries: Sequence[dict[str, Any]]):
    """Eval top-1 against wall-clock time, one line per run (``summaries``: :func:`load_summary` of each)."""
    fig = new_figure(figsize=(7, 4.5), dpi=100)
    ax = fig.subplots()
    for run_dir, summary in zip(run_dirs, summaries):
        if not RunDir(run_dir).history.is_file():
            continue
        rows = [
            r
            for r in run_files.read_history(Path(run_dir), missing_ok=False)
            if not math.isnan(r.get("eval_top1", math.nan)) and not math.isnan(r.get("elapsed_sec", math.nan))
        ]
        label = f"{summary['run']} ({summary.get('precision')}, batch {summary.get('batch_size')})"
        ax.plot([r["elapsed_sec"] for r in rows], [r["eval_top1"] for r in rows], marker="o", label=label)
    ax.set_xlabel("wall-clock time (s)")
    ax.set_ylabel("eval top-1 accuracy")
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if value < 1.5 else f"{value:,.1f}"
    return str(value)
