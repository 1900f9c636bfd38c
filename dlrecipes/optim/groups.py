"""Parameter groups every optimizer factory shares (dlrecipes' own and timm's)."""

from __future__ import annotations


def parameter_groups(model, weight_decay: float, no_decay_norm_and_bias: bool):
    """All parameters, or two groups (decayed / not decayed) when excluding norms and biases."""
    if not no_decay_norm_and_bias:
        return [p for p in model.parameters() if p.requires_grad]
    from timm.optim import param_groups_weight_decay

    return param_groups_weight_decay(model, weight_decay)
