"""The run directory: its name, its creation, the resolved recipe written into it (rank 0), and what
becomes of it when a run fails.

A default name is the recipe's name and the start time, made unique by a suffix when another run
took it in the same second (the directory is created at once, so two processes cannot both take
it).  A run that fails before its first checkpoint leaves no directory; one that fails later is
marked in summary.json (``status``), and starting it again under the same name sets it aside as
``<name>.failed-<time>`` with a warning (``--resume`` continues it instead).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from dlrecipes.core.distributed import rank, same_on_all_ranks
from dlrecipes.errors import UserError
from dlrecipes.records.checkpoints import CHECKPOINT_DIR, LATEST_CHECKPOINT


def choose_run_name(config: Any, resume: bool, device: str) -> str:
    """The recipe's run_name; with ``resume``, the newest run of this recipe; else name + timestamp."""
    if config.run_name:
        return config.run_name
    runs = Path(config.runs_dir)
    if resume:
        candidates = sorted(
            (p for p in runs.glob(f"{config.name}-*") if (p / CHECKPOINT_DIR / LATEST_CHECKPOINT).exists()),
            key=lambda p: p.stat().st_mtime,
        )
        if not candidates:
            raise UserError(
                f"--resume: no run of recipe '{config.name}' with a checkpoint under {runs}/ "
                f"(looked for {runs}/{config.name}-*/{CHECKPOINT_DIR}/{LATEST_CHECKPOINT}); "
                "set run_name=... to name the run to continue"
            )
        return candidates[-1].name
    name = _claim_new_name(Path(config.runs_dir), f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}") \
        if rank() == 0 else ""
    return same_on_all_ranks(name, device, config.trainer.dist_timeout)


def _claim_new_name(runs: Path, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``...: the first whose directory this process creates (rank 0)."""
    for count in range(1, 1000):
        name = stem if count == 1 else f"{stem}-{count}"
        try:
            (runs / name).mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"runs_dir: cannot create run directory {runs / name}: {exc.strerror}") from None
        return name
    raise UserError(f"runs_dir: {runs} already holds 999 runs named {stem}-*; choose a run_name")


FAILED = ("failed", "diverged")  # summary.json statuses of a run that cannot be continued as it was


def run_status(run_dir: Path) -> str | None:
    """``status`` from a run's summary.json (finished, pruned, stopped, diverged, failed), or None."""
    import json

    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def set_aside_failed_run(run_dir: Path) -> Path | None:
    """A failed run's directory, renamed ``<name>.failed-<time>`` so that a new run can take the name (rank 0)."""
    status = run_status(run_dir)
    if rank() != 0 or status not in FAILED:
        return None
    aside = run_dir.with_name(f"{run_dir.name}.{status}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(aside)
    print(f"warning: {run_dir} held a run that {'diverged' if status == 'diverged' else 'failed'}; it was moved to "
          f"{aside} and this run starts afresh (pass --resume to continue it from its checkpoint instead)",
          file=sys.stderr)
    return aside


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run wrote a complete checkpoint (periodic or best)."""
    folder = run_dir / CHECKPOINT_DIR
    return folder.is_dir() and any(p.suffix == ".pt" and not p.is_symlink() for p in folder.iterdir())


def make_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"runs_dir: cannot create run directory {run_dir}: {exc.strerror}") from None
    if not os.access(run_dir, os.W_OK):
        raise UserError(f"runs_dir: run directory {run_dir} is not writable")


def prepare_run_dir(config: Any, run_name: str, resume: bool, recipe: dict[str, Any] | None = None) -> Path:
    """Create ``runs/<run_name>/`` and write the resolved recipe there (rank 0); ``recipe``: the
    config as plain data, when the caller has it already."""
    run_dir = Path(config.runs_dir) / run_name
    resolved = yaml.safe_dump(recipe if recipe is not None else config.to_dict(), sort_keys=False)
    recipe_file = run_dir / "recipe.yaml"
    if rank() == 0:
        make_run_dir(run_dir)
        if recipe_file.exists() and not resume and (run_dir / CHECKPOINT_DIR).exists():
            raise UserError(
                f"run_name: {run_dir} already holds a run; pass --resume to continue it or choose another run_name"
            )
        if not recipe_file.exists() or recipe_file.read_text() != resolved:
            if recipe_file.exists():
                recipe_file.rename(run_dir / f"recipe.before-{time.strftime('%Y%m%d-%H%M%S')}.yaml")
            recipe_file.write_text(resolved)
    return run_dir
