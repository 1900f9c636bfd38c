"""The Python entry points a notebook user calls; the CLI calls exactly these.

>>> from dlrecipes.api import resolve
>>> config = resolve("recipes/quickstart.yaml", ["trainer.max_duration=1ep"])
>>> config.trainer.max_duration
'1ep'
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence

from dlrecipes.config import RecipeConfig, validate
from dlrecipes.errors import RecipeError
from dlrecipes.plugins import load_all
from dlrecipes.recipe import LoadedRecipe, load_recipe


def load(recipe: str | Path, overrides: Iterable[str] = (), plugins: Sequence[str] = ()) -> LoadedRecipe:
    """Read the recipe (bases and overrides applied) and import every plugin it needs."""
    loaded = load_recipe(recipe, overrides)
    imports = loaded.data.get("imports", [])
    if not (isinstance(imports, list) and all(isinstance(i, str) for i in imports)):
        raise RecipeError(f"imports: expected a list of module names or .py paths, got {imports!r}")
    load_all(imports=imports, plugins=plugins, recipe_dir=loaded.path.resolve().parent)
    return loaded


def resolve(
    recipe: str | Path, overrides: Iterable[str] = (), plugins: Sequence[str] = (), check_device: bool = True
) -> RecipeConfig:
    """Load and validate: the recipe as the trainer will see it (nothing is built)."""
    return validate(load(recipe, overrides, plugins), check_device=check_device)


def train(
    recipe: str | Path,
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    resume: bool = False,
    config: Optional[RecipeConfig] = None,
    trust_checkpoint: bool = False,
    verbose: bool = False,
):
    """Resolve and train; returns a :class:`dlrecipes.train.TrainResult`."""
    from dlrecipes.train import train as fit

    return fit(config or resolve(recipe, overrides, plugins), resume=resume, trust_checkpoint=trust_checkpoint,
               verbose=verbose)
