"""Built-in callbacks (Composer's), registered by name for the recipe's ``callbacks:`` section."""

from __future__ import annotations

from typing import Literal, Optional

from dlrecipes.callbacks.export_options import EXPORT_FORMATS, check_export
from dlrecipes.errors import RecipeError
from dlrecipes.registry import callbacks


def _comparison(mode: str):
    import torch

    return torch.greater if mode == "max" else torch.less


@callbacks.register("lr_monitor")
def lr_monitor():
    """Log each optimizer parameter group's learning rate every batch."""
    from composer.callbacks import LRMonitor

    return LRMonitor()


@callbacks.register("speed_monitor")
def speed_monitor(window_size: int = 100):
    """Log throughput (samples and batches per second) and wall-clock time."""
    from composer.callbacks import SpeedMonitor

    return SpeedMonitor(window_size=window_size)


@callbacks.register("memory_monitor")
def memory_monitor():
    """Log GPU memory statistics (allocated, reserved, peak) each batch (no-op on CPU)."""
    from composer.callbacks import MemoryMonitor

    return MemoryMonitor()


@callbacks.register("early_stopping")
def early_stopping(
    monitor: str = "top1",
    split: Literal["eval", "train"] = "eval",
    mode: Literal["max", "min"] = "max",
    min_delta: float = 0.0,
    patience: int = 3,
):
    """Stop after `patience` epochs in which the metric did not improve by more than min_delta."""
    from composer.callbacks import EarlyStopper

    if patience < 1:
        raise RecipeError(f"callbacks.early_stopping.patience: must be at least 1 epoch, got {patience}")
    # Composer stops once more than `patience` epochs passed since the best; ours counts the epochs without improvement
    return EarlyStopper(
        monitor=monitor, dataloader_label=split, comp=_comparison(mode), min_delta=min_delta, patience=f"{patience - 1}ep"
    )


@callbacks.register("threshold_stopper")
def threshold_stopper(
    threshold: float,
    monitor: str = "top1",
    split: Literal["eval", "train"] = "eval",
    mode: Literal["max", "min"] = "max",
    stop_on_batch: bool = False,
):
    """Stop as soon as the monitored metric reaches the threshold."""
    from composer.callbacks import ThresholdStopper

    return ThresholdStopper(
        monitor=monitor, dataloader_label=split, threshold=threshold, comp=_comparison(mode), stop_on_batch=stop_on_batch
    )


@callbacks.register("nan_monitor")
def nan_monitor(run_dir, /, action: Literal["stop", "skip"] = "stop", max_skips: int = 10):
    """Stop at a NaN/inf loss naming the batch (checkpoints kept), or skip that step's update."""
    from dlrecipes.callbacks.monitors import NaNMonitor
    from dlrecipes.records.layout import RunDir

    return NaNMonitor(RunDir(run_dir).checkpoints, action=action, max_skips=max_skips)


@callbacks.register("torch_profiler")
def torch_profiler(
    run_dir,
    /,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = False,
):
    """torch.profiler traces for a window of batches, written to <run dir>/profiler."""
    from dlrecipes.callbacks.monitors import TorchProfilerTraces
    from dlrecipes.records.layout import RunDir

    return TorchProfilerTraces(
        RunDir(run_dir).profiler, wait=wait, warmup=warmup, active=active, repeat=repeat,
        record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
    )


@callbacks.register("best_checkpoint")
def best_checkpoint(run_dir, /, monitor: str = "top1", mode: Literal["max", "min"] = "max"):
    """Keep best.pt (and best.json) in <run dir>/checkpoints by an eval metric (also: checkpoint.monitor)."""
    from dlrecipes.callbacks.keep_best import BestCheckpoint
    from dlrecipes.records.layout import RunDir

    return BestCheckpoint(RunDir(run_dir).checkpoints, monitor=monitor, mode=mode)


@callbacks.register("optuna_trial")
def optuna_trial(run=None, /, *, storage: str, study: str, trial: int, monitor: str = "top1", startup_trials: int = 5,
                 warmup_evaluations: int = 1):
    """Report the eval metric to an Optuna trial after each evaluation and stop when the median pruner prunes
    it (added by `dlrecipes sweep --search optuna`; needs the optuna extra)."""
    from dlrecipes.callbacks.optuna_trial import OptunaTrial, import_optuna

    if startup_trials < 0 or warmup_evaluations < 0:
        raise RecipeError("callbacks.optuna_trial: startup_trials and warmup_evaluations are 0 or more")
    import_optuna()  # a missing extra is one line at build time, not a failure after the first epoch
    # a pruned trial's summary.json says so: its history is the run's
    return OptunaTrial(storage, study, trial, monitor, startup_trials, warmup_evaluations,
                       history=run.history if run is not None else None)


@callbacks.register("export", validator=check_export)
def export(
    run_dir,
    run=None,
    /,
    formats: tuple[Literal["torchscript", "onnx"], ...] = EXPORT_FORMATS,
    batch_size: int = 1,
    verify_batch_size: int = 16,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    onnx_opset: Optional[int] = None,
    trial: bool = True,
):
    """At the end: TorchScript/ONNX files in <run dir>/export, checked against the model on eval images."""
    from dlrecipes.callbacks.exporter import ExportForInference
    from dlrecipes.records.layout import RunDir

    exporter = ExportForInference(
        RunDir(run_dir).exports, formats, batch_size=batch_size, verify_batch_size=verify_batch_size,
        atol=atol, rtol=rtol, onnx_opset=onnx_opset, trial=trial,
    )
    if run is not None:  # the data's preprocessing and classes, written beside the model
        exporter.preprocess, exporter.class_names = run.data.preprocess, run.data.class_names
        exporter.num_classes = run.data.num_classes
    return exporter
