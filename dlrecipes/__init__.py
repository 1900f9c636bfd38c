"""dlrecipes: composable YAML recipes for training image classifiers on MosaicML Composer.

The path through the package is load -> validate -> build -> fit, then after training:
:mod:`dlrecipes.recipe` (YAML, ``base:``, overrides), :mod:`dlrecipes.config` (schema,
:mod:`dlrecipes.config.validation`), :mod:`dlrecipes.builders` (registry name -> object), :mod:`dlrecipes.fit`
(the run opened in its store, Composer's fit), :mod:`dlrecipes.after_training` (eval, export, predict).

What they build comes from the registries (:mod:`dlrecipes.registry`, filled by :mod:`dlrecipes.plugins`): the
component packages algorithms, callbacks, data, losses, loggers, metrics, models and optim, and the engine
(:mod:`dlrecipes.engine`, Composer's Trainer with a step that never waits for the device). Below them core (what
every part shares), runtime (the process around a run) and errors (one line, exit code 2); records holds what a run
leaves on disk; tools the commands that are not stages. The interface: api (one function per command), cli (the
Typer CLI, with what its commands share in cli_args; ``python -m dlrecipes``, __main__), notebook, and preload (what
the CLI's fork server imports once).

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
