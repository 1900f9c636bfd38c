"""The validate stage: a loaded recipe (a nested dict) in, a :class:`RecipeConfig` out.

A credential in a recipe key is refused first (:mod:`dlrecipes.core.secrets`); then unknown keys, types and
required keys (:mod:`.schema` against :mod:`.sections`), registry names and each named
component's parameters against its factory's signature (:mod:`.checks`), tasks (:mod:`.tasks`), input paths
(:mod:`.paths`), batches that divide over a launcher's processes (:mod:`.devices`) and what this machine can
run (:mod:`dlrecipes.core.devices`) and hold (:func:`.checks.check_memory`).
"""

from __future__ import annotations

import re

import dlrecipes.config.device_checks as device_checks
from dlrecipes.config.checks import (
    check_component,
    check_component_map,
    check_cross_fields,
    check_loss,
    check_memory,
    check_metrics,
)
from dlrecipes.config.paths import check_inputs_exist, resolve_paths
from dlrecipes.config.schema import check_dataclass
from dlrecipes.config.sections import (
    COMPONENT_MAPS,
    COMPONENT_SECTIONS,
    Component,
    RecipeConfig,
)
from dlrecipes.config.tasks import check_task
from dlrecipes.core import devices, distributed
from dlrecipes.core.addresses import check_address
from dlrecipes.core.secrets import refusal, secret_keys
from dlrecipes.errors import RecipeError
from dlrecipes.recipe import LoadedRecipe


def validate(recipe: LoadedRecipe, check_device: bool = True, check_data: bool = True) -> RecipeConfig:
    """Check a loaded recipe against the schema and the registries (builds nothing).

    ``check_device=False`` skips asking whether this machine can run the recipe's device
    and precision, and hold its batches (for checking a GPU recipe on a laptop); ``check_data=False``, whether its
    input paths exist (for checking a recipe before its data is in place).  An error about a key's value carries
    the key's meaning as its ``hint`` (the CLI prints it after the error's line).
    """
    try:
        return _validated(recipe, check_device, check_data)
    except RecipeError as exc:
        found = _VALUE_ERROR.match(str(exc))
        if found and not getattr(exc, "hint", ""):
            from dlrecipes.config.meanings import explained

            exc.hint = explained(found.group(1), recipe.data)
        raise


# "optimizer.lr: expected float > 0, got -0.1": an error about a key's value, its key path first
_VALUE_ERROR = re.compile(r"^([A-Za-z_][\w-]*(?:\.[\w-]+)*): (?:expected|unknown key|got|.* must )")


def _validated(recipe: LoadedRecipe, check_device: bool, check_data: bool) -> RecipeConfig:
    credentials = secret_keys(recipe.data)
    if credentials:  # first: before any other check could quote the value
        raise RecipeError(refusal(credentials[0]))
    data = dict(recipe.data)
    components: dict[str, Component] = {}
    for section, reg in COMPONENT_SECTIONS.items():
        if section in data:
            components[section] = check_component(data.pop(section), section, reg)
    maps = {}
    for section, reg in COMPONENT_MAPS.items():
        if section in data:
            maps[section] = check_component_map(data.pop(section), section, reg)
    for section in ("metrics", "train_metrics"):
        if section in data:
            maps[section] = check_metrics(data.pop(section), section)
    if "loss" in data:
        data["loss"] = check_loss(data["loss"], "loss")
    # the remaining keys, and whether required sections are there, are checked by the dataclass
    config = check_dataclass(RecipeConfig, {**data, **components, **maps}, "")
    for section in ("optimizer", "scheduler"):
        if section not in components:  # defaults still go through the registry check
            setattr(
                config,
                section,
                check_component(getattr(config, section).to_dict(), section, COMPONENT_SECTIONS[section]),
            )
    if config.name is None:
        config.name = recipe.name
    config.origin = str(recipe.path) if recipe.from_file else None  # not a recipe key: where it was read from
    check_address(config.runs_dir, "runs_dir")  # before it is read as a path: S3://b/p would make a folder S3:
    resolve_paths(config, recipe)
    _resolve_batch_size(config, given=data.get("trainer") or {})
    device_checks.check_batches_divide(config, distributed.world_size())  # under a launcher: its processes
    if config.task is not None:
        for name, out in config.task.outputs.items():
            out.loss = check_loss(out.loss, f"task.outputs.{name}.loss")
        if "metrics" in maps or "train_metrics" in maps:
            raise RecipeError(
                "metrics: with task:, each output's metrics follow from its kind (top1/top5 or "
                "mse/mae); remove metrics and train_metrics"
            )
    check_task(config, loss_given="loss" in data)
    check_cross_fields(config, given=set(recipe.data))
    if check_device:
        devices.check_device(config)
        check_memory(config, distributed.world_size())  # a batch or in-memory dataset larger than this machine
    if check_data:  # last: a recipe mistake is reported before missing data
        check_inputs_exist(config)
    return config


def _resolve_batch_size(config: RecipeConfig, given: dict) -> None:
    """``trainer.batch_size_per_device`` x the number of processes becomes the global batch size."""
    per_device = config.trainer.batch_size_per_device
    if per_device is None:
        return
    if "batch_size" in given:
        raise RecipeError(
            "trainer.batch_size_per_device: set either it or trainer.batch_size (the global batch), not both "
            "(delete one, e.g. with the override '~trainer.batch_size')"
        )
    config.trainer.batch_size = per_device * distributed.world_size()
