"""Scaling the learning rate with the global batch (``optimizer.scale_lr``), in one place.

A recipe tunes ``optimizer.lr`` for ``optimizer.reference_batch_size``; with ``scale_lr: linear``
(Goyal et al. 2017) or ``sqrt`` the run trains at that lr times the ratio (or its square root) of
the global batch to the reference.  Here: the two recipe keys and their check (validation), the
rule and the optimizer's parameters with it applied (the builder), and the line that reports the
result (the fit stage).  No torch.
"""

from __future__ import annotations

from typing import Any, Literal

from dlrecipes.errors import RecipeError

# Optimizer keys that are not the optimizer factory's parameters: the builder applies them.
KEYS = {
    "scale_lr": Literal["none", "linear", "sqrt"],
    "reference_batch_size": int | None,
}


def check(own: dict[str, Any], params: dict[str, Any], optimizer: str) -> None:
    """The scaling keys of ``optimizer`` (``own``, typed already) against its parameters (``params``)."""
    if own.get("scale_lr", "none") == "none":
        return
    if not own.get("reference_batch_size"):
        raise RecipeError(
            "optimizer.reference_batch_size: required with optimizer.scale_lr (the batch size lr was tuned for)"
        )
    if "lr" not in params:
        raise RecipeError(f"optimizer.scale_lr: optimizer '{optimizer}' has no lr parameter to scale")


def scaled_lr(lr: float, rule: str, batch_size: int, reference_batch_size: int | None) -> float:
    """The learning rate for ``batch_size`` when ``lr`` was tuned at ``reference_batch_size``:
    linear (Goyal et al. 2017: lr x k for a k-times larger batch), sqrt (lr x sqrt(k)), or none."""
    if rule == "none" or not reference_batch_size:
        return lr
    ratio = batch_size / reference_batch_size
    return lr * (ratio if rule == "linear" else ratio**0.5)


def optimizer_params(params: dict[str, Any], global_batch_size: int | None) -> dict[str, Any]:
    """The optimizer factory's parameters from the recipe's ``optimizer`` parameters: the scaling keys
    taken out, and ``lr`` scaled to ``global_batch_size`` (when given) by the recipe's rule."""
    out = {k: v for k, v in params.items() if k not in KEYS}
    rule = params.get("scale_lr", "none")
    if rule != "none" and global_batch_size:
        out["lr"] = scaled_lr(out["lr"], rule, global_batch_size, params["reference_batch_size"])
    return out


def scaling_report(params: dict[str, Any], global_batch_size: int, lr: float) -> tuple[str, dict[str, Any]] | None:
    """What the lr became (``lr``: the optimizer's, as built): the line to print and the hyperparameters to log;
    None without scaling."""
    if params.get("scale_lr", "none") == "none":
        return None
    line = (
        f"optimizer.lr scaled ({params['scale_lr']}) from the reference batch {params['reference_batch_size']} "
        f"to the global batch {global_batch_size}: {lr:.6g}"
    )
    return line, {"optimizer/scaled_lr": lr, "optimizer/scale_lr": params["scale_lr"]}


__all__ = ["KEYS", "check", "optimizer_params", "scaled_lr", "scaling_report"]
