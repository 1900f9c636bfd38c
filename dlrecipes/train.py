"""Fit: a validated recipe -> run directory -> Composer Trainer -> ``fit()``."""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from dlrecipes import builders, registry
from dlrecipes.config import RecipeConfig
from dlrecipes.core.distributed import rank, resolve_device, same_on_all_ranks
from dlrecipes.core.durations import is_zero
from dlrecipes.errors import RecipeError, UserError
from dlrecipes.records import run_lock
from dlrecipes.records.checkpoints import CHECKPOINT_DIR, LATEST_CHECKPOINT, make_saver, resume_point
from dlrecipes.records.resume_check import check_resume



@dataclass
class TrainResult:
    run_dir: Path
    epochs: int
    batches: int
    eval_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def choose_run_name(config: RecipeConfig, resume: bool, device: str) -> str:
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


def prepare_run_dir(config: RecipeConfig, run_name: str, resume: bool) -> Path:
    """Create ``runs/<run_name>/`` and write the resolved recipe there (rank 0)."""
    run_dir = Path(config.runs_dir) / run_name
    resolved = yaml.safe_dump(config.to_dict(), sort_keys=False)
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


def _finetune(config: RecipeConfig, model, optimizer) -> list:
    """The ``finetune:`` section: a head lr group now, backbone freezing and layer-wise decay as algorithms."""
    from dlrecipes.algorithms.finetune import FreezeBackbone, head_parameter_names, split_head_group

    f = config.finetune
    net = getattr(model, "module", model)
    head = head_parameter_names(net, f.head)
    split_head_group(net, optimizer, head, f.head_lr)
    algorithms = []
    if not is_zero(f.freeze_backbone):
        algorithms.append(FreezeBackbone(head, f.freeze_backbone))
    if f.layer_decay is not None:
        algorithms.append(registry.algorithms.build("layerwise_lr_decay", decay=f.layer_decay))
    return algorithms


def _initial_state(config: RecipeConfig, model, run_dir: Path, resume: bool, device: str, trust: bool):
    """Where training starts: a checkpoint for Composer to load in full (``None``: none), or weights loaded here.

    Resuming loads the newest complete checkpoint of this run (all of it: optimizer, time,
    RNG).  Otherwise ``checkpoint.load_path`` gives initial weights, read tensors-only where
    the file allows it (minus ``load_ignore_keys``); ``load_weights_only: false`` hands the whole
    file to Composer, which from outside the run directory needs ``trust``.
    """
    from dlrecipes.records.checkpoints import check_trusted, load_model_weights, model_weights, read_checkpoint

    ckpt = config.checkpoint
    if resume:
        point = resume_point(run_dir / CHECKPOINT_DIR) if rank() == 0 else None
        point = same_on_all_ranks(str(point) if point else "", device, config.trainer.dist_timeout)
        if point:
            if rank() == 0:
                print(f"resuming from {point}", file=sys.stderr)
            return point
        print(f"note: no complete checkpoint in {run_dir / CHECKPOINT_DIR} yet; starting from the beginning",
              file=sys.stderr)
    if not ckpt.load_path:
        return None
    path = Path(ckpt.load_path)
    if not ckpt.load_weights_only:  # Composer's loader unpickles fully: check the file first
        check_trusted(path, trusted_dirs=[run_dir], trust=trust)
        return str(path)
    loaded = read_checkpoint(path, trusted_dirs=[run_dir], trust=trust)
    report = load_model_weights(model, model_weights(loaded, path), path, ckpt.load_ignore_keys, ckpt.load_strict)
    if rank() == 0:
        skipped = report["ignored"] + report["missing"]
        print(f"loaded weights from {path}" + (f" (not loaded: {', '.join(skipped[:6])}"
              f"{' ...' if len(skipped) > 6 else ''})" if skipped else ""), file=sys.stderr)
    return None


def check_free_space(run_dir: Path, model, keep: int) -> None:
    """Refuse to start when the disk cannot hold the checkpoints (weights + optimizer state, about 3x)."""
    import shutil

    from torch.nn.parameter import UninitializedParameter

    tensors = [t for t in [*model.parameters(), *model.buffers()] if not isinstance(t, UninitializedParameter)]
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)  # lazy layers: not sized yet
    needed = 3 * state_bytes * max(1, min(keep, 2) if keep >= 0 else 2)
    where = next(p for p in (run_dir, *run_dir.parents) if p.exists())  # other ranks may not see it yet
    free = shutil.disk_usage(where).free
    if free < needed:
        raise UserError(
            f"runs_dir: only {free / 2**20:.0f} MiB free at {run_dir}; checkpoints of this model need about "
            f"{needed / 2**20:.0f} MiB. Free some space, choose another runs_dir, or set checkpoint.save=false."
        )


def build_trainer(config: RecipeConfig, run_dir: Path, resume: bool = False, trust_checkpoint: bool = False,
                  verbose: bool = False):
    """Everything the recipe names, built and handed to a Composer Trainer (not yet fitted).

    ``trust_checkpoint`` allows a full unpickle of a ``checkpoint.load_path`` outside the run
    directory (see :mod:`dlrecipes.records.checkpoints`); ``verbose`` adds Composer's own
    console logging (its config banner and every metric at ``trainer.console_log_interval``).
    """
    device = resolve_device(config.trainer.device)
    data, model = _seeded_model(config)
    ckpt = config.checkpoint
    if ckpt.save:
        check_free_space(run_dir, model, ckpt.keep)
    periodic = ckpt.save and not ckpt.best_only
    load_path = _initial_state(config, model, run_dir, resume and periodic, device, trust_checkpoint)
    loaders = builders.build_dataloaders(data, config.trainer, device, seed=config.trainer.seed,
                                         algorithms=config.algorithms)
    callbacks = _run_callbacks(config, run_dir, device, data, periodic)
    return _trainer(config, run_dir, device, model, loaders, callbacks, _loggers(config, run_dir, terminal=True),
                    verbose, load={"load_path": load_path, "load_strict_model_weights": ckpt.load_strict})


def build_bench_trainer(config: RecipeConfig, run_dir: Path, train_loader: Any):
    """The recipe's Trainer for the benchmarks, on ``train_loader`` (batches held in memory): the same
    model, optimizer, algorithms, engine, callbacks and loggers as a run, but no evaluation,
    no checkpoints and no terminal output."""
    device = resolve_device(config.trainer.device)
    data, model = _seeded_model(config)
    callbacks = _run_callbacks(config, run_dir, device, data, periodic=False)
    return _trainer(config, run_dir, device, model, (train_loader, None), callbacks,
                    _loggers(config, run_dir, terminal=False), verbose=False, load={}, max_duration="100000000ba")


def _seeded_model(config: RecipeConfig):
    """The data splits and the wrapped model, built after seeding (so weights and data are seeded)."""
    from composer.utils import reproducibility

    t = config.trainer
    if t.deterministic:
        reproducibility.configure_deterministic_mode()
    reproducibility.seed_all(t.seed)
    data = builders.build_datasets(config.dataset)
    model = builders.build_model(config.model, data, config.loss, task=config.task, metrics=config.metrics,
                                 train_metrics=config.train_metrics)
    return data, model


def _run_callbacks(config: RecipeConfig, run_dir: Path, device: str, data, periodic: bool) -> list:
    """The recipe's callbacks, then every run's: history, periodic saves, stopping on signals, best.pt, report."""
    from dlrecipes.callbacks.keep_best import BestCheckpoint
    from dlrecipes.callbacks.preemption import StopOnSignal
    from dlrecipes.metrics.report import ClassReport, report_tables
    from dlrecipes.records.history import RunHistory

    ckpt, checkpoint_dir = config.checkpoint, run_dir / CHECKPOINT_DIR
    callbacks = builders.build_callbacks(config.callbacks, run_dir)
    callbacks.append(RunHistory(run_dir, config.to_dict(), device))
    saver = make_saver(checkpoint_dir, ckpt.save_interval, ckpt.keep) if periodic else None
    if saver is not None:
        callbacks.append(saver)
    callbacks.append(StopOnSignal(saver))  # after the saver: a signal at a save point writes once
    best = BestCheckpoint(checkpoint_dir, monitor=ckpt.monitor, mode=ckpt.mode) if ckpt.monitor else None
    if best is not None:
        callbacks.append(best)
    tables = report_tables(config.metrics) if config.task is None else []
    if tables:  # after BestCheckpoint: it tells which evaluation is the best one
        callbacks.append(ClassReport(run_dir, data.num_classes, data.class_names, tables, best))
    return callbacks


def _loggers(config: RecipeConfig, run_dir: Path, terminal: bool) -> list:
    from dlrecipes.loggers.run_log import RunLogFile

    from dlrecipes.loggers.read_back import ReadsAtInterval

    loggers = builders.build_loggers(config.loggers, run_dir)
    read_every = config.trainer.log_interval  # batches between loss read-backs
    for logger in loggers:
        if isinstance(logger, ReadsAtInterval):
            logger.read_every = read_every
    loggers.append(RunLogFile(filename=str(run_dir / "train-rank{rank}.log"), log_traces=False, read_every=read_every))
    if terminal:
        from dlrecipes.loggers.terminal import TerminalReport

        loggers.append(TerminalReport(live=config.trainer.progress_bar, monitor=config.checkpoint.monitor,
                                      read_every=read_every))
    return loggers


def _trainer(config: RecipeConfig, run_dir: Path, device: str, model, loaders: tuple, callbacks: list,
             loggers: list, verbose: bool, load: dict, max_duration: Optional[str] = None):
    from dlrecipes.engine import Trainer

    t = config.trainer
    optimizer = builders.build_optimizer(config.optimizer, model, t.batch_size,
                                         fused=t.precision == "amp_fp16" and device == "gpu")
    algorithms = builders.build_algorithms(config.algorithms, loaders[0], run_dir)
    if config.finetune is not None:
        algorithms += _finetune(config, model, optimizer)
    return Trainer(
        model=model, train_dataloader=loaders[0], eval_dataloader=loaders[1],
        max_duration=max_duration or t.max_duration, eval_interval=t.eval_interval,
        optimizers=optimizer, schedulers=builders.build_scheduler(config.scheduler), step_schedulers_every_batch=True,
        algorithms=algorithms, callbacks=callbacks, loggers=loggers, run_name=run_dir.name,
        progress_bar=False,  # dlrecipes.loggers.terminal is among the loggers instead
        log_to_console=verbose, console_log_interval=t.console_log_interval,
        train_subset_num_batches=t.train_subset_num_batches, eval_subset_num_batches=t.eval_subset_num_batches,
        device=device, precision=t.precision, device_train_microbatch_size=t.device_train_microbatch_size,
        seed=t.seed, deterministic_mode=t.deterministic,
        compile_config=None if t.compile is False else ({} if t.compile is True else t.compile),
        parallelism_config={"fsdp": t.fsdp} if t.fsdp is not None else None,
        train_metrics_interval=t.train_metrics_interval, dist_timeout=t.dist_timeout,
        **load,  # resuming, or a trusted full checkpoint; weights alone were loaded by _initial_state
    )


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
    if resume:  # before anything is built or written
        accepted = check_resume(run_dir, config.to_dict())
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
            return _train_in(config, prepare_run_dir(config, run_name, resume), device, resume, trust_checkpoint,
                             started, verbose)
    except BaseException:
        if fresh and not started and lock is not None:  # failed before training: leave no run directory behind
            lock.release()
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.release()


def _train_in(config: RecipeConfig, run_dir: Path, device: str, resume: bool, trust_checkpoint: bool,
              started: list, verbose: bool = False) -> TrainResult:
    start = time.perf_counter()
    trainer = build_trainer(config, run_dir, resume=resume, trust_checkpoint=trust_checkpoint, verbose=verbose)
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
