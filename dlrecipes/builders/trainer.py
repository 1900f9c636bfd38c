"""Build a run's Trainer: everything a validated recipe names, around the engine (not yet fitted)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes import registry
from dlrecipes.builders.components import (
    build_algorithms,
    build_callbacks,
    build_dataloaders,
    build_datasets,
    build_loggers,
    build_model,
    build_optimizer,
    build_scheduler,
)
from dlrecipes.config import RecipeConfig
from dlrecipes.core import lr_scaling
from dlrecipes.core.devices import on_gpu
from dlrecipes.core.distributed import local_world_size, rank, same_on_all_ranks, world_size
from dlrecipes.core.durations import is_zero
from dlrecipes.core.precision import precision_of
from dlrecipes.core.run_context import RunContext
from dlrecipes.errors import UserError
from dlrecipes.records.checkpoint_safety import tensors_only
from dlrecipes.records.checkpoints import make_saver
from dlrecipes.records.layout import RunDir
from dlrecipes.records.store import TrainingRun
from dlrecipes.registry import build_component

if TYPE_CHECKING:
    from composer.models import ComposerModel
    from torch.utils.data import Dataset

    from dlrecipes.data.splits import DatasetSplits
    from dlrecipes.engine.trainer import Trainer
    from dlrecipes.records.history import RunHistory


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
        algorithms.append(
            build_component(registry.algorithms, "layerwise_lr_decay", {"decay": f.layer_decay}, "finetune.layer_decay")
        )
    return algorithms


def _initial_state(opened: TrainingRun, model):
    """Where the opened run's training starts: a checkpoint for Composer to load in full (``None``: none), or weights
    loaded here.

    ``--resume`` loads the newest complete checkpoint of this run (all of it: optimizer, time, RNG): rank 0's
    ``opened.resume_point``, found by the store as it opened the run (None: the run has none yet), told to the other
    ranks here.  Otherwise ``checkpoint.load_path`` gives initial weights (minus ``load_ignore_keys``);
    ``load_weights_only: false`` hands the whole file to Composer.  Every file is read tensors-only unless the
    options trust it (see :mod:`dlrecipes.records.checkpoint_safety`): read here, or by Composer inside
    :func:`~dlrecipes.records.checkpoint_safety.tensors_only` (:func:`build_trainer`).
    """
    from dlrecipes.records.checkpoint_safety import read_checkpoint
    from dlrecipes.records.checkpoints import load_model_weights, model_weights

    config, run, trust = opened.config, opened.run, opened.options.trust
    ckpt = config.checkpoint
    if opened.options.resume and ckpt.save and not ckpt.best_only:  # (resuming needs periodic checkpoints)
        point = opened.resume_point if rank() == 0 else None
        point = same_on_all_ranks(str(point) if point else "", opened.device, config.trainer.dist_timeout)
        if point:
            if rank() == 0:
                print(f"resuming from {point}", file=sys.stderr)
            return point
        print(f"note: no complete checkpoint in {run.checkpoints} yet; starting from the beginning", file=sys.stderr)
    if not ckpt.load_path:
        return None
    path = Path(ckpt.load_path)
    if not ckpt.load_weights_only:  # the whole state, for Composer to load (checked as it loads: tensors_only)
        return str(path)
    loaded = read_checkpoint(path, trust=trust)
    report = load_model_weights(model, model_weights(loaded, path), path, ckpt.load_ignore_keys, ckpt.load_strict)
    if rank() == 0:
        skipped = report["ignored"] + report["missing"]
        print(
            f"loaded weights from {path}"
            + (f" (not loaded: {', '.join(skipped[:6])}{' ...' if len(skipped) > 6 else ''})" if skipped else ""),
            file=sys.stderr,
        )
    return None


def check_free_space(run: RunDir, model, keep: int) -> None:
    """Refuse to start when the disk cannot hold the checkpoints (weights + optimizer state, about 3x)."""
    import shutil

    from torch.nn.parameter import UninitializedParameter

    tensors = [t for t in [*model.parameters(), *model.buffers()] if not isinstance(t, UninitializedParameter)]
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)  # lazy layers: not sized yet
    needed = 3 * state_bytes * max(1, min(keep, 2) if keep >= 0 else 2)
    run_dir = run.path
    where = next(p for p in (run_dir, *run_dir.parents) if p.exists())  # other ranks may not see it yet
    free = shutil.disk_usage(where).free
    if free < needed:
        raise UserError(
            f"runs_dir: only {free / 2**20:.0f} MiB free at {run_dir}; checkpoints of this model need about "
            f"{needed / 2**20:.0f} MiB. Free some space, choose another runs_dir, or set checkpoint.save=false."
        )


def start_line(opened: TrainingRun, data: DatasetSplits, resuming: bool = False) -> str:
    """What a run prints as it starts (piped too): whether it resumes from a checkpoint, where it goes (its address
    for a run staged here from a bucket), the data, the device, the precision."""
    config, device = opened.config, opened.device

    def size(split: Dataset) -> str:
        try:
            return f"{len(split):,}"
        except TypeError:  # a stream without a length
            return "?"

    classes = f", {data.num_classes} classes" if data.num_classes else ""
    where = device
    if on_gpu(device):
        import torch

        where = f"gpu ({torch.cuda.get_device_name()})"
    processes = world_size()
    nodes = processes // max(local_world_size(), 1)
    spread = f"{processes} processes" + (f" on {nodes} nodes" if nodes > 1 else "") if processes > 1 else "1 process"
    if processes > 1 and os.environ.get("GLOO_SOCKET_IFNAME"):
        spread += f", gloo via {os.environ['GLOO_SOCKET_IFNAME']}"
    where_to = opened.shown_as or opened.run.path
    return (
        f"{'resuming' if resuming else 'run'} {where_to} | {config.dataset.name}: {size(data.train)} train, "
        f"{size(data.eval)} eval samples{classes} | {where}, {config.trainer.precision} | {spread}"
    )


@dataclass(frozen=True)
class BuiltRun:
    """What :func:`build_trainer` built that its caller uses afterwards, kept as it was built."""

    trainer: Trainer  # dlrecipes.engine's, not yet fitted
    history: RunHistory  # the run's, among the trainer's callbacks: how the run ended (summary.json)


def build_trainer(opened: TrainingRun) -> BuiltRun:
    """Everything the opened run's recipe names, built and handed to a Composer Trainer (not yet fitted).

    From ``opened`` (:func:`dlrecipes.fit.open_run`): the recipe (validated, and as plain data: what the run's
    history and trackers record), the resolved device, where the run is written, the checkpoint ``--resume``
    continues from (found by the store as it opened the run), the options (``trust`` allows a full unpickle of the
    checkpoint resumed or loaded, ``checkpoint.load_path``, which otherwise is read tensors-only: see
    :mod:`dlrecipes.records.checkpoint_safety`; ``verbose`` adds Composer's own console logging, its config banner and
    every metric at ``trainer.console_log_interval``), the callbacks that keep the run's store in step (a bucket's
    upload; after every other callback: they store what the others wrote) and how the start line names the run.
    """
    config, layout, device, options = opened.config, opened.run, opened.device, opened.options
    resume, trust = options.resume, options.trust
    data, model = _seeded_model(config)
    ckpt = config.checkpoint
    if ckpt.save:
        check_free_space(layout, model, ckpt.keep)
    periodic = ckpt.save and not ckpt.best_only
    load_path = _initial_state(opened, model)
    loaders = build_dataloaders(data, config.trainer, device, seed=config.trainer.seed, algorithms=config.algorithms)
    run = _run_context(config, layout, device, data)
    callbacks = [*_run_callbacks(config, run, periodic), *opened.keep_in_step()]
    loggers = _loggers(config, run, terminal=start_line(opened, data, bool(resume and load_path)))
    key = "checkpoint.load_path" if ckpt.load_path and load_path == str(Path(ckpt.load_path)) else "--resume"
    with tensors_only(load_path, trust, key):
        trainer, lr = _trainer(
            config,
            layout,
            device,
            model,
            loaders,
            callbacks,
            loggers,
            options.verbose,
            load={"load_path": load_path, "load_strict_model_weights": ckpt.load_strict},
            data=data,
        )
    _log_lr_scaling(config, trainer, lr)
    return BuiltRun(trainer, run.history)


def _log_lr_scaling(config: RecipeConfig, trainer: Trainer, lr: float) -> None:
    """With ``optimizer.scale_lr``: ``lr``, the optimizer's as it was built (scaled to the global batch there),
    logged as hyperparameters and printed once."""
    report = lr_scaling.scaling_report(config.optimizer.params, config.trainer.batch_size, lr)
    if report is None:
        return
    line, hyperparameters = report
    trainer.logger.log_hyperparameters(hyperparameters)
    if rank() == 0:
        print(line, file=sys.stderr)


def build_bench_trainer(opened: TrainingRun, train_loader: Iterable) -> Trainer:
    """The opened run's Trainer for the benchmarks, on ``train_loader`` (batches held in memory): the same
    model, optimizer, algorithms, engine, callbacks and loggers as a run, but no evaluation,
    no checkpoints and no terminal output."""
    config, layout, device = opened.config, opened.run, opened.device
    data, model = _seeded_model(config)
    run = _run_context(config, layout, device, data)
    callbacks = _run_callbacks(config, run, periodic=False)
    trainer, _ = _trainer(
        config,
        layout,
        device,
        model,
        (train_loader, None),
        callbacks,
        _loggers(config, run, terminal=None),
        verbose=False,
        load={},
        max_duration="100000000ba",
    )
    return trainer


def _run_context(config: RecipeConfig, layout: RunDir, device: str, data) -> RunContext:
    """What the run's callbacks and loggers are given as they are built (the recipe as plain data, made here from
    ``config``), its history made here, once."""
    from dlrecipes.records.history import RunHistory
    from dlrecipes.records.provenance import collect, rerun_warnings

    provenance = collect(config, device)
    if rank() == 0:
        for line in rerun_warnings(config, provenance):  # training a run's own recipe.yaml again
            print(line, file=sys.stderr)
    recipe = config.to_dict()
    history = RunHistory(layout, recipe, device, plots=config.plots, provenance=provenance)
    return RunContext(layout.path, recipe, device, data, history, read_every=config.trainer.log_interval, layout=layout)


def _seeded_model(config: RecipeConfig) -> tuple[DatasetSplits, ComposerModel]:
    """The data splits and the wrapped model, built after seeding (so weights and data are seeded)."""
    from composer.utils import reproducibility

    t = config.trainer
    if t.deterministic:
        reproducibility.configure_deterministic_mode()
    reproducibility.seed_all(t.seed)
    data = build_datasets(config.dataset)
    model = build_model(
        config.model, data, config.loss, task=config.task, metrics=config.metrics, train_metrics=config.train_metrics
    )
    return data, model


def _run_callbacks(config: RecipeConfig, run: RunContext, periodic: bool) -> list:
    """The recipe's callbacks (given ``run``: see :mod:`dlrecipes.core.run_context`), then every run's: stopping a
    diverged run, history, periodic saves, stopping on signals, best.pt, report."""
    from dlrecipes.callbacks.best_checkpoint import BestCheckpoint
    from dlrecipes.callbacks.monitors import StopOnDivergence
    from dlrecipes.callbacks.stop_on_signal import StopOnSignal
    from dlrecipes.metrics.report import ClassReport, report_tables

    ckpt, checkpoint_dir, data = config.checkpoint, run.layout.checkpoints, run.data
    callbacks = build_callbacks(config.callbacks, run.layout, run)
    lr = config.optimizer.params.get("lr")  # validation filled the optimizer's default in
    callbacks.append(StopOnDivergence(run.read_every, lr if isinstance(lr, (int, float)) else None))
    callbacks.append(run.history)
    saver = make_saver(checkpoint_dir, ckpt.save_interval, ckpt.keep) if periodic else None
    if saver is not None:
        callbacks.append(saver)
    callbacks.append(StopOnSignal(saver))  # after the saver: a signal at a save point writes once
    best = BestCheckpoint(checkpoint_dir, monitor=ckpt.monitor, mode=ckpt.mode) if ckpt.monitor else None
    if best is not None:
        callbacks.append(best)
    tables = report_tables(config.metrics) if config.task is None else []
    if tables:  # after BestCheckpoint: it tells which evaluation is the best one
        callbacks.append(
            ClassReport(run.layout.report, data.num_classes, data.class_names, tables, best, plots=config.plots)
        )
    return callbacks


def _loggers(config: RecipeConfig, run: RunContext, terminal: str | None) -> list:
    """The recipe's loggers (given ``run``: trackers record the recipe and how the run ended, and read values back
    every ``run.read_every`` batches), the run's log file and, with ``terminal`` (its start line), the terminal
    report (its epoch loss is the epoch's mean, as the run's history records it)."""
    from dlrecipes.loggers.run_log import RunLogFile

    loggers = build_loggers(config.loggers, run.layout, run)
    loggers.append(RunLogFile(filename=str(run.layout.log("{rank}")), log_traces=False, read_every=run.read_every))
    if terminal is not None:
        from dlrecipes.loggers.notebook import make_report

        loggers.append(
            make_report(
                live=config.trainer.progress_bar,
                monitor=config.checkpoint.monitor,
                read_every=run.read_every,
                start_line=terminal,
                history=run.history,
            )
        )
    return loggers


def _trainer_class() -> type[Trainer]:
    """dlrecipes' Trainer (``dlrecipes.engine``), with Composer's questions about the host answered without a process
    of its own and once per process (``core/composer_env.py``: the processor's name, Composer's commit)."""
    from dlrecipes.engine import Trainer
    from dlrecipes.runtime.composer_env import answer_composer_here

    answer_composer_here()
    return Trainer


def _trainer(
    config: RecipeConfig,
    layout: RunDir,
    device: str,
    model: ComposerModel,
    loaders: tuple,
    callbacks: list,
    loggers: list,
    verbose: bool,
    load: dict,
    max_duration: str | None = None,
    data: DatasetSplits | None = None,
) -> tuple[Trainer, float]:
    """The Composer Trainer of the built parts, and the lr its optimizer was built with (the optimizer's default,
    scaled to the global batch with ``optimizer.scale_lr``); an algorithm with ``check_data(data)`` is checked
    against the data here, before the run's start line (distillation's teacher)."""
    Trainer = _trainer_class()
    t = config.trainer
    optimizer = build_optimizer(
        config.optimizer, model, t.batch_size, fused=precision_of(t.precision).fused_optimizer and on_gpu(device)
    )
    lr = optimizer.defaults.get("lr", 0.0)  # (before an algorithm such as SAM wraps the optimizer)
    algorithms = build_algorithms(config.algorithms, layout)
    for algorithm in algorithms:
        if data is not None and callable(getattr(algorithm, "check_data", None)):
            algorithm.check_data(data)
    if config.finetune is not None:
        algorithms += _finetune(config, model, optimizer)
    trainer = Trainer(
        model=model,
        train_dataloader=loaders[0],
        eval_dataloader=loaders[1],
        max_duration=max_duration or t.max_duration,
        eval_interval=t.eval_interval,
        optimizers=optimizer,
        schedulers=build_scheduler(config.scheduler),
        step_schedulers_every_batch=True,
        algorithms=algorithms,
        callbacks=callbacks,
        loggers=loggers,
        run_name=layout.name,
        progress_bar=False,  # dlrecipes.loggers.terminal is among the loggers instead
        log_to_console=verbose,
        console_log_interval=t.console_log_interval,
        train_subset_num_batches=t.train_subset_num_batches,
        eval_subset_num_batches=t.eval_subset_num_batches,
        device=device,
        precision=t.precision,
        device_train_microbatch_size=t.device_train_microbatch_size,
        seed=t.seed,
        deterministic_mode=t.deterministic,
        compile_config=None if t.compile is False else ({} if t.compile is True else t.compile),
        parallelism_config={"fsdp": t.fsdp} if t.fsdp is not None else None,
        train_metrics_interval=t.train_metrics_interval,
        dist_timeout=t.dist_timeout,
        **load,  # resuming, or a full state (load_weights_only: false); weights alone were loaded by _initial_state
    )
    return trainer, lr


def network_algorithms(algorithms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The recipe's algorithms that change the network's modules (registered with ``changes_network=True``):
    an evaluation rebuilds the trained network with them before the checkpoint's weights are loaded. (The rest
    act on training only.)"""
    return {
        name: params
        for name, params in algorithms.items()
        if registry.algorithms.get(name, f"algorithms.{name}").metadata.get("changes_network")
    }


def build_eval_trainer(
    config: RecipeConfig, checkpoint: Path, device: str, callbacks: Sequence[Any] = (), trust: bool = False
) -> tuple[Trainer, DatasetSplits]:
    """The recipe's network with a checkpoint's weights (weights only: no optimizer state, no training step),
    and its evaluation split, in a Trainer for :meth:`Trainer.eval` on ``device`` (resolved by the caller).
    The checkpoint is read tensors-only unless ``trust`` (the caller checked it). Returns (trainer, data)."""
    Trainer = _trainer_class()
    t = config.trainer
    data, model = _seeded_model(config)
    loaders = build_dataloaders(data, t, device, seed=t.seed, algorithms=config.algorithms)
    network = network_algorithms(config.algorithms)
    with tensors_only(checkpoint, trust, "--checkpoint"):
        trainer = Trainer(
            model=model,
            eval_dataloader=loaders[1],
            algorithms=build_algorithms(network),  # no layout: nothing is exported
            callbacks=list(callbacks),
            loggers=[],
            run_name=f"eval-{checkpoint.stem}",
            progress_bar=False,
            log_to_console=False,
            eval_subset_num_batches=t.eval_subset_num_batches,
            device=device,
            precision=t.precision,
            seed=t.seed,
            deterministic_mode=t.deterministic,
            dist_timeout=t.dist_timeout,
            load_path=str(checkpoint),
            load_weights_only=True,
            load_strict_model_weights=True,
        )
    return trainer, data
