"""Composer's algorithms by name.

Each factory's parameters mirror the Composer class's constructor (a test compares
them), minus the batch-key plumbing that a classifier recipe never needs to change.
"""

from __future__ import annotations

from typing import Literal, Optional

from dlrecipes.registry import algorithms
from dlrecipes.schema import Duration


@algorithms.register("channels_last")
def channels_last():
    """Store activations in NHWC memory order (faster convolutions on tensor-core GPUs)."""
    from composer.algorithms import ChannelsLast

    return ChannelsLast()


@algorithms.register("label_smoothing")
def label_smoothing(smoothing: float = 0.1):
    """Blend one-hot targets with the uniform distribution (Szegedy et al. 2016)."""
    from composer.algorithms import LabelSmoothing

    return LabelSmoothing(smoothing=smoothing)


@algorithms.register("blurpool")
def blurpool(replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True, min_channels: int = 16):
    """Anti-aliased downsampling: blur before strided convolutions and max-pools (Zhang 2019)."""
    from composer.algorithms import BlurPool

    return BlurPool(
        replace_convs=replace_convs, replace_maxpools=replace_maxpools, blur_first=blur_first, min_channels=min_channels
    )


@algorithms.register("ema")
def ema(
    half_life: Optional[Duration] = "1000ba",
    smoothing: Optional[float] = None,
    ema_start: Duration = "0.0dur",
    update_interval: Optional[Duration] = None,
):
    """Evaluate with an exponential moving average of the weights."""
    from composer.algorithms import EMA

    return EMA(half_life=half_life, smoothing=smoothing, ema_start=ema_start, update_interval=update_interval)


@algorithms.register("progressive_resizing")
def progressive_resizing(
    mode: Literal["resize", "crop"] = "resize",
    initial_scale: float = 0.5,
    finetune_fraction: float = 0.2,
    delay_fraction: float = 0.5,
    size_increment: int = 4,
    resize_targets: bool = False,
):
    """Train on downscaled images early, growing to full size (Composer resizes decoded batches)."""
    from composer.algorithms import ProgressiveResizing

    return ProgressiveResizing(
        mode=mode,
        initial_scale=initial_scale,
        finetune_fraction=finetune_fraction,
        delay_fraction=delay_fraction,
        size_increment=size_increment,
        resize_targets=resize_targets,
    )


@algorithms.register("mixup")
def mixup(alpha: float = 0.2, interpolate_loss: bool = False):
    """Train on convex combinations of pairs of examples and their labels (Zhang et al. 2017)."""
    from composer.algorithms import MixUp

    return MixUp(alpha=alpha, interpolate_loss=interpolate_loss)


@algorithms.register("cutmix")
def cutmix(alpha: float = 1.0, interpolate_loss: bool = False, uniform_sampling: bool = False):
    """Paste a box from another image and mix the labels by area (Yun et al. 2019)."""
    from composer.algorithms import CutMix

    return CutMix(alpha=alpha, interpolate_loss=interpolate_loss, uniform_sampling=uniform_sampling)


@algorithms.register("cutout")
def cutout(num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False):
    """Zero out random square patches of each image (DeVries & Taylor 2017)."""
    from composer.algorithms import CutOut

    return CutOut(num_holes=num_holes, length=length, uniform_sampling=uniform_sampling)


@algorithms.register("gradient_clipping")
def gradient_clipping(clipping_type: Literal["norm", "value", "adaptive"] = "norm", clipping_threshold: float = 1.0):
    """Clip gradients by global norm, by value, or adaptively (AGC) before each step."""
    from composer.algorithms import GradientClipping

    return GradientClipping(clipping_type=clipping_type, clipping_threshold=clipping_threshold)
