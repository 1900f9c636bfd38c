"""Losses, registered by name in :mod:`.registered`; :func:`build_loss` builds a recipe's ``loss:`` value.

Modules:
- :mod:`.functions`: loss functions: fn(predictions, targets) -> scalar
"""

from __future__ import annotations

from typing import Any

from dlrecipes.losses import registered  # noqa: F401  (registers the built-ins)
from dlrecipes.registry import build_component, losses


def loss_name(value: str | dict[str, Any]) -> str:
    """The loss's name, from a recipe's ``loss:`` (a name, or a mapping with ``name:``)."""
    return value if isinstance(value, str) else value["name"]


def loss_params(value: str | dict[str, Any]) -> dict[str, Any]:
    return {} if isinstance(value, str) else {k: v for k, v in value.items() if k != "name"}


def build_loss(value: str | dict[str, Any]):
    """The loss function a recipe's ``loss:`` value names."""
    return build_component(losses, loss_name(value), loss_params(value), "loss")
