"""Fit (the fourth stage): a validated recipe -> its run, opened where it lives -> the built Trainer -> ``fit()``.

Where the run lives, its name, lock and resume are the run store's (:mod:`dlrecipes.records.store`: a local folder
or a bucket, chosen from ``runs_dir``); everything the recipe names is built by :mod:`dlrecipes.builders`; how a
training ended is :mod:`dlrecipes.fit.outcome`'s.  This module is the sequence, and what is reported around ``fit()``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from dlrecipes.builders import build_trainer
from dlrecipes.config import RecipeConfig
from dlrecipes.core import lr_scaling
from dlrecipes.core.devices import resolve_device
from dlrecipes.core.distributed import choose_gloo_interface, rank, start_torchrun_group
from dlrecipes.fit.outcome import TrainingFailed, TrainResult, ended_by, outcome
from dlrecipes.records.run_dir import find_resume_point, record_recipe
from dlrecipes.records.store import TrainingRun, store_for

__all__ = ["TrainResult", "TrainingFailed", "fit"]


def _log_lr_scaling(config: RecipeConfig, trainer) -> None:
    """With ``optimizer.scale_lr``: the lr the optimizer got, logged and said once."""
    lr = trainer.state.optimizers[0].param_groups[0]["lr"]
    report = lr_scaling.scaling_report(config.optimizer.params, config.trainer.batch_size, lr)
    if report is None:
        return
    line, hyperparameters = report
    trainer.logger.log_hyperparameters(hyperparameters)
    if rank() == 0:
        print(line, file=sys.stderr)


def _report_skipped_images(trainer) -> None:
    """Image-folder data with ``bad_images: skip``: say how many unreadable images were left out."""
    for label, loader in (("train", trainer.state.train_dataloader),
                          *((e.label, e.dataloader.dataloader) for e in trainer.state.evaluators)):
        flags = getattr(getattr(loader, "dataset", None), "unreadable", None)
        skipped = sum(flags) if flags is not None else 0
        if skipped:
            print(f"warning: {skipped} unreadable image(s) skipped in the {label} data (paths above)", file=sys.stderr)


def fit(config: RecipeConfig, resume: bool = False, trust_checkpoint: bool = False,
          verbose: bool = False, restart: bool = False) -> TrainResult:
    """Train a validated recipe; returns where the run went and its final eval metrics.

    ``verbose``: Composer's own console logging too, the warnings
    :data:`dlrecipes.loggers.terminal.HARMLESS_WARNINGS` (hidden otherwise), and the traceback of a
    failure (always written to the run's log when the run directory stays).  ``restart``: the run named
    ``run_name`` is kept under another name and this one starts from the beginning.
    """
    choose_gloo_interface()  # started by a launcher across hosts: gloo's interface is the one reaching the master
    device = resolve_device(config.trainer.device)
    start_torchrun_group(device, config.trainer.dist_timeout)  # each restart's processes among themselves
    config = _named_after_torchrun_job(config, device)
    _check_options(config, resume, restart)
    recipe = config.to_dict()  # the resolved recipe as plain data: compared on resume, written, recorded
    opened = store_for(config.runs_dir).open_for_training(config, recipe, device, resume, restart)
    run, failed = opened.run, True
    try:
        with warnings.catch_warnings(), opened.named():  # errors name a bucket's files by address
            if not verbose:
                from dlrecipes.loggers.terminal import hide_harmless_warnings

                hide_harmless_warnings()
            # under the lock (a live run's files are not touched) and before anything is written: refused here,
            # a resume changes nothing
            point = find_resume_point(run.path, config.trainer.max_duration, trust_checkpoint) \
                if resume and rank() == 0 else None
            if opened.accepted and rank() == 0:
                print(f"resuming {run.name} with changed settings: {', '.join(opened.accepted)}", file=sys.stderr)
            record_recipe(run, recipe, resume)
            result = _fit_in(config, opened, recipe, device, resume, trust_checkpoint, verbose, point)
            failed = False
    except BaseException as exc:
        kept = opened.end(failed=True)
        raised = ended_by(exc, run, kept, verbose)
        if raised is exc:
            raise
        raise raised from exc
    finally:
        if not failed:
            opened.end(failed=False)
    opened.stored(result)  # a run whose files its store lacks: one line, exit code 1
    return result


def _named_after_torchrun_job(config: RecipeConfig, device: str) -> RecipeConfig:
    """Under torchrun, a run without a ``run_name`` is named after the job (rank 0's
    :func:`~dlrecipes.core.distributed.torchrun_job_name`, on every rank), so that each restart of the job continues
    the same run; elsewhere ``config`` as it is."""
    import dataclasses

    from dlrecipes.core.distributed import same_on_all_ranks, torchrun_job_name

    if config.run_name or os.environ.get("TORCHELASTIC_RUN_ID") is None:
        return config
    job = torchrun_job_name() if rank() == 0 else None
    job = same_on_all_ranks(job, device, config.trainer.dist_timeout)
    return dataclasses.replace(config, run_name=f"{config.name}-{job}") if job else config


def _check_options(config: RecipeConfig, resume: bool, restart: bool) -> None:
    """Refuse what cannot go together (:func:`dlrecipes.config.checks.check_train_options`); say what the recipe
    will cost needlessly (before anything is built)."""
    from dlrecipes.config.checks import check_train_options

    if rank() == 0:
        from dlrecipes.data.source_sizes import upsampling_notes

        for note in upsampling_notes(config):
            print(note, file=sys.stderr)
    check_train_options(config, resume, restart)


def _fit_in(config: RecipeConfig, opened: TrainingRun, recipe: dict[str, Any], device: str, resume: bool,
            trust_checkpoint: bool, verbose: bool, point: Path | None) -> TrainResult:
    """Build the run's Trainer (with the callbacks that keep its store in step) and ``fit()`` it; how it ended goes
    to the run's history (summary.json, kept as built), and into the result."""
    run = opened.run
    built = build_trainer(config, run, recipe, device, resume=resume, trust_checkpoint=trust_checkpoint,
                          verbose=verbose, resume_from=point, shown_as=opened.shown_as, in_step=opened.keep_in_step())
    trainer, history = built.trainer, built.history
    _log_lr_scaling(config, trainer)
    finished = resume and trainer.state.get_elapsed_duration() >= 1.0
    if finished:  # e.g. killed after its last checkpoint: nothing left to train
        print(f"{run.name} already finished ({int(trainer.state.timestamp.batch)} batches); nothing to resume",
              file=sys.stderr)
    try:
        if not finished:
            trainer.fit()
    except BaseException as exc:  # summary.json's status and reason, written at close
        history.status = outcome(exc)
        history.reason = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise
    finally:
        trainer.close()
        _report_skipped_images(trainer)
    state = trainer.state
    metrics: dict[str, Any] = {k: float(v) for k, v in state.eval_metric_values.items()}
    return TrainResult(
        run_dir=run.path,
        epochs=int(state.timestamp.epoch),
        batches=int(state.timestamp.batch),
        eval_metrics=metrics,
        seconds=history.wall_time_sec or 0.0,  # summary.json's wall_time_sec
        status=history.status,
        reason=history.reason,
        address=opened.shown_as,
    )
