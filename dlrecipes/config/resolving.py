"""A recipe file on this machine read and checked as the trainer will see it: :func:`load_local` (bases and
overrides applied, every plugin it names imported: :func:`import_plugins`), :func:`resolve_local` (then
validated), and :func:`resolve_recorded` (a run's recorded recipe with a command's overrides, an error of the file
itself naming the file). The interface (:mod:`dlrecipes.api`) adds what a recipe in a bucket needs; the stage
after training reads runs' recipes through these."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlrecipes.config.sections import RecipeConfig
from dlrecipes.config.validation import validate
from dlrecipes.errors import RecipeError, shown
from dlrecipes.plugins import load_all
from dlrecipes.recipe import LoadedRecipe, load_recipe


def load_local(
    recipe: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    root: str | Path | None = None,
) -> LoadedRecipe:
    """The recipe (a file, or a dict of sections standing for a file in ``root``: see
    :func:`dlrecipes.recipe.load_recipe`) with its bases and overrides applied, and every plugin it needs imported
    (its ``imports:`` and ``plugins``)."""
    loaded = load_recipe(recipe, overrides, root)
    import_plugins(loaded, plugins)
    return loaded


def import_plugins(loaded: LoadedRecipe, plugins: Sequence[str] = ()) -> None:
    """Import every plugin ``loaded`` needs: its ``imports:`` (found from its folder) and ``plugins``."""
    imports = loaded.data.get("imports", [])
    if not (isinstance(imports, list) and all(isinstance(i, str) for i in imports)):
        raise RecipeError(f"imports: expected a list of module names or .py paths, got {shown(imports)}")
    load_all(imports=imports, plugins=plugins, recipe_dir=loaded.path.resolve().parent)


def resolve_local(recipe: str | Path, overrides: Iterable[str] = (), plugins: Sequence[str] = ()) -> RecipeConfig:
    """:func:`load_local`, validated (the device and the data paths checked)."""
    return validate(load_local(recipe, overrides, plugins))


def resolve_recorded(recipe: str | Path, overrides: Sequence[str], plugins: Sequence[str]) -> RecipeConfig:
    """The recipe of a run (or a checkpoint's ``--recipe``) with ``overrides``, validated; an error of the file
    itself (not of an override) names the file."""
    try:
        return resolve_local(recipe, overrides, plugins)
    except RecipeError as exc:
        if str(recipe) in str(exc):
            raise
        if overrides:
            try:
                resolve_local(recipe, (), plugins)
            except RecipeError:
                pass
            else:
                raise  # the recipe is fine: the override is what is wrong
        exc.args = (f"{recipe}: {exc}",)
        raise


__all__ = ["import_plugins", "load_local", "resolve_local", "resolve_recorded"]
