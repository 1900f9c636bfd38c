"""Fit (the fourth stage): a validated recipe -> its run, opened where it lives -> the built Trainer -> ``fit()``.

Where the run lives, its name, lock and resume are the run store's (:mod:`dlrecipes.records.store`: a local folder
or a bucket, chosen from ``runs_dir``); everything the recipe names is built by :mod:`dlrecipes.builders`; how a
training ended is :mod:`dlrecipes.fit.outcome`'s.  This module is the sequence, and what is reported around ``fit()``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any

from dlrecipes.builders import build_trainer
from dlrecipes.config import RecipeConfig
from dlrecipes.core.devices import resolve_device
from dlrecipes.core.distributed import choose_gloo_interface, rank, start_torchrun_group
from dlrecipes.errors import first_line
from dlrecipes.fit.outcome import TrainingFailed, TrainResult, ended_by, outcome
from dlrecipes.records.run_dir import record_recipe
from dlrecipes.records.store import RunOptions, RunStore, TrainingRun, store_for

__all__ = ["RunOptions", "TrainResult", "TrainingFailed", "fit", "open_run"]


def _report_skipped_images(trainer) -> None:
    """Image-folder data with ``bad_images: skip``: say how many unreadable images were left out."""
    for label, loader in (
        ("train", trainer.state.train_dataloader),
        *((e.label, e.dataloader.dataloader) for e in trainer.state.evaluators),
    ):
        flags = getattr(getattr(loader, "dataset", None), "unreadable", None)
        skipped = sum(flags) if flags is not None else 0
        if skipped:
            print(f"warning: {skipped} unreadable image(s) skipped in the {label} data (paths above)", file=sys.stderr)


def joined_torchrun_job(config: RecipeConfig) -> RecipeConfig:
    """Under torchrun, before the run's store checks room for its name: the job's processes started as one group
    (each restart's among themselves), and a run without a ``run_name`` named after the job, the same name on every
    rank (rank 0's :func:`~dlrecipes.core.distributed.torchrun_job_name`), so that each restart of the job continues
    the same run. Elsewhere ``config`` as it is."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is None:
        return config
    from dlrecipes.core.distributed import same_on_all_ranks, torchrun_job_name

    choose_gloo_interface()  # across hosts: gloo's interface is the one reaching the master
    device = resolve_device(config.trainer.device)
    start_torchrun_group(device, config.trainer.dist_timeout)
    if config.run_name:
        return config
    job = same_on_all_ranks(torchrun_job_name() if rank() == 0 else None, device, config.trainer.dist_timeout)
    return dataclasses.replace(config, run_name=f"{config.name}-{job}") if job else config


def open_run(config: RecipeConfig, options: RunOptions = RunOptions(), store: RunStore | None = None) -> TrainingRun:
    """The run ``config`` trains, opened once in its store (``store``: the command's, else ``runs_dir``'s): this
    process among the launcher's (gloo's interface; under torchrun, :func:`joined_torchrun_job` first), the options
    checked, the run named, set up and locked (see :mod:`dlrecipes.records.store`). What :func:`fit` takes."""
    choose_gloo_interface()  # started by a launcher across hosts: gloo's interface is the one reaching the master
    device = resolve_device(config.trainer.device)
    _check_options(config, options)
    return (store or store_for(config.runs_dir)).open_for_training(config, device, options)


def fit(opened: TrainingRun) -> TrainResult:
    """Train the opened run (:func:`open_run`); returns where the run went and its final eval metrics.

    ``opened.options.verbose``: Composer's own console logging too, the warnings
    :data:`dlrecipes.loggers.terminal.HARMLESS_WARNINGS` (hidden otherwise), and the traceback of a
    failure (always written to the run's log when the run directory stays).
    """
    run, options, failed = opened.run, opened.options, True
    try:
        with warnings.catch_warnings(), opened.named():  # errors name a bucket's files by address
            if not options.verbose:
                from dlrecipes.loggers.terminal import hide_harmless_warnings

                hide_harmless_warnings()
            if opened.accepted and rank() == 0:
                print(f"resuming {run.name} with changed settings: {', '.join(opened.accepted)}", file=sys.stderr)
            record_recipe(run, opened.config.to_dict(), options.resume)
            result = _fit_in(opened)
            failed = False
    except BaseException as exc:
        kept = opened.end(failed=True)
        raised = ended_by(exc, run, kept, options.verbose)
        if raised is exc:
            raise
        raise raised from exc
    finally:
        if not failed:
            opened.end(failed=False)
    opened.stored(result)  # a run whose files its store lacks: one line, exit code 1
    return result


def _check_options(config: RecipeConfig, options: RunOptions) -> None:
    """Refuse what cannot go together (:meth:`~dlrecipes.records.store.RunOptions.check`); say what the recipe
    will cost needlessly (before anything is built)."""
    if rank() == 0:
        from dlrecipes.data.source_sizes import upsampling_notes

        for note in upsampling_notes(config):
            print(note, file=sys.stderr)
    options.check(config)


def _fit_in(opened: TrainingRun) -> TrainResult:
    """Build the run's Trainer (with the callbacks that keep its store in step) and ``fit()`` it; how it ended goes
    to the run's history (summary.json, written by the RunHistory callback), and into the result."""
    run, resume = opened.run, opened.options.resume
    built = build_trainer(opened)
    trainer, history = built.trainer, built.history
    finished = resume and trainer.state.get_elapsed_duration() >= 1.0
    if finished:  # e.g. killed after its last checkpoint: nothing left to train
        print(
            f"{run.name} already finished ({int(trainer.state.timestamp.batch)} batches); nothing to resume",
            file=sys.stderr,
        )
    try:
        if not finished:
            trainer.fit()
    except BaseException as exc:  # summary.json's status and reason, written at close
        history.status = outcome(exc)
        history.reason = first_line(exc)
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
