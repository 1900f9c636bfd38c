"""The image-preprocessing parameters shared by dataset factories (dlrecipes.data.preprocess_params): declared once,
used by every built-in dataset that takes them, refused out of range naming the key."""

from __future__ import annotations

import inspect
import typing

import pytest

from dlrecipes import registry
from dlrecipes.config import validate
from dlrecipes.config.schema import type_name
from dlrecipes.data import preprocess_params
from dlrecipes.data.preprocess_params import SHARED, meaning, shared_meanings
from dlrecipes.errors import RecipeError
from dlrecipes.recipe import load_recipe

from .conftest import write


def _builtin_datasets() -> list[registry.Entry]:
    return [e for e in registry.REGISTRIES["datasets"] if e.factory.__module__.startswith("dlrecipes.")]


def test_every_dataset_taking_a_shared_parameter_declares_it_as_shared():
    """Same type (so the same range and validation), same default and same meaning wherever the name appears."""
    drift, users = [], {}
    for entry in _builtin_datasets():
        hints = typing.get_type_hints(entry.factory, include_extras=True)
        for name, param in entry.parameters.items():
            if name not in SHARED:
                continue
            users.setdefault(name, []).append(entry.name)
            shared_type, default = SHARED[name]
            if hints.get(name) != shared_type:
                drift.append(f"{entry.name}.{name}: type {hints.get(name)}, not preprocess_params' {shared_type}")
            if param.default != default:
                drift.append(f"{entry.name}.{name}: default {param.default!r}, not {default!r}")
            if entry.meanings.get(name) != meaning(name):
                drift.append(f"{entry.name}.{name}: meaning {entry.meanings.get(name)!r}, not the shared one")
    assert not drift, "\n".join(drift)
    for name in ("crop_size", "eval_crop_size", "min_scale", "hflip"):
        assert {"image_folder", "imagenet", "imagenet100", "hf", "ffcv"} <= set(users[name]), name
    assert {"image_folder", "hf", "ffcv"} <= set(users["mean"]) and set(users["mean"]) == set(users["std"])
    assert users["resize_ratio"] == ["ffcv"] and "ffcv" not in users["resize_size"]


def test_every_shared_parameter_has_a_meaning_and_reads_as_a_type():
    for name, (tp, _) in SHARED.items():
        assert meaning(name) and not meaning(name).startswith(name), name
        assert "Annotated" not in type_name(tp), (name, type_name(tp))
    assert type_name(preprocess_params.CropSize) == "int in [1, 8192]"
    assert type_name(preprocess_params.EvalCropSize) == "null or int in [1, 8192]"
    assert type_name(preprocess_params.MinScale) == "float in (0, 1]"
    assert preprocess_params.RESIZE_RATIO == 224 / 256


def test_shared_meanings_needs_an_args_section_to_join():
    def factory(hflip: bool = True):
        """No sections."""

    with pytest.raises(ValueError, match="Args: section"):
        shared_meanings(factory)


_FOLDERS = "{name: image_folder, train_path: nowhere/train, val_path: nowhere/val"
_FFCV = "{name: ffcv, train_path: nowhere/train.beton, val_path: nowhere/val.beton"
_RECIPE = """
    model: {{name: cnn_simple, width: 4, hidden: 16}}
    dataset: {dataset}}}
    trainer: {{max_duration: 1ep, batch_size: 8, device: cpu}}
    optimizer: {{name: sgd, lr: 0.05}}
"""


def _validated(tmp_path, dataset: str):
    recipe = write(tmp_path / "r.yaml", _RECIPE.format(dataset=dataset))
    return validate(load_recipe(recipe, []), check_device=False, check_data=False)


@pytest.mark.parametrize(
    "dataset, message",
    [
        (f"{_FOLDERS}, min_scale: 2", r"dataset\.min_scale: expected float in \(0, 1\], got 2"),
        (f"{_FOLDERS}, min_scale: 0", r"dataset\.min_scale: expected float in \(0, 1\], got 0"),
        (f"{_FOLDERS}, crop_size: 0", r"dataset\.crop_size: expected int in \[1, 8192\], got 0"),
        (f"{_FOLDERS}, resize_size: -256", r"dataset\.resize_size: expected int in \[1, 8192\], got -256"),
        (f"{_FOLDERS}, eval_crop_size: 0", r"dataset\.eval_crop_size: expected null or int in \[1, 8192\], got 0"),
        (f"{_FOLDERS}, mean: [0.5]", r"dataset\.mean: expected a list of 3 values, got \[0\.5\]"),
        (f"{_FOLDERS}, mean: [123.7, 116.3, 103.5]", r"dataset\.mean\[0\]: expected float in \[0, 1\], got 123\.7"),
        (f"{_FOLDERS}, hflip: 3", r"dataset\.hflip: expected bool, got 3"),
        (f"{_FFCV}, std: [0.2, 0, 0.2]", r"dataset\.std\[1\]: expected float in \(0, 1\], got 0"),
        (f"{_FFCV}, resize_ratio: 1.2", r"dataset\.resize_ratio: expected float in \(0, 1\], got 1\.2"),
        ("{name: imagenet, min_scale: 1.5", r"dataset\.min_scale: expected float in \(0, 1\], got 1\.5"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(tmp_path, dataset, message):
    with pytest.raises(RecipeError, match=message):
        _validated(tmp_path, dataset)


def test_values_in_range_pass_and_keep_their_meaning(tmp_path):
    config = _validated(tmp_path, f"{_FOLDERS}, min_scale: 1, eval_crop_size: null, mean: [0, 0.5, 1], std: [1, 1, 1]")
    assert config.dataset.params["min_scale"] == 1.0
    assert list(config.dataset.params["mean"]) == [0.0, 0.5, 1.0]
    config = _validated(tmp_path, f"{_FFCV}, resize_ratio: 1, crop_size: 160, eval_crop_size: 224")
    assert config.dataset.params["resize_ratio"] == 1.0
    signature = inspect.signature(registry.REGISTRIES["datasets"].get("ffcv").factory)
    assert signature.parameters["mean"].default == preprocess_params.IMAGENET_MEAN
