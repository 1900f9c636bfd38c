"""Paths in a recipe: input paths are relative to the file that names them, and must exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlrecipes.config.sections import COMPONENT_MAPS, COMPONENT_SECTIONS, Component, RecipeConfig
from dlrecipes.recipe import LoadedRecipe


def _anchor(recipe: LoadedRecipe, key_path: str) -> Path:
    """The folder a relative path at ``key_path`` is relative to: its recipe file's, or the working directory."""
    source = recipe.sources.get(key_path, "")
    if not source or source.startswith("override ") or source == "?":
        return Path.cwd()
    return Path(source).resolve().parent


def _resolved(value: Any, anchor: Path) -> Any:
    if isinstance(value, list):
        return [_resolved(v, anchor) for v in value]
    if not isinstance(value, str) or not value or "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (anchor / path).resolve())


def resolve_paths(config: RecipeConfig, recipe: LoadedRecipe) -> None:
    """Input paths in a recipe file are relative to that file (``base:`` files: to theirs).

    Paths given as command-line overrides are relative to the working directory, and so
    are output locations (``runs_dir``, ``trainer.cache_dir``).  Which parameters are
    paths: ``checkpoint.load_path`` and each factory's ``paths=`` registry metadata.
    """
    if config.checkpoint.load_path:
        config.checkpoint.load_path = _resolved(config.checkpoint.load_path, _anchor(recipe, "checkpoint.load_path"))
    # plugin files, as they were imported (from the recipe's folder): the run's recipe.yaml then imports them from
    # anywhere (``dlrecipes train runs/NAME/recipe.yaml`` trains the run again)
    folder = recipe.path.resolve().parent
    config.imports = [
        str((folder / i).resolve()) if i.endswith(".py") and not Path(i).expanduser().is_absolute() else i
        for i in config.imports
    ]
    for section, reg in COMPONENT_SECTIONS.items():
        component = getattr(config, section, None)
        if isinstance(component, Component):
            for key in reg.get(component.name).metadata.get("paths", ()):
                if key in component.params:
                    component.params[key] = _resolved(component.params[key], _anchor(recipe, f"{section}.{key}"))
    for section, reg in COMPONENT_MAPS.items():
        for name, params in (getattr(config, section, None) or {}).items():
            for key in reg.get(name).metadata.get("paths", ()):
                if key in params:
                    params[key] = _resolved(params[key], _anchor(recipe, f"{section}.{name}.{key}"))


def check_inputs_exist(config: RecipeConfig) -> None:
    """Every input path a recipe names exists: the components' ``paths=`` parameters (unless the
    factory is asked to download there) and ``checkpoint.load_path``."""
    from dlrecipes.errors import DataError

    missing = []
    if config.checkpoint.load_path and not Path(config.checkpoint.load_path).exists():
        missing.append(("checkpoint.load_path", config.checkpoint.load_path, None))
    for section, reg in COMPONENT_SECTIONS.items():
        component = getattr(config, section, None)
        if not isinstance(component, Component):
            continue
        entry = reg.get(component.name)
        params = {**{n: p.default for n, p in entry.parameters.items() if p.default is not p.empty}, **component.params}
        if params.get("download") is True:
            continue  # fetched there when missing
        for key in entry.metadata.get("paths", ()):
            value = params.get(key)
            if isinstance(value, str) and value and "://" not in value and not Path(value).exists():
                missing.append((f"{section}.{key}", value, entry.metadata.get("made_by")))
    if not missing:  # the data a dataset names, checked by its own rules where it has them (shards: address, metadata)
        _check_named_data(config)
    if missing:
        key, value, made_by = missing[0]
        more = f" (and {', '.join(k for k, _, _ in missing[1:])})" if len(missing) > 1 else ""
        way_out = f"make it with: {made_by}; or give" if made_by else "give"
        raise DataError(
            f"{key}: {value} does not exist{more}; {way_out} an existing path, or check it later "
            "(validate --no-data-check)"
        )


def _check_named_data(config: RecipeConfig) -> None:
    """A dataset whose registry entry has a ``data_check`` (``check(params, key_path, trainer)``: the recipe's
    trainer section) is checked by it: where its data is, and that it is as the dataset reads it (one line, as
    training would give it, before anything is built)."""
    from dlrecipes.registry import datasets

    component = getattr(config, "dataset", None)
    if not isinstance(component, Component):
        return
    entry = datasets.get(component.name)
    check = entry.metadata.get("data_check")
    if callable(check):
        params = {**{n: p.default for n, p in entry.parameters.items() if p.default is not p.empty}, **component.params}
        check(params, "dataset", config.trainer)
