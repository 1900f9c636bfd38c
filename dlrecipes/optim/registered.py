"""Optimizers and learning-rate schedules: the built-ins, registered by name.

An optimizer factory receives the model positionally (it is not a recipe key) and the recipe's
parameters by keyword.  ``no_decay_norm_and_bias`` puts 1-D parameters (biases and norm
scales) in a group without weight decay, as most ImageNet recipes do.

``fused`` (torch's SGD and AdamW): one kernel for the whole update.  Left unset, the builder
turns it on where the precision says so (``amp_fp16`` on a GPU, :mod:`dlrecipes.core.precision`), where it
matters most: a fused optimizer takes the
gradient scaler's inf/NaN flag on the device, while any other optimizer makes
``GradScaler.step`` read that flag back (a wait for the GPU) every step.

timm's optimizers are registered by name from a shipped table of their signatures (``lamb``,
``lars``, ``lion``, ``rmsproptf``, ``adabelief``, ``adopt``, ...; :mod:`dlrecipes.optim.timm_optim`).

Schedules take their warmup as a duration ('5ep', '200ba', '0.1dur').  They are Composer's
schedulers where Composer has them (its warmup variants when the warmup is not zero);
step-with-warmup, one-cycle and timm's cosine and step (``timm_cosine``, ``timm_step``: what
Composer's lack) live in :mod:`dlrecipes.optim.lr_schedules`.
"""

from __future__ import annotations

from typing import Optional

from dlrecipes.core.durations import Duration, is_zero
from dlrecipes.core.ranges import AtLeastOne, NonNegative, Positive, PositiveDuration, Probability
from dlrecipes.optim.timm_optim import register_all as register_timm_optimizers
from dlrecipes.optim.groups import parameter_groups
from dlrecipes.registry import optimizers, schedulers


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


# timm's optimizers by name (lamb, lars, lion, rmsproptf, adabelief, adopt, ...): signatures from the shipped
# table, timm imported only to build one (dlrecipes.optim.timm_optim)
register_timm_optimizers(optimizers)


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


@schedulers.register("timm_cosine")
def timm_cosine(
    warmup: Duration = "0ba",
    warmup_lr_init: NonNegative = 0.0,
    lr_min: NonNegative = 0.0,
    cycle: PositiveDuration = "1dur",
    cycle_mul: Positive = 1.0,
    cycle_decay: Positive = 1.0,
    cycle_limit: AtLeastOne = 1,
    k_decay: Positive = 1.0,
    warmup_prefix: bool = False,
    per_epoch: bool = False,
):
    """timm's cosine: warmup from warmup_lr_init, absolute lr_min, restarts with decay, k-decay (else use cosine)."""
    from dlrecipes.optim.lr_schedules import TimmScheduler

    return TimmScheduler("cosine", {"warmup_t": warmup, "t_initial": cycle}, per_epoch=per_epoch,
                         warmup_lr_init=warmup_lr_init, lr_min=lr_min, cycle_mul=cycle_mul, cycle_decay=cycle_decay,
                         cycle_limit=cycle_limit, k_decay=k_decay, warmup_prefix=warmup_prefix)


@schedulers.register("timm_step")
def timm_step(
    decay: PositiveDuration = "30ep",
    decay_rate: Positive = 0.1,
    warmup: Duration = "0ba",
    warmup_lr_init: NonNegative = 0.0,
    warmup_prefix: bool = True,
    per_epoch: bool = False,
):
    """timm's step: times decay_rate every decay, warmup from warmup_lr_init (else use step)."""
    from dlrecipes.optim.lr_schedules import TimmScheduler

    return TimmScheduler("step", {"warmup_t": warmup, "decay_t": decay}, per_epoch=per_epoch,
                         decay_rate=decay_rate, warmup_lr_init=warmup_lr_init, warmup_prefix=warmup_prefix)
