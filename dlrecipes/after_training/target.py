"""After training: what ``eval``, ``export`` and ``predict`` were pointed at (a run directory, or a checkpoint file
with its recipe), found once: the recipe to read and the checkpoint to load (``best``, ``latest`` or a path).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dlrecipes.errors import UserError
from dlrecipes.records.layout import BEST_CHECKPOINT, RECIPE_FILE, ExportDir, RunDir

CHECKPOINT_CHOICES = ("best", "latest")


@dataclass
class RunTarget:
    """What ``eval``/``predict``/``export`` were pointed at: the recipe and the checkpoint to use."""

    recipe: Path
    checkpoint: Path
    run: RunDir | None  # the run it belongs to; None: a checkpoint file given with --recipe


def is_export_dir(path: str | Path) -> bool:
    """A folder with an export's files and no run's ``recipe.yaml``."""
    folder = Path(path)
    return folder.is_dir() and not RunDir(folder).is_run() and any(path.exists() for path in ExportDir(folder).files)


def find_target(
    target: str | Path, checkpoint: str = "best", recipe: str | Path | None = None, trust: bool = False
) -> RunTarget:
    """A run directory (its recipe.yaml and the checkpoint ``checkpoint`` names: best, latest or a path), or a
    checkpoint file (inside a run directory's checkpoints/, or with ``recipe``). ``latest`` is the newest
    periodic checkpoint that loads, read tensors-only unless ``trust``."""
    from dlrecipes.records.checkpoint_file import not_a_file

    target = Path(target)
    run: RunDir | None
    if target.is_dir():
        run = RunDir(target)
        if not run.is_run():
            raise UserError(
                f"{target}: not a run directory (no {RECIPE_FILE}); give a run directory such as "
                "runs/<name>, or a checkpoint file with --recipe"
            )
        folder = run.checkpoints
        if checkpoint == "best":
            path = run.best
            problem = not_a_file(path)
            if problem == "is missing":
                raise UserError(
                    f"--checkpoint: {target} has no {BEST_CHECKPOINT} (its recipe monitors no metric, "
                    "or it never evaluated); use --checkpoint latest, or a checkpoint file"
                )
            if problem is not None:
                raise UserError(f"--checkpoint: {path} {problem}; use --checkpoint latest, or a checkpoint file")
            from dlrecipes.records.checkpoint_safety import check_trusted
            from dlrecipes.records.run_files import check_best_record

            try:  # (static, no load) a file that runs code or is damaged: its load says so, with its advice
                check_trusted(path, trust, "--checkpoint")
            except UserError:
                pass
            else:
                check_best_record(run, refuse=not trust)  # best.json's and best.pt's evaluations are one
        elif checkpoint == "latest":
            path = _newest_that_loads(folder, target, trust)
        else:
            path = Path(checkpoint)
            problem = not_a_file(path)
            if problem == "is missing":
                raise UserError(f"--checkpoint: no checkpoint file at {path}; use best, latest or a .pt file")
            if problem is not None:
                raise UserError(f"--checkpoint: {path} {problem}; use best, latest or a .pt file")
    elif target.is_file():
        path, run = target, RunDir.holding(target)
    else:
        raise UserError(f"{target}: no such run directory or checkpoint file")
    if recipe is not None:
        recipe_path = Path(recipe)
    elif run is not None:
        recipe_path = run.recipe
    else:
        raise UserError(f"{target}: a checkpoint outside a run directory needs its recipe: add --recipe RECIPE.yaml")
    return RunTarget(recipe_path, path, run)


def _newest_that_loads(folder: Path, target: Path, trust: bool) -> Path:
    """``--checkpoint latest``: the newest periodic checkpoint that loads; the newer ones it passes over are named,
    with why, in one note (a run's newest checkpoint damaged is not to be evaluated in silence), and a run none of
    whose checkpoints loads is refused naming them."""
    from dlrecipes.records.checkpoints import newest_that_loads, none_loads, skipped_note

    path, skipped = newest_that_loads(folder, trust, "--checkpoint") if folder.is_dir() else (None, [])
    if path is None and skipped:
        raise none_loads(target, skipped)
    if path is None:
        raise UserError(f"--checkpoint: {target} has no complete periodic checkpoint; use --checkpoint best")
    if skipped:
        print(skipped_note(skipped, path), file=sys.stderr)
    return path


__all__ = ["RunTarget", "find_target", "is_export_dir"]
