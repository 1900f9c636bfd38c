"""Muon on the network's filters and a second optimizer on everything else, stepped as one optimizer.

Muon (Jordan et al. 2024) steps each weight matrix along its momentum orthogonalized by a few Newton-Schulz
iterations; a conv filter (out, in, kh, kw) is first flattened to the matrix (out, in * kh * kw).  The update of
each matrix is timm's (``timm.optim.Muon``).  What timm's Muon lacks for a convolutional network trained as
airbench94_muon trains it, and this module adds:

- a second optimizer of the recipe's choice (``optimizer.other``: SGD in airbench, any registered optimizer)
  for the parameters Muon does not step (timm's falls back to AdamW only, with Muon's lr scaled);
- the classifier's head kept out of Muon even though it is a matrix (``head``: the last ``nn.Linear`` by
  default), with its own lr and weight decay in the second optimizer (timm would orthogonalize it);
- every filter rescaled to the Frobenius norm sqrt(out channels) before its update (``normalize_weights``),
  so the orthogonalized step has a fixed size relative to the filter.

The two optimizers are one ``torch.optim.Optimizer`` (:class:`MuonWithOther`): their parameter groups are its
groups (the same dicts) and their state its state, so Composer's scheduler multiplies every group's lr, and its
checkpoint saves and restores both states as one optimizer's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from timm.optim import Muon

from dlrecipes.errors import RecipeError

HEAD_AUTO = "auto"


class FilterMuon(Muon):
    """timm's Muon over the groups it is given (every parameter routed to Muon), with airbench's weight
    normalization as a group option (``normalize_weights``)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            if group.get("normalize_weights") and group["lr"] != 0:  # lr 0 (torch's state init): nothing moves
                for p in group["params"]:
                    if p.grad is not None:
                        normalize_filter_(p)
        return super().step(closure)


def normalize_filter_(p: torch.Tensor) -> None:
    """Rescale a filter (out, ...) in place to the Frobenius norm sqrt(out)."""
    p.mul_(math.sqrt(p.shape[0]) / p.norm().clamp(min=1e-12))


class MuonWithOther(torch.optim.Optimizer):
    """Two optimizers over disjoint parameters, as one: the first (Muon) steps its groups, then the second
    steps the rest.  ``param_groups`` and ``state`` are the two's own, shared, also after ``load_state_dict``."""

    def __init__(self, muon: torch.optim.Optimizer, other: torch.optim.Optimizer | None):
        self.muon, self.other = muon, other  # other: None when Muon takes every parameter
        self.muon_groups = len(muon.param_groups)
        super().__init__(list(muon.param_groups) + (list(other.param_groups) if other else []), {})
        self._share()

    def _share(self) -> None:
        """The inner optimizers read this optimizer's groups and state (load_state_dict replaces both)."""
        self.muon.param_groups = self.param_groups[: self.muon_groups]
        self.muon.state = self.state
        if self.other is not None:
            self.other.param_groups = self.param_groups[self.muon_groups :]
            self.other.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        if self.other is not None:
            self.other.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()


class ParameterSubset:
    """What an optimizer factory reads of a model (``parameters``, ``named_parameters``), for some of its
    parameters only: the second optimizer is built by its registered factory over the parameters Muon leaves."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]):
        self.named = named

    def named_parameters(self, *args, **kwargs) -> Iterable[tuple[str, torch.nn.Parameter]]:
        return iter(self.named)

    def parameters(self, *args, **kwargs) -> Iterable[torch.nn.Parameter]:
        return iter(p for _, p in self.named)


def head_parameters(model: torch.nn.Module, head: str | None) -> set[str]:
    """Names of the head's parameters: the last ``nn.Linear`` (``auto``), the module named ``head``, or none."""
    if head is None:
        return set()
    modules = dict(model.named_modules())
    if head == HEAD_AUTO:
        linears = [name for name, m in modules.items() if isinstance(m, torch.nn.Linear)]
        if not linears:
            return set()
        head = linears[-1]
    if head not in modules:
        raise RecipeError(
            f"optimizer.head: the model has no module '{head}' (its modules: "
            f"{', '.join(list(modules)[1:6])}, ...; 'auto' for its last Linear, null for no head)"
        )
    prefix = f"{head}." if head else ""
    return {f"{prefix}{name}" for name, _ in modules[head].named_parameters()}


def split_parameters(model: torch.nn.Module, head: str | None):
    """(Muon's parameters, the other's (name, parameter), the head's names): Muon takes every trainable
    parameter of two or more dimensions outside the head."""
    heads = head_parameters(model, head)
    muon, other = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (muon if p.ndim >= 2 and name not in heads else other).append((name, p))
    return [p for _, p in muon], other, heads


def separate_head(
    optimizer: torch.optim.Optimizer, head: list[torch.nn.Parameter], lr: float | None, weight_decay: float | None
) -> None:
    """Move the head's parameters out of each group into a group of their own, with that group's settings but
    the head's lr and weight decay (None: the group's)."""
    if not head or (lr is None and weight_decay is None):
        return
    ids = {id(p) for p in head}
    overrides = {k: v for k, v in (("lr", lr), ("weight_decay", weight_decay)) if v is not None}
    heads = []
    for group in optimizer.param_groups:
        moved = [p for p in group["params"] if id(p) in ids]
        if moved:
            group["params"] = [p for p in group["params"] if id(p) not in ids]
            heads.append({**group, "params": moved, **overrides})
    optimizer.param_groups = [g for g in optimizer.param_groups if g["params"]]
    for group in heads:
        optimizer.add_param_group(group)


def build_muon(
    model: torch.nn.Module,
    muon_settings: dict[str, Any],
    other_builder,
    head: str | None,
    head_lr: float | None,
    head_weight_decay: float | None,
) -> MuonWithOther:
    """Muon over the filters, ``other_builder(subset)`` over the rest (the head in a group of its own)."""
    muon_params, other_named, heads = split_parameters(model, head)
    if not muon_params:
        raise RecipeError(
            "optimizer.name: 'muon' finds no trainable parameter of two or more dimensions outside the "
            "head in this model; choose another optimizer"
        )
    muon = FilterMuon(
        [{"params": muon_params, "use_muon": True, "normalize_weights": muon_settings.pop("normalize_weights")}],
        **muon_settings,
    )
    if not other_named:
        return MuonWithOther(muon, None)
    other = other_builder(ParameterSubset(other_named))
    separate_head(other, [p for name, p in other_named if name in heads], head_lr, head_weight_decay)
    return MuonWithOther(muon, other)


__all__ = [
    "FilterMuon",
    "MuonWithOther",
    "ParameterSubset",
    "build_muon",
    "head_parameters",
    "normalize_filter_",
    "split_parameters",
]
