"""Optimizers and learning-rate schedules: the built-ins, registered by name.

An optimizer factory receives the model positionally (it is not a recipe key) and the recipe's
parameters by keyword.  ``no_decay_norm_and_bias`` puts 1-D parameters (biases and norm
scales) in a group without weight decay, as most ImageNet recipes do.

``fused`` (torch's SGD and AdamW): one kernel for the whole update.  Left unset, the builder
turns it on where the precision says so (``amp_fp16`` on a GPU, :mod:`dlrecipes.core.precision`), where it
matters most: a fused optimizer takes the
gradient scaler's inf/NaN flag on the device, while any other optimizer makes
``GradScaler.step`` read that flag back (a wait for the GPU) every step.

Schedules take their warmup as a duration ('5ep', '200ba', '0.1dur').  They are Composer's
schedulers where Composer has them (its warmup variants when the warmup is not zero);
step-with-warmup and one-cycle live in :mod:`dlrecipes.optim.lr_schedules`.
"""

from __future__ import annotations

from typing import Optional

from dlrecipes.core.durations import Duration, is_zero
from dlrecipes.core.ranges import NonNegative, Positive, PositiveDuration, Probability
from dlrecipes.registry import optimizers, schedulers


def parameter_groups(model, weight_decay: float, no_decay_norm_and_bias: bool):
    """All parameters, or two groups (decayed / not decayed) when excluding norms and biases."""
    if not no_decay_norm_and_bias:
        return [p for p in model.parameters() if p.requires_grad]
    from timm.optim import param_groups_weight_decay

    return param_groups_weight_decay(model, weight_decay)


@optimizers.register("sgd")
def sgd(
    model,
    /,
    lr: Positive = 0.1,
    momentum: Probability = 0.9,
    weight_decay: NonNegative = 5e-4,
    nesterov: bool = False,
    no_decay_norm_and_bias: bool = False,
    fused: Optional[bool] = None,
):
    """torch SGD with momentum; weight decay coupled to the learning rate (L2)."""
    import torch

    groups = parameter_groups(model, weight_decay, no_decay_norm_and_bias)
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, fused=fused)


@optimizers.register("adamw")
def adamw(
    model,
    /,
    lr: Positive = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: Positive = 1e-8,
    weight_decay: NonNegative = 0.01,
    no_decay_norm_and_bias: bool = False,
    fused: Optional[bool] = None,
):
    """torch AdamW."""
    import torch

    groups = parameter_groups(model, weight_decay, no_decay_norm_and_bias)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=fused)


@optimizers.register("decoupled_sgdw")
def decoupled_sgdw(
    model,
    /,
    lr: Positive = 0.1,
    momentum: Probability = 0.9,
    weight_decay: NonNegative = 5e-4,
    dampening: Probability = 0.0,
    nesterov: bool = False,
    no_decay_norm_and_bias: bool = False,
):
    """Composer's DecoupledSGDW: weight decay scaled by the schedule, not by the learning rate."""
    from composer.optim import DecoupledSGDW

    groups = parameter_groups(model, weight_decay, no_decay_norm_and_bias)
    return DecoupledSGDW(
        groups, lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov
    )


@optimizers.register("decoupled_adamw")
def decoupled_adamw(
    model,
    /,
    lr: Positive = 1e-3,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: Positive = 1e-8,
    weight_decay: NonNegative = 1e-5,
    amsgrad: bool = False,
    no_decay_norm_and_bias: bool = False,
):
    """Composer's DecoupledAdamW (decay scaled by the schedule, not by the learning rate)."""
    from composer.optim import DecoupledAdamW

    groups = parameter_groups(model, weight_decay, no_decay_norm_and_bias)
    return DecoupledAdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


@schedulers.register("constant")
def constant(warmup: Duration = "0ba"):
    """Constant learning rate, after an optional linear warmup."""
    from composer.optim import ConstantScheduler, ConstantWithWarmupScheduler

    return ConstantScheduler() if is_zero(warmup) else ConstantWithWarmupScheduler(t_warmup=warmup)


@schedulers.register("linear")
def linear(warmup: Duration = "0ba", alpha_i: NonNegative = 1.0, alpha_f: NonNegative = 0.0):
    """Linear from alpha_i to alpha_f times the base rate over training, after an optional warmup."""
    from composer.optim import LinearScheduler, LinearWithWarmupScheduler

    if is_zero(warmup):
        return LinearScheduler(alpha_i=alpha_i, alpha_f=alpha_f)
    return LinearWithWarmupScheduler(t_warmup=warmup, alpha_i=alpha_i, alpha_f=alpha_f)


@schedulers.register("cosine")
def cosine(warmup: Duration = "0ba", alpha_f: NonNegative = 0.0):
    """Cosine decay to alpha_f times the base rate, after an optional linear warmup."""
    from composer.optim import CosineAnnealingScheduler, CosineAnnealingWithWarmupScheduler

    if is_zero(warmup):
        return CosineAnnealingScheduler(alpha_f=alpha_f)
    return CosineAnnealingWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f)


@schedulers.register("step")
def step(step_size: PositiveDuration = "30ep", gamma: Positive = 0.1, warmup: Duration = "0ba"):
    """Multiply the rate by gamma every step_size, after an optional linear warmup."""
    if is_zero(warmup):
        from composer.optim import StepScheduler

        return StepScheduler(step_size=step_size, gamma=gamma)
    from dlrecipes.optim.lr_schedules import StepWithWarmupScheduler

    return StepWithWarmupScheduler(t_warmup=warmup, step_size=step_size, gamma=gamma)


@schedulers.register("multistep")
def multistep(milestones: list[Duration], gamma: Positive = 0.1, warmup: Duration = "0ba"):
    """Multiply the rate by gamma at each milestone, after an optional linear warmup."""
    from composer.optim import MultiStepScheduler, MultiStepWithWarmupScheduler

    if is_zero(warmup):
        return MultiStepScheduler(milestones=list(milestones), gamma=gamma)
    return MultiStepWithWarmupScheduler(t_warmup=warmup, milestones=list(milestones), gamma=gamma)


@schedulers.register("onecycle")
def onecycle(warmup: Duration = "0.3dur", div_factor: Positive = 25.0, final_div_factor: Positive = 1e4):
    """One-cycle: rise from lr/div_factor to lr over warmup, then cosine down to nearly zero."""
    from dlrecipes.optim.lr_schedules import OneCycleScheduler

    return OneCycleScheduler(t_warmup=warmup, div_factor=div_factor, final_div_factor=final_div_factor)
