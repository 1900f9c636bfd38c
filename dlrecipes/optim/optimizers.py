"""Built-in optimizers.

A factory receives the model positionally (it is not a recipe key) and the recipe's
parameters by keyword.  ``no_decay_norm_and_bias`` puts 1-D parameters (biases and norm
scales) in a group without weight decay, as most ImageNet recipes do.

``fused`` (torch's SGD and AdamW): one kernel for the whole update.  Left unset, the builder
turns it on for ``amp_fp16`` on a GPU, where it matters most: a fused optimizer takes the
gradient scaler's inf/NaN flag on the device, while any other optimizer makes
``GradScaler.step`` read that flag back (a wait for the GPU) every step.
"""

from __future__ import annotations

from typing import Optional

from dlrecipes.registry import optimizers


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
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
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
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
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
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    dampening: float = 0.0,
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
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 1e-5,
    amsgrad: bool = False,
    no_decay_norm_and_bias: bool = False,
):
    """Composer's DecoupledAdamW (decay scaled by the schedule, not by the learning rate)."""
    from composer.optim import DecoupledAdamW

    groups = parameter_groups(model, weight_decay, no_decay_norm_and_bias)
    return DecoupledAdamW(groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
