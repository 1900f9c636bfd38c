"""What a recipe key means, by its dotted path: the sections' ``help`` (:mod:`.sections`) and the components'
parameter meanings (their factories' ``Args:`` or ``Doc``: :mod:`dlrecipes.core.param_docs`).

``show --explain``, validation errors about a value and ``help()`` of the notebook functions read them here.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from dlrecipes import registry
from dlrecipes.config.sections import COMPONENT_MAPS, COMPONENT_SECTIONS, RecipeConfig

METRIC_MAPS = {"metrics": registry.metrics, "train_metrics": registry.metrics}


def _field_help(cls: Any, name: str) -> str | None:
    for field in dataclasses.fields(cls):
        if field.name == name:
            return field.metadata.get("help")
    return None


def _dataclass_of(cls: Any, name: str) -> Any:
    """The dataclass a section field holds (``trainer`` -> TrainerConfig), or None."""
    hint = typing.get_type_hints(cls).get(name)
    for option in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(option):
            return option
    return None


def _component_meaning(reg: registry.Registry, component: str | None, key: str) -> str | None:
    if component is None or component not in reg:
        return None
    entry = reg.get(component)
    if key == "name":
        return f"the {reg.what} '{component}': {entry.description}" if entry.description else None
    return entry.meanings.get(key)


def key_meaning(path: str, recipe: dict | None = None) -> str | None:
    """The meaning of the recipe key ``path`` (``optimizer.lr``, ``algorithms.ema.half_life``,
    ``trainer.max_duration``); ``recipe`` (the resolved recipe as data) tells which component a section names.
    None when nothing says."""
    parts = path.split(".")
    recipe = recipe or {}
    head = parts[0]
    if len(parts) == 1:
        return _with_names(head, _field_help(RecipeConfig, head))
    if head == "loss":  # a name, or {name: ..., params}
        loss = recipe.get("loss")
        name = loss.get("name") if isinstance(loss, dict) else loss if isinstance(loss, str) else "cross_entropy"
        return _component_meaning(registry.losses, name, parts[1])
    if head in COMPONENT_SECTIONS:
        section = recipe.get(head) if isinstance(recipe.get(head), dict) else {}
        name = section.get("name") or _default_component(head)
        nested = section.get(parts[1])
        if len(parts) > 2 and isinstance(nested, dict):  # a component of the same kind in a key (optimizer.other)
            return _component_meaning(COMPONENT_SECTIONS[head], nested.get("name"), parts[2])
        return _component_meaning(COMPONENT_SECTIONS[head], name, parts[1])
    maps = {**COMPONENT_MAPS, **METRIC_MAPS}
    if head in maps:
        if len(parts) == 2:
            entry = maps[head].get(parts[1]) if parts[1] in maps[head] else None
            return entry.description if entry is not None else None
        return _component_meaning(maps[head], parts[1], parts[2])
    cls = _dataclass_of(RecipeConfig, head)
    for part in parts[1:-1]:
        cls = _dataclass_of(cls, part) if cls is not None else None
    return _field_help(cls, parts[-1]) if cls is not None else None


def _with_names(section: str, meaning: str | None) -> str | None:
    """A section of named components (algorithms, callbacks, loggers) says the names its registry holds now
    (plugins' too, once imported), read from the registry rather than written down."""
    reg = COMPONENT_MAPS.get(section)
    if meaning is None or reg is None or not reg.names():
        return meaning
    return f"{meaning}; registered: {', '.join(reg.names())}"


def _default_component(section: str) -> str | None:
    field = next(f for f in dataclasses.fields(RecipeConfig) if f.name == section)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory().name
    return None


def explained(path: str, recipe: dict | None = None) -> str:
    """``key: meaning`` for an error's second line, or '' when nothing says."""
    meaning = key_meaning(path, recipe)
    return f"{path}: {meaning}" if meaning else ""
