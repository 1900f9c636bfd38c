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
  (:mod:`dlrecipes.runtime.process_state`), also when it raises.
- ``train`` takes your own ``model=``, ``train_data=`` and ``eval_data=`` objects
  (:mod:`dlrecipes.notebook.objects`); ``evaluate``, ``predict`` and ``export`` take them again for such a run.
- Interrupting a training (the kernel's stop button, Ctrl-C) stops it at the next batch with a checkpoint and
  raises ``KeyboardInterrupt`` naming it; ``train(..., resume=True)`` continues.
- ``runs`` and ``compare`` return pandas DataFrames (the ``notebook`` extra).

Modules:
- :mod:`.samples`: what those objects yield, made into what training takes (or refused)
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlrecipes import api
from dlrecipes.core.addresses import RUNS_DIR
from dlrecipes.errors import UserError, user_message
from dlrecipes.notebook.objects import register_objects, use_objects
from dlrecipes.runtime.process_state import kept

Overrides = Iterable[str] | Mapping[str, Any]

__all__ = ["compare", "evaluate", "export", "plot", "predict", "resolve", "runs", "show", "sweep", "train"]


# The command line's flags in a message, as these functions' keyword arguments (the caller's language).
_SWITCHES = {"verbose": "verbose", "resume": "resume", "restart": "restart", "trust-checkpoint": "trust_checkpoint"}
_VALUED = {"checkpoint": "checkpoint", "recipe": "recipe", "out": "out"}
_FLAG = re.compile(
    r"(?<![\w-])--({})\b(?:[ =](?!-)([^\s,;()]+))?".format("|".join(map(re.escape, {**_SWITCHES, **_VALUED})))
)


def in_python(message: str) -> str:
    """``message`` with the CLI's flags written as keyword arguments: ``--verbose`` as ``verbose=True``,
    ``--checkpoint latest`` as ``checkpoint='latest'``."""

    def keyword(match: re.Match) -> str:
        flag, value = match.group(1), match.group(2)
        if flag in _SWITCHES:
            return f"{_SWITCHES[flag]}=True" + (f" {value}" if value else "")
        return f"{_VALUED[flag]}={value!r}" if value else f"{_VALUED[flag]}="

    return _FLAG.sub(keyword, message)


def _kept(function: Callable) -> Callable:
    """``function`` with the process's state put back after it (:func:`dlrecipes.runtime.process_state.kept`), and
    its errors worded for Python (:func:`in_python`)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with kept():
                return function(*args, **kwargs)
        except (UserError, KeyboardInterrupt) as exc:
            if exc.args and isinstance(exc.args[0], str):
                message = user_message(exc) if isinstance(exc, UserError) else exc.args[0]
                exc.args = (in_python(message), *exc.args[1:])
            raise
        finally:
            from dlrecipes.notebook.samples import detach_all

            detach_all()

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


def _loaded(
    recipe: str | Path | Mapping[str, Any] | None,
    overrides: Overrides,
    plugins: Sequence[str],
    model: Any,
    root: str | Path | None = None,
):
    from dlrecipes.recipe import LoadedRecipe, apply_override, override_strings

    if recipe is not None:
        return api.load(recipe, overrides, plugins, root)
    from dlrecipes.plugins import load_all

    load_all(plugins=plugins)
    name = type(model).__name__ if model is not None else "notebook"
    loaded = LoadedRecipe(path=Path(f"{name}.yaml"), data={})  # the defaults, and what the objects give
    for override in override_strings(overrides):
        apply_override(loaded, override)
    return loaded


@_kept
def train(
    recipe: str | Path | Mapping[str, Any] | None = None,
    overrides: Overrides = (),
    *,
    model: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    num_classes: int | None = None,
    class_names: Sequence[str] | None = None,
    plugins: Sequence[str] = (),
    resume: bool = False,
    restart: bool = False,
    quiet: bool = False,
    verbose: bool = False,
    trust_checkpoint: bool = False,
    root: str | Path | None = None,
    input_key: str | None = None,
    target_key: str | None = None,
):
    """Train a recipe (a path, or a dict of sections as a recipe file holds them; None: the defaults, with your
    objects) and return a
    :class:`dlrecipes.fit.TrainResult` (``history``, ``metrics``, ``best_checkpoint``, ``plot()``).

    ``model``, ``train_data``, ``eval_data``: your own objects in place of the recipe's model and dataset (see
    :mod:`dlrecipes.notebook.objects`); ``num_classes``/``class_names`` when the data does not say;
    ``input_key``/``target_key``: the image's and the label's key in dict samples (found when unambiguous).
    ``quiet``: show nothing.  ``resume``/``restart``: as ``dlrecipes train --resume/--restart`` (name the run
    with the override ``run_name``).  ``root``: where a dict recipe stands (its ``base:`` files and relative
    data paths are found from there; default: the working directory).
    """
    from dlrecipes.callbacks.stop_on_signal import Preempted
    from dlrecipes.config import validate
    from dlrecipes.records.provenance import recording

    with _quiet(quiet):
        loaded = _loaded(recipe, overrides, plugins, model, root)
        use_objects(
            loaded, register_objects(model, train_data, eval_data, num_classes, class_names, input_key, target_key)
        )
        config = validate(loaded)
        objects = {"model": model, "train_data": train_data, "eval_data": eval_data}
        try:
            with recording(_train_call(recipe, overrides, objects, resume, restart)):  # the run's provenance records it
                return api.train(
                    None,
                    config=config,
                    resume=resume,
                    trust_checkpoint=trust_checkpoint,
                    verbose=verbose,
                    restart=restart,
                )  # the one train path, as the CLI's
        except Preempted as exc:
            if "SIGINT" not in str(exc):
                raise
            raise KeyboardInterrupt(str(exc)) from None  # worded for Python by _kept


def _train_call(recipe: Any, overrides: Overrides, objects: dict[str, Any], resume: bool, restart: bool) -> str:
    """How a run's provenance names the :func:`train` call that started it (objects by their type)."""
    call = ", ".join(
        [
            repr(recipe),
            repr(overrides if isinstance(overrides, Mapping) else list(overrides)),
            *(f"{k}=<{type(v).__name__}>" for k, v in objects.items() if v is not None),
            *(f"{k}=True" for k, v in (("resume", resume), ("restart", restart)) if v),
        ]
    )
    return f"dlrecipes.train({call})"


def _with_objects(function: Callable) -> Callable:
    """``function`` taking ``model=``, ``train_data=``, ``eval_data=`` (and ``num_classes=``, ``class_names=``)
    for a run trained on objects, registered before the run's recipe is read."""

    @functools.wraps(function)
    def call(
        *args: Any,
        model: Any = None,
        train_data: Any = None,
        eval_data: Any = None,
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
        input_key: str | None = None,
        target_key: str | None = None,
        **kwargs: Any,
    ) -> Any:
        register_objects(model, train_data, eval_data, num_classes, class_names, input_key, target_key)
        return function(*args, **kwargs)

    return call


evaluate = _kept(_with_objects(api.evaluate))


@_kept
@_with_objects
def predict(
    target: str | Path,
    files: Sequence[str | Path] = (),
    top_k: int = 5,
    *,
    inputs: Any = None,
    checkpoint: str = "best",
    recipe: str | Path | None = None,
    overrides: Overrides = (),
    plugins: Sequence[str] = (),
    batch_size: int = 64,
    out: str | Path | None = None,
    trust_checkpoint: bool = False,
):
    """The classes of image ``files`` (as :func:`dlrecipes.api.predict`), or of ``inputs``: a batch tensor
    (N, C, H, W) or a Dataset, given to the network as they are (a run trained on your own data has no image-file
    preprocessing to apply). One row per file or input."""
    if inputs is None:
        return api.predict(
            target, files, top_k, out, checkpoint, recipe, overrides, plugins, batch_size, trust_checkpoint
        )
    from dlrecipes.after_training import predict as tool
    from dlrecipes.after_training.opened import open_trained

    # opened as the CLI's commands open it: a run in a bucket (s3://...) too
    with open_trained(target, checkpoint, recipe, overrides, plugins, trust_checkpoint) as trained:
        predictor = tool.run_predictor(trained, files=False)
    return tool.predict_inputs(predictor, inputs, top_k, batch_size)


export = _kept(_with_objects(api.export))
sweep = _kept(api.sweep)
resolve = api.resolve
show = api.show


def runs(runs_dir: str | Path = RUNS_DIR, last: int | None = None):
    """The runs under ``runs_dir``, newest first, as a pandas DataFrame indexed by run name."""
    from dlrecipes.records.frames import table_frame

    return table_frame(api.runs(runs_dir, last), index="name")


def compare(run_dirs: Sequence[str | Path] = (), last: int | None = None, runs_dir: str | Path = RUNS_DIR):
    """The runs side by side: (a DataFrame, one row per run with the recipe values that differ among them as
    columns; a Figure of eval top-1 against wall-clock time)."""
    from dlrecipes.records.frames import table_frame
    from dlrecipes.records.plots import comparison_figure
    from dlrecipes.records.store import select_runs

    chosen = select_runs(run_dirs, last, runs_dir)[0]  # runs in a bucket: local copies of their records
    rows, _ = api.compare(chosen)
    return table_frame(rows, index="run"), comparison_figure(chosen, rows)


def plot(run_dir: str | Path):
    """A run's history (loss, accuracy, learning rate) as one matplotlib Figure."""
    from dlrecipes.records.plots import history_figure
    from dlrecipes.records.store import read_records

    return history_figure(read_records([run_dir])[0][0])  # a run in a bucket: a local copy of its records


def _keys_explained(function: Callable) -> None:
    """Append to ``function``'s docstring what each recipe key it names (````run_name````, ````trainer.seed````)
    means, so ``help(dlrecipes.train)`` answers it where it is asked."""
    import inspect

    from dlrecipes.config.meanings import key_meaning

    doc = function.__doc__ or ""
    own = set(inspect.signature(function).parameters)
    named = re.findall(r"``([a-z_]+(?:\.[a-z_]+)*)``", doc)  # a bare word is a recipe key only if it is one of these
    keys = dict.fromkeys(k for k in named if k not in own and ("." in k or k in ("run_name", "runs_dir")))
    lines = [f"    {key}: {meaning}" for key in keys if (meaning := key_meaning(key))]
    if lines:
        function.__doc__ = doc.rstrip() + "\n\n    Recipe keys named above:\n\n" + "\n".join(lines) + "\n"


for _function in (train, evaluate, predict, export, sweep, runs, compare, plot):
    _keys_explained(_function)
