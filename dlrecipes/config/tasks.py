"""Multi-input / multi-output tasks: the checks behind a recipe's ``task:`` section.

A task names the inputs a model receives (separate tensors, in the task's order) and, for
each output, its loss and weight.  The dataset declares what it yields (``io=`` in its
registry entry, a :class:`~dlrecipes.core.outputs.DataIO`), and the model declares that it
takes several inputs (``multi_io=True``).  :func:`check_task` compares the three when the
recipe is validated, before anything is built, and refuses what a ``(inputs..., targets...)``
batch cannot do (metric names: :mod:`dlrecipes.core.outputs`).  No torch is imported.
"""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

from dlrecipes import registry
from dlrecipes.core.outputs import DataIO, OutputSpec
from dlrecipes.errors import RecipeError, did_you_mean, shown

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig


_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
_RESERVED = {"total"}  # Composer logs the weighted sum as loss/train/total


def multi_io_datasets() -> list[str]:
    return [e.name for e in registry.datasets if e.metadata.get("io")]


def multi_io_models() -> list[str]:
    return [e.name for e in registry.models if e.metadata.get("multi_io")]


def declared_io(dataset_name: str, params: dict[str, Any]) -> DataIO | None:
    """What a dataset entry says it yields for these parameters (its ``io=``), or None for (image, label) data."""
    entry = registry.datasets.get(dataset_name)
    io = entry.metadata.get("io")
    if io is None:
        return None
    defaults = {n: p.default for n, p in entry.parameters.items() if p.default is not inspect.Parameter.empty}
    return io({**defaults, **params})


def check_task(config: RecipeConfig, loss_given: bool = False) -> None:
    """The task against the dataset, the model, the loader, the algorithms and the monitored metrics.

    ``loss_given``: the recipe set the top-level ``loss:`` (which a task replaces).
    """
    io = declared_io(config.dataset.name, config.dataset.params)
    is_multi_io_model = registry.models.get(config.model.name).metadata.get("multi_io", False)
    task = config.task
    if task is None:
        if io is not None:
            raise RecipeError(
                f"task: dataset '{config.dataset.name}' yields inputs ({', '.join(io.inputs)}) and outputs "
                f"({', '.join(io.outputs)}); declare them under task: "
                "{inputs: [...], outputs: {name: {loss: ..., weight: ...}}}"
            )
        if is_multi_io_model:
            raise RecipeError(
                f"model.name: '{config.model.name}' takes several inputs and returns several outputs; it needs a "
                f"task: section and a dataset that declares them ({', '.join(multi_io_datasets())})"
            )
        return
    if io is None:
        raise RecipeError(
            f"task: dataset '{config.dataset.name}' yields (image, label) pairs; a task needs a dataset that declares "
            f"its inputs and outputs ({', '.join(multi_io_datasets())}), or remove task:"
        )
    if not is_multi_io_model:
        raise RecipeError(
            f"model.name: '{config.model.name}' takes one image and returns one set of logits; with task: use a "
            f"multi-input model ({', '.join(multi_io_models())})"
        )
    if loss_given:
        raise RecipeError("loss: with task:, each output names its own loss (task.outputs.<name>.loss); remove loss")
    _check_names(task.inputs, list(io.inputs), "task.inputs", "inputs", config.dataset.name)
    _check_names(list(task.outputs), list(io.outputs), "task.outputs", "outputs", config.dataset.name)
    for name, out in task.outputs.items():
        _check_output(name, out, io.outputs[name], config.dataset.name)
    if not any(out.weight > 0 for out in task.outputs.values()):
        raise RecipeError("task.outputs: every weight is 0, so nothing would be trained; give one output a weight > 0")
    _check_batch_users(config)


def _check_names(given: list[str], declared: list[str], path: str, what: str, dataset: str) -> None:
    for name in given:
        if not isinstance(name, str) or not _NAME_RE.match(name) or name in _RESERVED:
            raise RecipeError(f"{path}: {shown(name)} is not a usable name (letters, digits, '_' or '-'; not 'total')")
    if len(set(given)) != len(given):
        twice = sorted({n for n in given if given.count(n) > 1})
        raise RecipeError(f"{path}: {', '.join(twice)} named more than once")
    for name in given:
        if name not in declared:
            raise RecipeError(
                f"{path}: '{name}' is not one of the {what} of dataset '{dataset}'{did_you_mean(name, declared)}; "
                f"it yields {', '.join(declared)}"
            )
    missing = [n for n in declared if n not in given]
    if missing:
        raise RecipeError(
            f"{path}: dataset '{dataset}' yields {len(declared)} {what} ({', '.join(declared)}) and the task names "
            f"{len(given)}; add {', '.join(missing)}"
        )


def _check_output(name: str, out: Any, spec: OutputSpec, dataset: str) -> None:
    path = f"task.outputs.{name}"
    loss = out.loss if isinstance(out.loss, str) else out.loss["name"]
    if registry.losses.get(loss).metadata.get("targets") != spec.kind:
        fitting = ", ".join(e.name for e in registry.losses if e.metadata.get("targets") == spec.kind)
        target = "a class label" if spec.kind == "class" else f"{spec.size} regression value(s)"
        raise RecipeError(
            f"{path}.loss: '{loss}' does not fit output '{name}' of dataset '{dataset}', which is "
            f"{target}; use {fitting}"
        )
    if out.weight < 0:
        raise RecipeError(f"{path}.weight: must be 0 or more, got {out.weight}")
    if out.num_classes is not None:
        if spec.kind != "class":
            raise RecipeError(f"{path}.num_classes: output '{name}' is a regression target; remove num_classes")
        if out.num_classes != spec.size:
            raise RecipeError(
                f"{path}.num_classes: {out.num_classes} does not match dataset '{dataset}', whose output '{name}' has "
                f"{spec.size} classes (leave num_classes out to take it from the data)"
            )


def _check_batch_users(config: RecipeConfig) -> None:
    """A task's batch is (inputs..., targets...): no per-image (x, y) loader or algorithm."""
    if config.trainer.loader != "torch":
        raise RecipeError(
            f"trainer.loader: '{config.trainer.loader}' batches single (image, label) samples; with task: use "
            "trainer.loader=torch"
        )
    for name in config.algorithms:
        reason = registry.algorithms.get(name).metadata.get("image_label_batch")
        if reason:
            raise RecipeError(
                f"algorithms.{name}: {reason}, and a task's batch is (inputs..., targets...); remove {name} "
                "(model-level algorithms such as ema, swa, sam, channels_last, gradient_clipping work)"
            )
