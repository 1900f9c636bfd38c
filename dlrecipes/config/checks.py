"""Checks of a recipe beyond its types: components against their factories, losses, metrics and
what one section implies for another (monitors, loaders, algorithms, input sizes).  No torch."""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Collection
from typing import Any

from dlrecipes import registry
from dlrecipes.config.schema import check, check_params
from dlrecipes.config.sections import FSDP_KEYS, Component, RecipeConfig, compile_keys
from dlrecipes.config.tasks import declared_io
from dlrecipes.core import lr_scaling
from dlrecipes.core.durations import parse_duration
from dlrecipes.core.outputs import EVAL_LOSS, metric_names
from dlrecipes.errors import RecipeError, did_you_mean, shown

_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]*$")  # sweeps name runs lr=0.01,seed=1
MAX_NAME = 120  # characters of a run or recipe name (a run directory's name, then a timestamp; 255 is the limit)


def check_component(value: Any, section: str, reg: registry.Registry) -> Component:
    if isinstance(value, str):  # `optimizer: adamw` is short for {name: adamw}
        value = {"name": value}
    if not isinstance(value, dict):
        raise RecipeError(
            f"{section}: expected a mapping with 'name:' (one of {', '.join(reg.names())}), got {shown(value)}"
        )
    if "name" not in value:
        raise RecipeError(f"{section}.name: missing required key (one of {', '.join(reg.names())})")
    name = value["name"]
    if not isinstance(name, str):
        raise RecipeError(f"{section}.name: expected a {reg.what} name, got {shown(name)}")
    entry = reg.get(name, key_path=f"{section}.name")
    params = {k: v for k, v in value.items() if k != "name"}
    own = {}
    if section == "optimizer":
        own = {k: check(params.pop(k), tp, f"optimizer.{k}") for k, tp in lr_scaling.KEYS.items() if k in params}
    checked = check_params(params, entry.parameters, _hints(entry.factory), section, f"{reg.what} '{name}'")
    _run_validator(entry, checked, section)
    if section == "optimizer":
        checked = _with_default_lr(checked, entry)
        lr_scaling.check(own, checked, name)
    return Component(name, {**checked, **own})


def _with_default_lr(params: dict[str, Any], entry: registry.Entry) -> dict[str, Any]:
    """The optimizer's learning rate is always in the resolved recipe: its factory's default when the recipe
    leaves it out (filled here once: the builders, the divergence check and ``show`` read ``optimizer.lr``)."""
    accepted = entry.parameters.get("lr")
    if "lr" not in params and accepted is not None and accepted.default is not accepted.empty:
        params = {"lr": accepted.default, **params}
    return params


def check_component_map(value: Any, section: str, reg: registry.Registry) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{section}: expected a mapping of {reg.what} names to parameters, got {shown(value)}")
    out = {}
    for name, params in value.items():
        if params is None or params is False:  # `ema: null` in a child recipe switches it off
            continue
        if params is True:
            params = {}
        if not isinstance(params, dict):
            raise RecipeError(
                f"{section}.{name}: expected a mapping of parameters, true (defaults) or null (off), got {params!r}"
            )
        entry = reg.get(name, key_path=f"{section}.{name}")
        out[name] = check_params(
            params, entry.parameters, _hints(entry.factory), f"{section}.{name}", f"{reg.what} '{name}'"
        )
        _run_validator(entry, out[name], f"{section}.{name}")
    return out


def check_loss(value: Any, path: str) -> str | dict[str, Any]:
    """A loss: a registered name, or ``{name: ..., <params>}`` checked against its factory.

    Written back one way (so that a resumed run compares equal): the bare name when every
    parameter is the factory's default, else the name with the parameters that differ.
    """
    if isinstance(value, str):
        registry.losses.get(value, key_path=path)  # a misspelled name is the key's error, not `name`'s
        value = {"name": value}
    if not isinstance(value, dict):
        raise RecipeError(f"{path}: expected a loss name or {{name: ..., <params>}}, got {shown(value)}")
    component = check_component(value, path, registry.losses)
    defaults = _with_defaults(registry.losses.get(component.name), {})
    changed = {k: v for k, v in component.params.items() if defaults.get(k, object()) != v}
    return {"name": component.name, **changed} if changed else component.name


def check_metrics(value: Any, section: str) -> dict[str, dict[str, Any]]:
    """``metrics``/``train_metrics``: a list of names or a mapping of names to parameters."""
    if isinstance(value, list):
        if not all(isinstance(name, str) for name in value):
            raise RecipeError(f"{section}: expected a list of metric names, got {shown(value)}")
        value = {name: {} for name in value}
    metrics = check_component_map(value, section, registry.metrics)
    if section == "train_metrics":
        for name in metrics:
            if registry.metrics.get(name).metadata.get("report"):
                raise RecipeError(
                    f"train_metrics.{name}: a table written for the best evaluation; list it under metrics: instead"
                )
    return metrics


def _run_validator(entry: registry.Entry, params: dict[str, Any], path: str) -> None:
    """An entry may register ``validator=fn(params, key_path)`` for checks beyond types."""
    validator = entry.metadata.get("validator")
    if validator is not None:
        validator(params, path)


def _hints(factory: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(factory, include_extras=True)
    except Exception:  # an annotation we cannot resolve: check only names, not types
        return {}


def _check_option_keys(key: str, given: Any, valid: tuple[str, ...]) -> None:
    if isinstance(given, dict):
        for name in given:
            if name not in valid:
                raise RecipeError(
                    f"{key}.{name}: unknown option{did_you_mean(str(name), valid)}; valid: {', '.join(valid)}"
                )


def _with_defaults(entry: registry.Entry, params: dict[str, Any]) -> dict[str, Any]:
    defaults = {n: p.default for n, p in entry.parameters.items() if p.default is not p.empty}
    return {**defaults, **params}


def refuse_small_inputs(family: str, arch: str, input_shape, min_input_size: int) -> None:
    """ImageNet architectures downsample 32x early: on CIFAR-sized images little is left (also run by
    the timm and torchvision model factories on the shape they are given)."""
    if input_shape is not None and min(input_shape[1:]) < min_input_size:
        raise RecipeError(
            f"model.arch: {family} '{arch}' is built for ImageNet-sized inputs and the data is "
            f"{input_shape[1]}x{input_shape[2]} (below min_input_size={min_input_size}). "
            "Use a CIFAR-sized model (cifar_resnet18, cifar_preact_resnet18) or set model.min_input_size."
        )


def _check_input_side(config: RecipeConfig) -> None:
    """A model with ``min_input_size`` (timm, torchvision) against the data's image side, before building."""
    if config.task is not None:
        return
    data, model = registry.datasets.get(config.dataset.name), registry.models.get(config.model.name)
    side_of = data.metadata.get("image_side")
    if side_of is None or "min_input_size" not in model.parameters:
        return
    side = side_of(_with_defaults(data, config.dataset.params))
    params = _with_defaults(model, config.model.params)
    refuse_small_inputs(
        config.model.name, params.get("arch", config.model.name), (3, side, side), params["min_input_size"]
    )


def _logged_metrics(config: RecipeConfig, split: str) -> tuple[list[str], str]:
    """The metric names an evaluation (``eval``) or the training (``train``) logs, and an example."""
    if config.task is not None:
        outputs = {
            name: io
            for name, io in declared_io(config.dataset.name, config.dataset.params).outputs.items()
            if name in config.task.outputs
        }
        example = next((f"{n}/top1" for n, s in outputs.items() if s.kind == "class"), f"{next(iter(outputs))}/loss")
        return metric_names(outputs, train=split == "train"), example
    if split == "train":
        names = list(config.train_metrics)
        return names, (names or ["top1"])[0]
    scalar = [n for n in config.metrics if not registry.metrics.get(n).metadata.get("report")]
    return [*scalar, EVAL_LOSS], (scalar or [EVAL_LOSS])[0]


def _check_monitors(config: RecipeConfig) -> None:
    """checkpoint.monitor and every callback's ``monitor`` must be a metric the run logs."""
    watched = []
    if config.checkpoint.monitor:
        watched.append(("checkpoint.monitor", config.checkpoint.monitor, "eval"))
    for name, params in config.callbacks.items():
        entry = registry.callbacks.get(name)
        if "monitor" in entry.parameters:
            default = entry.parameters["monitor"].default
            split = params.get("split", "eval")
            watched.append((f"callbacks.{name}.monitor", params.get("monitor", default), split))
    for path, monitor, split in watched:
        if split == "train" and config.trainer.train_metrics_interval == 0:
            raise RecipeError(
                f"{path}: split 'train' watches a train metric, but trainer.train_metrics_interval "
                "is 0 (no train metrics); set it to 1 or more, or watch split 'eval'"
            )
        known, example = _logged_metrics(config, split)
        if monitor not in known:
            raise RecipeError(
                f"{path}: '{monitor}' is not {'an eval' if split == 'eval' else 'a train'} metric of this "
                f"{'task' if config.task is not None else 'run'}"
                f"{did_you_mean(str(monitor), known)}; it logs {', '.join(known)} (e.g. {path}={example})"
            )


def check_cross_fields(config: RecipeConfig, given: Collection[str] = ()) -> None:
    """What one section implies for another (ranges of single keys are in their types: core.ranges);
    ``given``: the top-level sections the recipe sets (defaults may be fitted to the data, given ones not)."""
    t = config.trainer
    _check_classes(config, given)
    _check_monitors(config)
    if config.checkpoint.load_ignore_keys and not config.checkpoint.load_weights_only:
        raise RecipeError(
            "checkpoint.load_ignore_keys: applies to weights-only loads; set "
            "checkpoint.load_weights_only=true, or remove load_ignore_keys"
        )
    if config.checkpoint.best_only and not config.checkpoint.monitor:
        raise RecipeError("checkpoint.best_only: needs checkpoint.monitor, the metric that decides what is best")
    _check_option_keys("trainer.fsdp", t.fsdp, FSDP_KEYS)
    if isinstance(t.compile, dict):
        _check_option_keys("trainer.compile", t.compile, compile_keys())
    _check_input_side(config)
    _check_names(config)
    for key in ("train_subset_num_batches", "eval_subset_num_batches"):
        if getattr(t, key) == 0 or getattr(t, key) < -1:
            raise RecipeError(f"trainer.{key}: -1 (all batches) or at least 1, got {getattr(t, key)}")
    _check_warmup(config)
    f = config.finetune
    if f is not None and f.layer_decay is not None and "layerwise_lr_decay" in config.algorithms:
        raise RecipeError("finetune.layer_decay: algorithms.layerwise_lr_decay is set too; keep one of them")
    _check_loader(config)
    _check_algorithm_prerequisites(config)


def _check_names(config: RecipeConfig) -> None:
    if config.run_name is not None and not _RUN_NAME_RE.match(config.run_name):
        raise RecipeError(
            f"run_name: {shown(config.run_name)} must be a plain name "
            "(letters, digits, '.', '_', '-', '=', ',', '+'; no '/' or '..')"
        )
    for key, name in (("run_name", config.run_name), ("name", config.name)):
        if name is not None and len(name) > MAX_NAME:
            raise RecipeError(
                f"{key}: {len(name)} characters; at most {MAX_NAME} (run directories and the files in "
                "them must fit the filesystem's limits)"
            )


def _check_loader(config: RecipeConfig) -> None:
    """The device loader holds in-memory datasets; the tensor cache caches image folders."""
    loader, data = config.trainer.loader, registry.datasets.get(config.dataset.name)
    if loader == "device" and not data.metadata.get("in_memory"):
        usable = ", ".join(e.name for e in registry.datasets if e.metadata.get("in_memory"))
        raise RecipeError(
            f"trainer.loader: 'device' needs a dataset held in memory as tensors ({usable}); "
            f"'{config.dataset.name}' reads files: use trainer.loader=torch"
        )
    if loader == "tensor_cache" and not data.metadata.get("pil_images"):
        usable = ", ".join(e.name for e in registry.datasets if e.metadata.get("pil_images"))
        raise RecipeError(
            f"trainer.loader: 'tensor_cache' caches image folders ({usable}); for '{config.dataset.name}' "
            "use trainer.loader=device (in-memory data) or torch"
        )


def _check_algorithm_prerequisites(config: RecipeConfig) -> None:
    """Algorithms that exclude each other, or need a kind of model or data (entry metadata)."""
    for name in config.algorithms:
        entry = registry.algorithms.get(name)
        for other, reason in entry.metadata.get("conflicts_with", {}).items():
            if other in config.algorithms:
                raise RecipeError(f"algorithms: {name} and {other} cannot be used together ({reason}); remove one")
        requires = entry.metadata.get("requires")
        problem = requires(config) if requires is not None else None
        if problem:
            raise RecipeError(f"algorithms.{name}: {problem}")


def _check_warmup(config: RecipeConfig) -> None:
    """A warmup must end before the run does (compared when both are in the same unit, or a fraction)."""
    entry = registry.schedulers.get(config.scheduler.name)
    warmup = _with_defaults(entry, config.scheduler.params).get("warmup")
    if not isinstance(warmup, str):
        return
    (w, w_unit), (m, m_unit) = parse_duration(warmup), parse_duration(config.trainer.max_duration)
    if w > 0 and ((w_unit == "dur" and w >= 1) or (w_unit == m_unit and w >= m)):
        raise RecipeError(
            f"scheduler.warmup: {warmup} is not shorter than the run (trainer.max_duration "
            f"{config.trainer.max_duration}); use a shorter warmup, e.g. {'0.1dur'}"
        )


def dataset_classes(config: RecipeConfig):
    """The dataset's class count when its registry entry can tell it without reading the data, else None."""
    entry = registry.datasets.get(config.dataset.name)
    count = entry.metadata.get("classes")
    return count(_with_defaults(entry, config.dataset.params)) if count is not None else None


def _check_classes(config: RecipeConfig, given: Collection[str]) -> None:
    """At least 2 classes, and no top-k metric with k at or above them (always 1): a default one is left
    out (top5 of 5 classes or fewer), one the recipe names is refused."""
    if config.task is not None:
        return
    classes = dataset_classes(config)
    if classes is None:
        return
    if classes < 2:
        raise RecipeError(
            f"dataset: {config.dataset.name} has {classes} class{'es' if classes != 1 else ''}; a "
            "classifier needs at least 2 (check the folders under the training path)"
        )
    for section in ("metrics", "train_metrics"):
        chosen = getattr(config, section)
        for name, params in list(chosen.items()):
            k_of = registry.metrics.get(name).metadata.get("top_k")
            k = k_of(params) if k_of is not None else None
            if k is None or k < classes:
                continue
            if section in given:
                raise RecipeError(
                    f"{section}.{name}: top-{k} of {classes} classes is always 1; remove it "
                    f"(or use a k below {classes})"
                )
            del chosen[name]  # a default metric that would say nothing for this data


FLOAT_BYTES = 4  # an element of the model's input batch, and of an in-memory dataset's images as it is built


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(config: RecipeConfig, processes: int = 1, memory: int | None = None) -> None:
    """Refuse what cannot fit in this machine's memory, before anything is built: one batch's input tensor (each of
    ``processes`` loads its share of the global batch) and the images an in-memory dataset holds as it is built,
    each a product of the recipe's numbers (float32 elements; the dataset's channels and image side where its entry
    says them, else one channel of the side it knows), against the physical memory (``memory``: that, given).
    A lower bound: what passes may still not fit; what is refused cannot."""
    memory = machine_memory() if memory is None else memory
    entry = registry.datasets.get(config.dataset.name)
    side_of, channels_of = entry.metadata.get("image_side"), entry.metadata.get("channels")
    if memory is None or config.task is not None or side_of is None:
        return
    params = _with_defaults(entry, config.dataset.params)
    channels, side = channels_of(params) if channels_of else 1, side_of(params)
    image = channels * side * side * FLOAT_BYTES
    shape = f"{channels}x{side}x{side}"
    t = config.trainer
    for key, batch in (("trainer.batch_size", t.batch_size), ("trainer.eval_batch_size", t.eval_batch_size)):
        share = -(-(batch or 0) // max(1, processes))
        if share * image > memory:
            raise RecipeError(
                f"{key}: one batch of {share:,} images of {shape} float32 is {_gib(share * image)}, "
                f"and this machine has {_gib(memory)} of memory; at most {memory // image:,} images "
                "of this size fit (a smaller batch, or smaller images)"
            )
    held_of = entry.metadata.get("held_samples")
    held = held_of(params) if held_of else 0
    if held * image > memory:
        raise RecipeError(
            f"dataset: {config.dataset.name} holds {held:,} images of {shape} float32 in memory, "
            f"{_gib(held * image)}, and this machine has {_gib(memory)}; at most {memory // image:,} "
            "images of this size fit (fewer samples, or smaller images)"
        )
