"""Built-in callbacks (Composer's), registered by name for the recipe's ``callbacks:`` section."""

from __future__ import annotations

from typing import Literal

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
    patience: str = "1ep",
):
    """Stop when the monitored metric has not improved by min_delta for `patience` (e.g. '3ep')."""
    from composer.callbacks import EarlyStopper

    return EarlyStopper(
        monitor=monitor, dataloader_label=split, comp=_comparison(mode), min_delta=min_delta, patience=patience
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
