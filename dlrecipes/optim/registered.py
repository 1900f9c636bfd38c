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

from collections.abc import Callable
from typing import Annotated, Any, Literal

from dlrecipes.core.durations import Duration, is_zero
from dlrecipes.core.param_docs import Doc
from dlrecipes.core.ranges import AtLeastOne, NonNegative, Positive, PositiveDuration, Probability
from dlrecipes.errors import RecipeError
from dlrecipes.optim.groups import norm_bias_scaled, parameter_groups
from dlrecipes.optim.timm_optim import register_all as register_timm_optimizers
from dlrecipes.registry import build_component, optimizers, schedulers


@optimizers.register("sgd")
def sgd(
    model,
    /,
    lr: Positive = 0.1,
    momentum: Probability = 0.9,
    weight_decay: NonNegative = 5e-4,
    nesterov: bool = False,
    no_decay_norm_and_bias: bool = False,
    fused: bool | None = None,
    norm_lr_scale: Positive = 1.0,
):
    """torch SGD with momentum; weight decay coupled to the learning rate (L2).

    Args:
        lr: base learning rate: the schedule multiplies it at every step (it is the rate at multiplier 1.0).
        momentum: momentum factor: the buffer becomes momentum * buffer + gradient and the step follows it; 0 for
            plain SGD.
        weight_decay: L2 penalty: weight_decay * weights is added to the gradient, so the decay scales with the lr;
            0 for none.
        nesterov: Nesterov momentum: step along gradient + momentum * buffer instead of along the buffer alone.
        no_decay_norm_and_bias: put 1-D parameters (biases, norm scales) in a group with weight_decay 0, as
            most ImageNet recipes do; false decays every parameter.
        fused: one fused kernel for the whole update (GPU); null (the default) turns it on for amp_fp16 on a
            GPU and leaves it off otherwise.
        norm_lr_scale: the trainable batch-norm parameters train at this many times lr, their weight decay
            divided by it so that it decays them as much as the rest (airbench's bias_scaler: 64); 1: as the rest.
    """
    import torch

    groups = norm_bias_scaled(
        parameter_groups(model, weight_decay, no_decay_norm_and_bias), model, lr, weight_decay, norm_lr_scale
    )
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
    fused: bool | None = None,
):
    """torch AdamW.

    Args:
        lr: base learning rate: the schedule multiplies it at every step (it is the rate at multiplier 1.0).
        betas: (beta1, beta2): decay rates of the running averages of the gradient and of the squared gradient;
            closer to 1 averages over more steps (about 1 / (1 - beta)).
        eps: small constant added to the denominator (the root of the squared-gradient average) to keep it finite.
        weight_decay: decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay, apart from
            the gradient update; 0 for none.
        no_decay_norm_and_bias: put 1-D parameters (biases, norm scales) in a group with weight_decay 0, as
            most ImageNet recipes do; false decays every parameter.
        fused: one fused kernel for the whole update (GPU); null (the default) turns it on for amp_fp16 on a
            GPU and leaves it off otherwise.
    """
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
    """Composer's DecoupledSGDW: weight decay scaled by the schedule, not by the learning rate.

    Args:
        lr: base learning rate: the schedule multiplies it at every step (it is the rate at multiplier 1.0).
        momentum: momentum factor: the buffer becomes momentum * buffer + (1 - dampening) * gradient and the step
            follows it; 0 for plain SGD.
        weight_decay: decoupled weight decay that follows the schedule, not the lr: each step multiplies the
            weights by 1 - weight_decay * (the schedule's multiplier), so it is about lr times smaller than
            sgd's for the same decay; 0 for none.
        dampening: share of each gradient left out of the momentum buffer; 0 for none, as nesterov needs.
        nesterov: Nesterov momentum: step along gradient + momentum * buffer instead of along the buffer alone.
        no_decay_norm_and_bias: put 1-D parameters (biases, norm scales) in a group with weight_decay 0, as
            most ImageNet recipes do; false decays every parameter.
    """
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
    """Composer's DecoupledAdamW (decay scaled by the schedule, not by the learning rate).

    Args:
        lr: base learning rate: the schedule multiplies it at every step (it is the rate at multiplier 1.0).
        betas: (beta1, beta2): decay rates of the running averages of the gradient and of the squared gradient;
            closer to 1 averages over more steps (about 1 / (1 - beta)).
        eps: small constant added to the denominator (the root of the squared-gradient average) to keep it finite.
        weight_decay: decoupled weight decay that follows the schedule, not the lr: each step multiplies the
            weights by 1 - weight_decay * (the schedule's multiplier), so it is about lr times smaller than
            adamw's for the same decay; 0 for none.
        amsgrad: AMSGrad: divide by the running maximum of the squared-gradient average instead of its current
            value, so no parameter's step size grows back.
        no_decay_norm_and_bias: put 1-D parameters (biases, norm scales) in a group with weight_decay 0, as
            most ImageNet recipes do; false decays every parameter.
    """
    from composer.optim import DecoupledAdamW

    groups = parameter_groups(model, weight_decay, no_decay_norm_and_bias)
    return DecoupledAdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


def _check_other(params: dict[str, Any], path: str) -> None:
    """``other`` names a registered optimizer (not muon) with that optimizer's keys."""
    from dlrecipes.config.checks import check_component

    other = params.get("other")
    if other is None:
        return
    component = check_component(other, f"{path}.other", optimizers)
    if component.name == "muon":
        raise RecipeError(f"{path}.other.name: the second optimizer cannot be muon itself (e.g. sgd or adamw)")


def _other_builder(other: dict[str, Any] | None) -> Callable:
    """``other`` built over the parameters Muon does not step: the optimizer it names with its keys; null: adamw."""
    other = dict(other or {"name": "adamw"})
    name = other.pop("name")
    return lambda subset: build_component(optimizers, name, other, "optimizer.other.name", model=subset)


# Muon's choices, each value's meaning beside it (dlrecipes.core.param_docs)
NsCoefficients = Annotated[
    Literal["quintic", "original", "polar_express", "polar_express_safer"],
    Doc(
        "coefficients of the Newton-Schulz iterations: 'quintic' (5 tuned steps), 'original' (Keller Jordan's 3.4445, "
        "-4.7750, 2.0315 at every step), 'polar_express' or 'polar_express_safer'."
    ),
]
AdjustLrFn = Annotated[
    Literal["match_rms_adamw", "rms_to_rms", "original"] | None,
    Doc(
        "per-shape lr scale of a filter's matrix (out, in): 'match_rms_adamw' (0.2 * sqrt(max(out, in)): an AdamW-like "
        "update RMS), 'rms_to_rms' (sqrt(out / in)), 'original' (sqrt(max(1, out / in))); null for none, as "
        "airbench94_muon."
    ),
]
ConvMode = Annotated[
    Literal["flatten", "batched"],
    Doc(
        "how a conv filter (out, in, kh, kw) becomes a matrix: 'flatten' to (out, in * kh * kw), "
        "as airbench94_muon, or "
        "'batched', each kernel position's (out, in) slice orthogonalized alone."
    ),
]


@optimizers.register("muon", validator=_check_other)
def muon(
    model,
    /,
    lr: Positive = 0.02,
    momentum: Probability = 0.95,
    nesterov: bool = True,
    weight_decay: NonNegative = 0.0,
    ns_steps: AtLeastOne = 5,
    ns_coefficients: NsCoefficients = "quintic",
    adjust_lr_fn: AdjustLrFn = "match_rms_adamw",
    conv_mode: ConvMode = "flatten",
    normalize_weights: bool = False,
    head: str | None = "auto",
    head_lr: Positive | None = None,
    head_weight_decay: NonNegative | None = None,
    other: dict[str, Any] | None = None,
):
    """Muon (timm's update) on every filter and weight matrix, a second optimizer (other) on the rest.

    Args:
        lr: base learning rate of the orthogonalized filter updates (scaled per shape by adjust_lr_fn); the
            schedule multiplies it and the second optimizer's alike. scale_lr rescales this lr only.
        momentum: decay rate of the gradient's running average that is orthogonalized.
        nesterov: orthogonalize gradient + momentum * (buffer - gradient) instead of the buffer.
        weight_decay: decoupled weight decay of the filters: each step multiplies them by 1 - lr * weight_decay;
            0 for none (the second optimizer has its own).
        ns_steps: Newton-Schulz iterations that orthogonalize the update (more: closer to orthogonal, slower);
            airbench94_muon uses 3 with 'original'.
        normalize_weights: before each update, rescale every filter to the Frobenius norm sqrt(out channels)
            (airbench94_muon), so the orthogonalized step keeps one size relative to the filter.
        head: the classifier's head, kept out of Muon and stepped by the second optimizer: 'auto' (the
            network's last Linear, as airbench94_muon excludes its head), the name of a module (e.g.
            'model.fc'), or null (every matrix to Muon).
        head_lr: the head's learning rate in the second optimizer; null: the second optimizer's lr.
        head_weight_decay: the head's weight decay in the second optimizer; null: the second optimizer's.
        other: the second optimizer, for every trainable parameter Muon does not step (biases, norm scales,
            1-D parameters, the head): a registered optimizer with its keys, e.g. {name: sgd, lr: 0.05,
            momentum: 0.85, nesterov: true}; null: {name: adamw} at its defaults.
    """
    from dlrecipes.optim.muon import build_muon

    settings = {
        "lr": lr,
        "momentum": momentum,
        "nesterov": nesterov,
        "weight_decay": weight_decay,
        "ns_steps": ns_steps,
        "ns_coefficients": ns_coefficients,
        "adjust_lr_fn": adjust_lr_fn,
        "conv_mode": conv_mode,
        "normalize_weights": normalize_weights,
    }
    return build_muon(model, settings, _other_builder(other), head, head_lr, head_weight_decay)


# timm's optimizers by name (lamb, lars, lion, rmsproptf, adabelief, adopt, ...): signatures from the shipped
# table, timm imported only to build one (dlrecipes.optim.timm_optim)
register_timm_optimizers(optimizers)


@schedulers.register("constant")
def constant(warmup: Duration = "0ba"):
    """Constant learning rate, after an optional linear warmup.

    Args:
        warmup: duration of the linear warmup from 0 to the base lr, e.g. '2ep', '500ba' or '0.05dur' (a share of
            the run); '0ba' for none.
    """
    from composer.optim import ConstantScheduler, ConstantWithWarmupScheduler

    return ConstantScheduler() if is_zero(warmup) else ConstantWithWarmupScheduler(t_warmup=warmup)


@schedulers.register("linear")
def linear(warmup: Duration = "0ba", alpha_i: NonNegative = 1.0, alpha_f: NonNegative = 0.0):
    """Linear from alpha_i to alpha_f times the base rate over training, after an optional warmup.

    Args:
        warmup: duration of the linear warmup from 0 to alpha_i times the base lr, e.g. '2ep', '500ba' or
            '0.05dur' (a share of the run); '0ba' for none.
        alpha_i: multiplier of the base lr where the linear ramp starts (after the warmup).
        alpha_f: multiplier of the base lr the ramp reaches at the end of training (0: down to zero).
    """
    from composer.optim import LinearScheduler, LinearWithWarmupScheduler

    if is_zero(warmup):
        return LinearScheduler(alpha_i=alpha_i, alpha_f=alpha_f)
    return LinearWithWarmupScheduler(t_warmup=warmup, alpha_i=alpha_i, alpha_f=alpha_f)


@schedulers.register("cosine")
def cosine(warmup: Duration = "0ba", alpha_f: NonNegative = 0.0):
    """Cosine decay to alpha_f times the base rate, after an optional linear warmup.

    Args:
        warmup: duration of the linear warmup from 0 to the base lr, e.g. '2ep', '500ba' or '0.05dur' (a share of
            the run); '0ba' for none.
        alpha_f: multiplier of the base lr the cosine reaches at the end of training (0: down to zero).
    """
    from composer.optim import CosineAnnealingScheduler, CosineAnnealingWithWarmupScheduler

    if is_zero(warmup):
        return CosineAnnealingScheduler(alpha_f=alpha_f)
    return CosineAnnealingWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f)


@schedulers.register("step")
def step(step_size: PositiveDuration = "30ep", gamma: Positive = 0.1, warmup: Duration = "0ba"):
    """Multiply the rate by gamma every step_size, after an optional linear warmup.

    Args:
        step_size: interval between two decays, e.g. '30ep' or '1000ba', counted from the end of the warmup.
        gamma: factor the rate is multiplied by at each step_size (0.1: down to a tenth).
        warmup: duration of the linear warmup from 0 to the base lr, e.g. '2ep', '500ba' or '0.05dur' (a share of
            the run); '0ba' for none.
    """
    if is_zero(warmup):
        from composer.optim import StepScheduler

        return StepScheduler(step_size=step_size, gamma=gamma)
    from dlrecipes.optim.lr_schedules import StepWithWarmupScheduler

    return StepWithWarmupScheduler(t_warmup=warmup, step_size=step_size, gamma=gamma)


@schedulers.register("multistep")
def multistep(milestones: list[Duration], gamma: Positive = 0.1, warmup: Duration = "0ba"):
    """Multiply the rate by gamma at each milestone, after an optional linear warmup.

    Args:
        milestones: times at which the rate is multiplied by gamma, counted from the start of training, e.g.
            ['30ep', '60ep', '80ep'].
        gamma: factor the rate is multiplied by at each milestone (0.1: down to a tenth).
        warmup: duration of the linear warmup from 0 to the base lr, e.g. '2ep', '500ba' or '0.05dur' (a share of
            the run); '0ba' for none.
    """
    from composer.optim import MultiStepScheduler, MultiStepWithWarmupScheduler

    if is_zero(warmup):
        return MultiStepScheduler(milestones=list(milestones), gamma=gamma)
    return MultiStepWithWarmupScheduler(t_warmup=warmup, milestones=list(milestones), gamma=gamma)


@schedulers.register("onecycle")
def onecycle(warmup: Duration = "0.3dur", div_factor: Positive = 25.0, final_div_factor: Positive = 1e4):
    """One-cycle: rise from lr/div_factor to lr over warmup, then cosine down to nearly zero.

    Args:
        warmup: duration of the half-cosine rise from lr / div_factor to the peak lr, e.g. '0.3dur' (30% of the
            run) or '5ep'; the rest of the run is the cosine descent.
        div_factor: the rate starts at lr / div_factor.
        final_div_factor: the rate ends at lr / (div_factor * final_div_factor).
    """
    from dlrecipes.optim.lr_schedules import OneCycleScheduler

    return OneCycleScheduler(t_warmup=warmup, div_factor=div_factor, final_div_factor=final_div_factor)


@schedulers.register("triangle")
def triangle(start: NonNegative = 0.2, peak: Probability = 0.23, end: NonNegative = 0.07):
    """The speedruns' triangle: linear from start to 1 times the base rate, then linear down to end, per batch.

    Args:
        start: multiplier of the base lr at the first batch (airbench: 0.2).
        peak: where the rate reaches the base lr, a share of the run's batches (airbench: 0.23, at batch
            int(0.23 * batches)).
        end: multiplier of the base lr at the run's last batch (airbench: 0.07).
    """
    from dlrecipes.optim.lr_schedules import TriangleScheduler

    return TriangleScheduler(start=start, peak=peak, end=end)


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
    """timm's cosine: warmup from warmup_lr_init, absolute lr_min, restarts with decay, k-decay (else use cosine).

    Args:
        warmup: duration of the linear warmup from warmup_lr_init to the base lr, e.g. '5ep' or '500ba' (not
            stretched by scale_schedule_ratio); '0ba' for none.
        warmup_lr_init: learning rate at the start of the warmup (absolute; a parameter group with another
            rate gets it scaled alike, as timm's lr_scale does).
        lr_min: lowest rate, reached at the end of each cycle and held after the last one (absolute, like
            warmup_lr_init).
        cycle: length of the first cosine cycle (timm's t_initial), e.g. '1dur' for one cycle over the run or '50ep'.
        cycle_mul: each cycle lasts cycle_mul times as long as the one before (1: cycles of equal length).
        cycle_decay: each cycle's peak rate is cycle_decay times the one before (1: every cycle restarts at lr).
        cycle_limit: how many cycles run; after the last the rate stays at lr_min.
        k_decay: k-decay exponent: within a cycle the cosine follows t^k / T^k instead of t / T (1: the plain
            cosine; above 1 holds the rate high longer).
        warmup_prefix: start the cosine's clock after the warmup; false counts the warmup as part of the first
            cycle.
        per_epoch: change the rate once per epoch, as timm's train.py does for epoch-based schedules; false
            changes it every batch.
    """
    from dlrecipes.optim.lr_schedules import TimmScheduler

    return TimmScheduler(
        "cosine",
        {"warmup_t": warmup, "t_initial": cycle},
        per_epoch=per_epoch,
        warmup_lr_init=warmup_lr_init,
        lr_min=lr_min,
        cycle_mul=cycle_mul,
        cycle_decay=cycle_decay,
        cycle_limit=cycle_limit,
        k_decay=k_decay,
        warmup_prefix=warmup_prefix,
    )


@schedulers.register("timm_step")
def timm_step(
    decay: PositiveDuration = "30ep",
    decay_rate: Positive = 0.1,
    warmup: Duration = "0ba",
    warmup_lr_init: NonNegative = 0.0,
    warmup_prefix: bool = True,
    per_epoch: bool = False,
):
    """timm's step: times decay_rate every decay, warmup from warmup_lr_init (else use step).

    Args:
        decay: interval between two decays (timm's decay_t), e.g. '30ep' or '2000ba'.
        decay_rate: factor the rate is multiplied by at each decay (0.1: down to a tenth).
        warmup: duration of the linear warmup from warmup_lr_init to the base lr, e.g. '5ep' or '500ba' (not
            stretched by scale_schedule_ratio); '0ba' for none.
        warmup_lr_init: learning rate at the start of the warmup (absolute; a parameter group with another
            rate gets it scaled alike, as timm's lr_scale does).
        warmup_prefix: count the decay intervals from the end of the warmup; false counts them from the start of
            training.
        per_epoch: change the rate once per epoch, as timm's train.py does for epoch-based schedules; false
            changes it every batch.
    """
    from dlrecipes.optim.lr_schedules import TimmScheduler

    return TimmScheduler(
        "step",
        {"warmup_t": warmup, "decay_t": decay},
        per_epoch=per_epoch,
        decay_rate=decay_rate,
        warmup_lr_init=warmup_lr_init,
        warmup_prefix=warmup_prefix,
    )
