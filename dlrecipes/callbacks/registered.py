"""Built-in callbacks (Composer's), registered by name for the recipe's ``callbacks:`` section."""

from __future__ import annotations

from typing import Literal

from dlrecipes.callbacks.export_options import EXPORT_FORMATS, check_export
from dlrecipes.core.ranges import AtLeastOne, AtLeastZero, NonNegative, Positive, Probability
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
def speed_monitor(window_size: AtLeastOne = 100):
    """Log throughput (samples and batches per second) and wall-clock time.

    Args:
        window_size: how many recent batches the throughput is averaged over (a rolling window).
    """
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
    patience: AtLeastOne = 3,
):
    """Stop after `patience` epochs in which the metric did not improve by more than min_delta.

    Args:
        monitor: the metric to watch, as the run names it: one of `metrics:` or 'loss' (with split 'train': one
            of `train_metrics:`), e.g. 'top1' or 'macro_f1'; a task's as '<output>/top1'.
        split: 'eval' watches the value of each evaluation, 'train' the training value (`train_metrics:`; needs
            trainer.train_metrics_interval of 1 or more) at each epoch's end.
        mode: 'max' when a larger value is better (accuracy, F1), 'min' when a smaller one is (a loss).
        min_delta: the smallest change from the best value so far that counts as an improvement, in the metric's
            units; 0 counts any improvement.
        patience: epochs in a row without an improvement before training stops (at least 1).
    """
    from composer.callbacks import EarlyStopper

    # Composer stops once more than `patience` epochs passed since the best; ours counts the epochs without improvement
    return EarlyStopper(
        monitor=monitor,
        dataloader_label=split,
        comp=_comparison(mode),
        min_delta=min_delta,
        patience=f"{patience - 1}ep",
    )


@callbacks.register("threshold_stopper")
def threshold_stopper(
    threshold: float,
    monitor: str = "top1",
    split: Literal["eval", "train"] = "eval",
    mode: Literal["max", "min"] = "max",
    stop_on_batch: bool = False,
):
    """Stop as soon as the monitored metric reaches the threshold.

    Args:
        threshold: the value that ends training once the metric passes it (strictly above it with mode 'max',
            below it with 'min').
        monitor: the metric to watch, as the run names it: one of `metrics:` or 'loss' (with split 'train': one
            of `train_metrics:`), e.g. 'top1' or 'macro_f1'; a task's as '<output>/top1'.
        split: 'eval' watches the value of each evaluation, 'train' the training value (`train_metrics:`; needs
            trainer.train_metrics_interval of 1 or more) at each epoch's end.
        mode: 'max' when a larger value is better (accuracy, F1), 'min' when a smaller one is (a loss).
        stop_on_batch: also compare after every training batch, not only at epoch ends and evaluations (has an
            effect with split 'train' only).
    """
    from composer.callbacks import ThresholdStopper

    return ThresholdStopper(
        monitor=monitor,
        dataloader_label=split,
        threshold=threshold,
        comp=_comparison(mode),
        stop_on_batch=stop_on_batch,
    )


@callbacks.register("nan_monitor")
def nan_monitor(layout, /, action: Literal["stop", "skip"] = "stop", max_skips: AtLeastZero = 10):
    """Stop at a NaN/inf loss naming the batch (checkpoints kept), or skip that step's update.

    Args:
        action: 'stop' ends training at the first NaN/inf loss, before that step's update; 'skip' drops that
            step's gradients, so the update changes nothing, and trains on.
        max_skips: with action 'skip', how many steps may be skipped in all before the run stops anyway.
    """
    from dlrecipes.callbacks.monitors import NaNMonitor

    return NaNMonitor(layout.checkpoints, action=action, max_skips=max_skips)


@callbacks.register("torch_profiler")
def torch_profiler(
    layout,
    /,
    wait: AtLeastZero = 1,
    warmup: AtLeastZero = 1,
    active: AtLeastOne = 3,
    repeat: AtLeastZero = 1,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = False,
):
    """torch.profiler traces for a window of batches, written to <run dir>/profiler.

    Args:
        wait: batches to let pass at the start of each cycle before the profiler starts.
        warmup: batches profiled and then discarded after the wait, so start-up costs stay out of the trace.
        active: batches recorded in each cycle's trace.
        repeat: how many wait/warmup/active cycles to record, a trace file each; 0 cycles until training ends.
        record_shapes: record the shapes of each operator's inputs.
        profile_memory: record the tensor memory each operator allocates and frees.
        with_stack: record the Python source lines that called each operator (bigger traces, more overhead).
    """
    from dlrecipes.callbacks.monitors import TorchProfilerTraces

    return TorchProfilerTraces(
        layout.profiler,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    )


@callbacks.register("best_checkpoint")
def best_checkpoint(layout, /, monitor: str = "top1", mode: Literal["max", "min"] = "max"):
    """Keep best.pt (and best.json) in <run dir>/checkpoints by an eval metric (also: checkpoint.monitor).

    Args:
        monitor: the eval metric to watch, as the run names it: one of `metrics:` or 'loss', e.g. 'top1' or
            'macro_f1'; a task's as '<output>/top1'.
        mode: 'max' when a larger value is better (accuracy, F1), 'min' when a smaller one is (a loss).
    """
    from dlrecipes.callbacks.best_checkpoint import BestCheckpoint

    return BestCheckpoint(layout.checkpoints, monitor=monitor, mode=mode)


@callbacks.register("optuna_trial")
def optuna_trial(
    run=None,
    /,
    *,
    storage: str,
    study: str,
    trial: int,
    monitor: str = "top1",
    startup_trials: AtLeastZero = 5,
    warmup_evaluations: AtLeastZero = 1,
):
    """Report the eval metric to an Optuna trial and stop when the median pruner prunes it.

    Added by `dlrecipes sweep --search optuna` (needs the optuna extra); it reports after each evaluation.

    Args:
        storage: path of the Optuna journal file that holds the study (the sweep's, in its folder).
        study: the name of the Optuna study in that file.
        trial: the number of this run's trial in the study (the sweep creates the trial before the run).
        monitor: the eval metric to watch, as the run names it: one of `metrics:` or 'loss', e.g. 'top1' or
            'macro_f1'; a task's as '<output>/top1'.
        startup_trials: trials of the study that must finish before the median pruner prunes any; 0 prunes from
            the first.
        warmup_evaluations: the first evaluations of each trial, which are never pruned; 0 allows pruning at the
            first.
    """
    from dlrecipes.callbacks.optuna_trial import OptunaTrial, import_optuna

    import_optuna()  # a missing extra is one line at build time, not a failure after the first epoch
    # a pruned trial's summary.json says so: its history is the run's
    return OptunaTrial(
        storage,
        study,
        trial,
        monitor,
        startup_trials,
        warmup_evaluations,
        history=run.history if run is not None else None,
    )


@callbacks.register("export", validator=check_export)
def export(
    layout,
    run=None,
    /,
    formats: tuple[Literal["torchscript", "onnx"], ...] = EXPORT_FORMATS,
    batch_size: int = 1,
    verify_batch_size: int = 16,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    onnx_opset: int | None = None,
    trial: bool = True,
):
    """At the end: TorchScript/ONNX files in <run dir>/export, checked against the model on eval images.

    Args:
        formats: the files to write, each at most once: 'torchscript' (model.torchscript.pt), 'onnx' (model.onnx;
            needs the onnx extra).
        batch_size: images in the example batch the model is traced on for export.
        verify_batch_size: images of the first eval batch (a training batch's without evaluation) the files are
            checked on; more than batch_size also checks the dynamic batch axis.
        atol: the check's absolute tolerance, in output units: each output passes when
            |exported - trained| <= atol + rtol * |trained|.
        rtol: the check's relative tolerance, a fraction of |trained|: each output passes when
            |exported - trained| <= atol + rtol * |trained|.
        onnx_opset: the ONNX operator-set version to write; null: torch.onnx's default.
        trial: also export once at the first training batch (to a temporary folder), so a format the model
            cannot be exported to fails before training rather than after it.
    """
    from dlrecipes.callbacks.export_for_inference import ExportForInference

    exporter = ExportForInference(
        layout.exports,
        formats,
        batch_size=batch_size,
        verify_batch_size=verify_batch_size,
        atol=atol,
        rtol=rtol,
        onnx_opset=onnx_opset,
        trial=trial,
    )
    if run is not None:  # the data's preprocessing and classes, written beside the model
        exporter.preprocess, exporter.class_names = run.data.preprocess, run.data.class_names
        exporter.num_classes = run.data.num_classes
    return exporter


# --- the CIFAR-10 speedruns' techniques (airbench): dlrecipes/callbacks/speedrun.py ---


@callbacks.register("patch_whitening")
def patch_whitening(images: AtLeastOne = 5000, eps: Positive = 5e-4, bias_epochs: AtLeastZero | None = 3):
    """Set the first convolution from the patch whitening of the training images; train its bias a few epochs.

    Args:
        images: how many training images (the first, un-augmented from the device loader) the patches are taken
            from.
        eps: added to each eigenvalue of the patches' second-moment matrix before dividing by its square root;
            larger damps the directions of little variance.
        bias_epochs: epochs the first convolution's bias trains, then it is frozen (airbench: 3); null: never.
    """
    from dlrecipes.callbacks.speedrun import PatchWhitening

    return PatchWhitening(images=images, eps=eps, bias_epochs=bias_epochs)


@callbacks.register("lookahead")
def lookahead(interval: AtLeastOne = 5, decay: Probability = 0.95**5, power: NonNegative = 3.0, final: bool = True):
    """Lookahead weights: every `interval` batches, average into a slow copy and continue from it.

    Args:
        interval: batches between two averagings (airbench: 5).
        decay: the slow copy's share at the end of the run: at batch t of T it is decay * (t / T) ** power
            (airbench: 0.95 ** 5).
        power: exponent of the decay's growth over the run (airbench: 3); 0: decay throughout.
        final: at the last batch the model becomes the slow copy (airbench); false: the weights as trained.
    """
    from dlrecipes.callbacks.speedrun import Lookahead

    return Lookahead(interval=interval, decay=decay, power=power, final=final)


@callbacks.register("batchnorm")
def batchnorm(momentum: Probability | None = None, eps: Positive | None = None, train_weight: bool | None = None):
    """Momentum, eps and a trained or frozen scale for every batch norm of the model; null leaves one as built.

    Args:
        momentum: torch's momentum: the share of each batch's statistics in the running ones (airbench's 0.6,
            the old statistics' share, is torch's 0.4).
        eps: added to the variance before its square root.
        train_weight: train the scale (weight); false keeps it where it is (1 as built) and trains the shift only.
    """
    from dlrecipes.callbacks.speedrun import BatchNormSettings

    return BatchNormSettings(momentum=momentum, eps=eps, train_weight=train_weight)
