"""The run directory: its name, its creation and the resolved recipe written into it (rank 0)."""

from __future__ import annotations

import os
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
    return same_on_all_ranks(f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}", device, config.trainer.dist_timeout)


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
