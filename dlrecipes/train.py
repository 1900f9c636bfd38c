"""Fit (the fourth stage): a validated recipe -> its run directory -> the built Trainer -> ``fit()``.

The run directory and its lock, resuming, and what is reported around ``fit()``; everything the
recipe names is built by :mod:`dlrecipes.builders`, the run directory's helpers are
:mod:`dlrecipes.records.run_dir`.
"""

from __future__ import annotations

import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrecipes.builders import build_trainer
from dlrecipes.config import RecipeConfig
from dlrecipes.core.distributed import rank, resolve_device
from dlrecipes.errors import RecipeError
from dlrecipes.records import run_lock
from dlrecipes.records.resume_check import check_resume
from dlrecipes.records.run_dir import choose_run_name, make_run_dir, prepare_run_dir


@dataclass
class TrainResult:
    run_dir: Path
    epochs: int
    batches: int
    eval_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _log_lr_scaling(config: RecipeConfig, trainer) -> None:
    params = config.optimizer.params
    if params.get("scale_lr", "none") == "none":
        return
    lr = trainer.state.optimizers[0].param_groups[0]["lr"]
    trainer.logger.log_hyperparameters({"optimizer/scaled_lr": lr, "optimizer/scale_lr": params["scale_lr"]})
    if rank() == 0:
        print(
            f"optimizer.lr scaled ({params['scale_lr']}) from the reference batch {params['reference_batch_size']} "
            f"to the global batch {config.trainer.batch_size}: {lr:.6g}",
            file=sys.stderr,
        )


def _report_skipped_images(trainer) -> None:
    """Image-folder data with ``bad_images: skip``: say how many unreadable images were left out."""
    for label, loader in (("train", trainer.state.train_dataloader),
                          *((e.label, e.dataloader.dataloader) for e in trainer.state.evaluators)):
        flags = getattr(getattr(loader, "dataset", None), "unreadable", None)
        skipped = sum(flags) if flags is not None else 0
        if skipped:
            print(f"warning: {skipped} unreadable image(s) skipped in the {label} data (paths above)", file=sys.stderr)


def train(config: RecipeConfig, resume: bool = False, trust_checkpoint: bool = False,
          verbose: bool = False) -> TrainResult:
    """Train a validated recipe; returns where the run went and its final eval metrics.

    ``verbose``: Composer's own console logging too, and the warnings
    :data:`dlrecipes.loggers.terminal.HARMLESS_WARNINGS` (hidden otherwise).
    """
    if resume and not (config.checkpoint.save and not config.checkpoint.best_only):
        raise RecipeError("--resume needs periodic checkpoints (checkpoint.save=true, checkpoint.best_only=false)")
    device = resolve_device(config.trainer.device)
    run_name = choose_run_name(config, resume, device)
    run_dir = Path(config.runs_dir) / run_name
    recipe = config.to_dict()  # the resolved recipe as plain data: compared on resume, written, recorded
    if resume:  # before anything is built or written
        accepted = check_resume(run_dir, recipe)
        if accepted and rank() == 0:
            print(f"resuming {run_name} with changed settings: {', '.join(accepted)}", file=sys.stderr)
    lock, fresh, started = None, not run_dir.exists(), []
    if rank() == 0:
        make_run_dir(run_dir)
        lock = run_lock.acquire(run_dir)
    try:
        with warnings.catch_warnings():
            if not verbose:
                from dlrecipes.loggers.terminal import hide_harmless_warnings

                hide_harmless_warnings()
            run_dir = prepare_run_dir(config, run_name, resume, recipe)
            return _train_in(config, run_dir, recipe, resume, trust_checkpoint, started, verbose)
    except BaseException:
        if fresh and not started and lock is not None:  # failed before training: leave no run directory behind
            lock.release()
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.release()


def _train_in(config: RecipeConfig, run_dir: Path, recipe: dict[str, Any], resume: bool, trust_checkpoint: bool,
              started: list, verbose: bool = False) -> TrainResult:
    start = time.perf_counter()
    trainer = build_trainer(config, run_dir, resume=resume, trust_checkpoint=trust_checkpoint, verbose=verbose,
                            recipe=recipe)
    _log_lr_scaling(config, trainer)
    finished = resume and trainer.state.get_elapsed_duration() >= 1.0
    if finished:  # e.g. killed after its last checkpoint: nothing left to train
        print(f"{run_dir.name} already finished ({int(trainer.state.timestamp.batch)} batches); nothing to resume",
              file=sys.stderr)
    try:
        if not finished:
            started.append(True)
            trainer.fit()
    finally:
        trainer.close()
        _report_skipped_images(trainer)
    state = trainer.state
    metrics: dict[str, Any] = {k: float(v) for k, v in state.eval_metric_values.items()}
    return TrainResult(
        run_dir=run_dir,
        epochs=int(state.timestamp.epoch),
        batches=int(state.timestamp.batch),
        eval_metrics=metrics,
        seconds=time.perf_counter() - start,
    )
