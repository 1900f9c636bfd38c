"""Built-in learning-rate schedules, with warmup given as a duration ('5ep', '200ba', '0.1dur').

They are Composer's schedulers where Composer has them (its warmup variants when the
warmup is not zero); step-with-warmup and one-cycle live in :mod:`dlrecipes.optim.lr_schedules`.
"""

from __future__ import annotations


from dlrecipes.core.durations import Duration, is_zero
from dlrecipes.registry import schedulers


@schedulers.register("constant")
def constant(warmup: Duration = "0ba"):
    """Constant learning rate, after an optional linear warmup."""
    from composer.optim import ConstantScheduler, ConstantWithWarmupScheduler

    return ConstantScheduler() if is_zero(warmup) else ConstantWithWarmupScheduler(t_warmup=warmup)


@schedulers.register("linear")
def linear(warmup: Duration = "0ba", alpha_i: float = 1.0, alpha_f: float = 0.0):
    """Linear from alpha_i to alpha_f times the base rate over training, after an optional warmup."""
    from composer.optim import LinearScheduler, LinearWithWarmupScheduler

    if is_zero(warmup):
        return LinearScheduler(alpha_i=alpha_i, alpha_f=alpha_f)
    return LinearWithWarmupScheduler(t_warmup=warmup, alpha_i=alpha_i, alpha_f=alpha_f)


@schedulers.register("cosine")
def cosine(warmup: Duration = "0ba", alpha_f: float = 0.0):
    """Cosine decay to alpha_f times the base rate, after an optional linear warmup."""
    from composer.optim import CosineAnnealingScheduler, CosineAnnealingWithWarmupScheduler

    if is_zero(warmup):
        return CosineAnnealingScheduler(alpha_f=alpha_f)
    return CosineAnnealingWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f)


@schedulers.register("step")
def step(step_size: Duration = "30ep", gamma: float = 0.1, warmup: Duration = "0ba"):
    """Multiply the rate by gamma every step_size, after an optional linear warmup."""
    if is_zero(warmup):
        from composer.optim import StepScheduler

        return StepScheduler(step_size=step_size, gamma=gamma)
    from dlrecipes.optim.lr_schedules import StepWithWarmupScheduler

    return StepWithWarmupScheduler(t_warmup=warmup, step_size=step_size, gamma=gamma)


@schedulers.register("multistep")
def multistep(milestones: list[Duration], gamma: float = 0.1, warmup: Duration = "0ba"):
    """Multiply the rate by gamma at each milestone, after an optional linear warmup."""
    from composer.optim import MultiStepScheduler, MultiStepWithWarmupScheduler

    if is_zero(warmup):
        return MultiStepScheduler(milestones=list(milestones), gamma=gamma)
    return MultiStepWithWarmupScheduler(t_warmup=warmup, milestones=list(milestones), gamma=gamma)


@schedulers.register("onecycle")
def onecycle(warmup: Duration = "0.3dur", div_factor: float = 25.0, final_div_factor: float = 1e4):
    """One-cycle: rise from lr/div_factor to lr over warmup, then cosine down to nearly zero."""
    from dlrecipes.optim.lr_schedules import OneCycleScheduler

    return OneCycleScheduler(t_warmup=warmup, div_factor=div_factor, final_div_factor=final_div_factor)
