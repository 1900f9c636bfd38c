"""dlrecipes from Python: what ``import dlrecipes`` gives at its top level (a notebook's, or a script's, API).

>>> import dlrecipes
>>> result = dlrecipes.train("recipes/quickstart.yaml", {"trainer.max_duration": "2ep"})   # doctest: +SKIP
>>> result.history          # a pandas DataFrame, one row per epoch                          # doctest: +SKIP
>>> result.plot()           # loss, accuracy and learning rate, inline                        # doctest: +SKIP

The functions are :mod:`dlrecipes.api`'s (each CLI command calls one of those), with what a kernel needs around
them:

- Overrides are a list of ``key=value`` strings or a dict (``{"optimizer.lr": 0.1}``).
- A mistake raises a :class:`dlrecipes.errors.UserError` carrying the CLI's one-line message (shown as that
  line in a notebook); nothing calls ``sys.exit``.
- Signal handlers, logging handlers and torch's global flags are as they were after every call
  (:mod:`dlrecipes.core.process_state`), also when it raises.
- ``train`` takes your own ``model=``, ``train_data=`` and ``eval_data=`` objects
  (:mod:`dlrecipes.notebook.objects`); ``evaluate``, ``predict`` and ``export`` take them again for such a run.
- Interrupting a training (the kernel's stop button, Ctrl-C) stops it at the next batch with a checkpoint and
  raises ``KeyboardInterrupt`` naming it; ``train(..., resume=True)`` continues.
- ``runs`` and ``compare`` return pandas DataFrames (the ``notebook`` extra).
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from dlrecipes import api
from dlrecipes.core.process_state import kept
from dlrecipes.notebook.objects import register_objects, use_objects

Overrides = Iterable[str] | Mapping[str, Any]

__all__ = ["compare", "evaluate", "export", "plot", "predict", "resolve", "runs", "show", "sweep", "train"]


def _kept(function: Callable) -> Callable:
    """``function`` with the process's state put back after it (:func:`dlrecipes.core.process_state.kept`)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with kept():
            return function(*args, **kwargs)

    return call


@contextlib.contextmanager
def _quiet(quiet: bool):
    if not quiet:
        yield
        return
    from dlrecipes.loggers.terminal import silenced

    sink = io.StringIO()
    with silenced(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def _loaded(recipe: Optional[str | Path], overrides: Overrides, plugins: Sequence[str], model: Any):
    from dlrecipes.recipe import LoadedRecipe, apply_override, override_strings

    if recipe is not None:
        return api.load(recipe, overrides, plugins)
    from dlrecipes.plugins import load_all

    load_all(plugins=plugins)
    name = type(model).__name__ if model is not None else "notebook"
    loaded = LoadedRecipe(path=Path(f"{name}.yaml"), data={})  # the defaults, and what the objects give
    for override in override_strings(overrides):
        apply_override(loaded, override)
    return loaded


@_kept
def train(recipe: Optional[str | Path] = None, overrides: Overrides = (), *, model: Any = None,
          train_data: Any = None, eval_data: Any = None, num_classes: Optional[int] = None,
          class_names: Optional[Sequence[str]] = None, plugins: Sequence[str] = (), resume: bool = False,
          restart: bool = False, quiet: bool = False, verbose: bool = False, trust_checkpoint: bool = False):
    """Train a recipe (a path; None: the defaults, with your objects) and return a
    :class:`dlrecipes.fit.TrainResult` (``history``, ``metrics``, ``best_checkpoint``, ``plot()``).

    ``model``, ``train_data``, ``eval_data``: your own objects in place of the recipe's model and dataset (see
    :mod:`dlrecipes.notebook.objects`); ``num_classes``/``class_names`` when the data does not say.
    ``quiet``: show nothing.  ``resume``/``restart``: as ``dlrecipes train --resume/--restart`` (name the run
    with the override ``run_name``).
    """
    from dlrecipes.callbacks.preemption import Preempted
    from dlrecipes.config import validate
    from dlrecipes.fit import fit
    from dlrecipes.records.remote import check_runs_dir

    with _quiet(quiet):
        loaded = _loaded(recipe, overrides, plugins, model)
        use_objects(loaded, register_objects(model, train_data, eval_data, num_classes, class_names))
        config = validate(loaded)
        check_runs_dir(config.runs_dir)
        try:
            return fit(config, resume=resume, trust_checkpoint=trust_checkpoint, verbose=verbose, restart=restart)
        except Preempted as exc:
            if "SIGINT" not in str(exc):
                raise
            raise KeyboardInterrupt(str(exc).replace("continue with --resume", "continue with resume=True")) from None


def _with_objects(function: Callable) -> Callable:
    """``function`` taking ``model=``, ``train_data=``, ``eval_data=`` (and ``num_classes=``, ``class_names=``)
    for a run trained on objects, registered before the run's recipe is read."""

    @functools.wraps(function)
    def call(*args: Any, model: Any = None, train_data: Any = None, eval_data: Any = None,
             num_classes: Optional[int] = None, class_names: Optional[Sequence[str]] = None, **kwargs: Any) -> Any:
        register_objects(model, train_data, eval_data, num_classes, class_names)
        return function(*args, **kwargs)

    return call


evaluate = _kept(_with_objects(api.evaluate))


@_kept
@_with_objects
def predict(target: str | Path, files: Sequence[str | Path] = (), top_k: int = 5, *, inputs: Any = None,
            checkpoint: str = "best", recipe: Optional[str | Path] = None, overrides: Overrides = (),
            plugins: Sequence[str] = (), batch_size: int = 64, out: Optional[str | Path] = None,
            trust_checkpoint: bool = False):
    """The classes of image ``files`` (as :func:`dlrecipes.api.predict`), or of ``inputs``: a batch tensor
    (N, C, H, W) or a Dataset, given to the network as they are (a run trained on your own data has no image-file
    preprocessing to apply). One row per file or input."""
    if inputs is None:
        return api.predict(target, files, top_k, out, checkpoint, recipe, overrides, plugins, batch_size,
                           trust_checkpoint)
    from dlrecipes.recipe import override_strings
    from dlrecipes.tools import predict as tool
    from dlrecipes.tools.evaluate import find_target

    found, overrides = find_target(target, checkpoint, recipe, trust_checkpoint), override_strings(overrides)
    predictor = tool.run_predictor(found, api.resolve_recorded(found, overrides, plugins), trust_checkpoint,
                                   files=False)
    return tool.predict_inputs(predictor, inputs, top_k, batch_size)


export = _kept(_with_objects(api.export))
sweep = _kept(api.sweep)
resolve = api.resolve
show = api.show


def runs(runs_dir: str | Path = "runs", last: Optional[int] = None):
    """The runs under ``runs_dir``, newest first, as a pandas DataFrame indexed by run name."""
    from dlrecipes.records.frames import table_frame

    return table_frame(api.runs(runs_dir, last), index="name")


def compare(run_dirs: Sequence[str | Path] = (), last: Optional[int] = None, runs_dir: str | Path = "runs"):
    """The runs side by side: (a DataFrame, one row per run with the recipe values that differ among them as
    columns; a Figure of eval top-1 against wall-clock time)."""
    from dlrecipes.records.frames import table_frame
    from dlrecipes.records.plots import comparison_figure
    from dlrecipes.records.remote_runs import select_runs

    chosen = select_runs(run_dirs, last, runs_dir)[0]  # runs in a bucket: local copies of their records
    rows, _ = api.compare(chosen)
    return table_frame(rows, index="run"), comparison_figure(chosen, rows)


def plot(run_dir: str | Path):
    """A run's history (loss, accuracy, learning rate) as one matplotlib Figure."""
    from dlrecipes.records.plots import history_figure
    from dlrecipes.records.remote_runs import pull_records

    return history_figure(pull_records([run_dir])[0][0])  # a run in a bucket: a local copy of its records


