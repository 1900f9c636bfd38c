"""Parameter groups every optimizer factory shares (dlrecipes' own and timm's)."""

from __future__ import annotations


def parameter_groups(model, weight_decay: float, no_decay_norm_and_bias: bool):
    """All parameters, or two groups (decayed / not decayed) when excluding norms and biases."""
    if not no_decay_norm_and_bias:
        return [p for p in model.parameters() if p.requires_grad]
    from timm.optim import param_groups_weight_decay

    return param_groups_weight_decay(model, weight_decay)


def norm_bias_scaled(groups: list, model, lr: float, weight_decay: float, scale: float) -> list:
    """``groups`` with the trainable parameters of batch norms moved to a group of their own whose rate is ``scale``
    times ``lr`` and whose weight decay is divided by ``scale`` (so the decay per step stays as the others');
    ``groups`` as they are when ``scale`` is 1."""
    if scale == 1.0:
        return groups
    from torch import nn

    norms = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        for p in m.parameters()
        if p.requires_grad
    }
    if not norms:
        return groups
    rest, scaled = [], []
    for group in groups if isinstance(groups[0], dict) else [{"params": groups}]:
        params = list(group["params"])
        mine = [p for p in params if id(p) in norms]
        others = [p for p in params if id(p) not in norms]
        if mine:
            decay = group.get("weight_decay", weight_decay) / scale
            scaled.append({**group, "params": mine, "lr": lr * scale, "weight_decay": decay, "norms": True})
        if others:
            rest.append({**group, "params": others})
    return scaled + rest
