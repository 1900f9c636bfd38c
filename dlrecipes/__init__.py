"""dlrecipes: composable YAML recipes for training image classifiers on MosaicML Composer.

The path through the package is load -> validate -> build -> fit:
:mod:`dlrecipes.recipe` (YAML, ``base:``, overrides), :mod:`dlrecipes.config` (schema, :mod:`.validation`),
:mod:`dlrecipes.builders` (registry name -> object), :mod:`dlrecipes.fit` (Composer).

From Python (a notebook, a script): ``dlrecipes.train``, ``evaluate``, ``predict``, ``export``, ``sweep``,
``runs``, ``compare``, ``plot``, ``show`` and ``resolve`` (:mod:`dlrecipes.notebook`), imported on first use:
``import dlrecipes`` itself imports nothing else.
"""

__version__ = "0.1.0"

PUBLIC = ("train", "evaluate", "predict", "export", "sweep", "runs", "compare", "plot", "show", "resolve")
__all__ = ["__version__", *PUBLIC]


def __getattr__(name: str):
    """The public functions, imported when first asked for (a lazy facade: see the module docstring)."""
    if name in PUBLIC:
        from dlrecipes import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'dlrecipes' has no attribute '{name}'")


def __dir__():
    return sorted([*globals(), *PUBLIC])
