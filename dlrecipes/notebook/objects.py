"""Your own model and data from Python: ``dlrecipes.train(recipe, model=net, train_data=..., eval_data=...)``.

The objects are registered for this process under ``object:<name>`` names (:data:`dlrecipes.registry.OBJECT_PREFIX`)
and take the place of the recipe's ``model`` and ``dataset`` sections, so everything else (validation, the
run directory, checkpoints, resume, evaluation) goes the way it goes for a registered model.  The run's
recipe.yaml names them; another process says to pass them again.

- ``model``: an ``nn.Module`` producing class logits, wrapped like the built-ins (the recipe's loss, metrics,
  top-k), or a Composer ``ComposerModel``, used as it is.  It is trained in place: its weights are the trained
  ones afterwards, and training it again continues from them (pass a new instance to start over).
- ``train_data`` / ``eval_data``: a ``Dataset`` of ``(image tensor, int label)`` or of dicts holding an image
  and a label (``input_key=``/``target_key=``, found when unambiguous: :mod:`dlrecipes.notebook.samples`), or a
  ``DataLoader`` over one, used as it is (its batch size, shuffling and workers; one process only).  The class
  count comes from ``num_classes=``, else the dataset's ``classes``, else its labels.

What they yield is checked before the run starts (the first sample) and at the first batch (the model's output),
each refusal one line naming the keyword and what would be valid.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from dlrecipes import registry
from dlrecipes.errors import RecipeError
from dlrecipes.recipe import LoadedRecipe

DATA_NAME = "data"  # the datasets' entry: object:data


def _is_loader(value: Any) -> bool:
    from torch.utils.data import DataLoader

    return isinstance(value, DataLoader)


def _check_model(model: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise RecipeError(
            f"model=: expected a torch.nn.Module (or a Composer ComposerModel), got {type(model).__name__}"
        )


def _check_data(value: Any, keyword: str) -> None:
    from torch.utils.data import Dataset

    if not (
        _is_loader(value) or isinstance(value, Dataset) or hasattr(value, "__getitem__") and hasattr(value, "__len__")
    ):
        raise RecipeError(
            f"{keyword}: expected a torch Dataset (with __getitem__ and __len__) or a DataLoader, got "
            f"{type(value).__name__}"
        )


def _labels(dataset: Any) -> list[int]:
    """Every label of a dataset of (input, label) samples, read the cheapest way it allows."""
    from torch.utils.data import TensorDataset

    targets = getattr(dataset, "targets", None)
    if targets is None and isinstance(dataset, TensorDataset):
        targets = dataset.tensors[-1]
    if targets is None:
        targets = [dataset[i][1] for i in range(len(dataset))]
    return [int(t) for t in targets]


def _class_facts(datasets: Sequence[Any], num_classes: int | None, class_names: Sequence[str] | None):
    names = list(class_names) if class_names is not None else None
    if names is None:
        found = getattr(datasets[0], "classes", None)
        names = [str(c) for c in found] if isinstance(found, (list, tuple)) else None
    if num_classes is None:
        num_classes = len(names) if names else 1 + max(max(_labels(d), default=0) for d in datasets)
    if names is not None and len(names) != num_classes:
        raise RecipeError(f"class_names: {len(names)} names for {num_classes} classes")
    return num_classes, names


def data_factory(
    train_data: Any,
    eval_data: Any,
    num_classes: int | None,
    class_names: Sequence[str] | None,
    keys: tuple[str | None, str | None] = (None, None),
    facts: dict | None = None,
):
    """A dataset factory (no parameters) returning :class:`DatasetSplits` over the objects (dict samples read by
    ``keys``); the class count goes into ``facts`` (the model's output check reads it)."""

    def factory():
        from dlrecipes.data.splits import DatasetSplits
        from dlrecipes.notebook.samples import loader_batches, readable

        train = train_data if train_data is not None else eval_data  # evaluating only: the eval split twice
        keywords = ("train_data=" if train_data is not None else "eval_data=", "eval_data=")
        sets = [
            readable(x.dataset if _is_loader(x) else x, keyword, *keys)
            for x, keyword in zip((train, eval_data), keywords)
        ]
        count, names = _class_facts(sets, num_classes, class_names)
        if facts is not None:
            facts["count"] = count
        sample = sets[0][0][0]
        shape = tuple(getattr(sample, "shape", ()))
        loaders = tuple(
            loader_batches(x, samples) if _is_loader(x) else None for x, samples in zip((train, eval_data), sets)
        )
        return DatasetSplits(
            train=sets[0],
            eval=sets[1],
            num_classes=count,
            input_shape=shape,
            class_names=names,
            loaders=loaders if any(loaders) else None,
        )

    factory.__doc__ = "Data passed to dlrecipes.train from Python."
    return factory


def register_objects(
    model: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    num_classes: int | None = None,
    class_names: Sequence[str] | None = None,
    input_key: str | None = None,
    target_key: str | None = None,
) -> dict[str, str]:
    """Register the objects given; returns {recipe section: the name it now has}."""
    from dlrecipes.notebook.samples import OutputCheck

    names: dict[str, str] = {}
    facts: dict[str, int] = {}  # the data's class count, for the model's output check
    if model is not None:
        _check_model(model)
        name = type(model).__name__

        def model_factory():
            from composer.models import ComposerModel

            if not isinstance(model, ComposerModel):  # used as it is: its own forward takes the batch
                OutputCheck("model=", facts).attach(model)
            return model

        model_factory.__doc__ = f"{name}, passed to dlrecipes.train from Python."
        registry.models.put_object(name, model_factory, source=f"a {name} object passed from Python")
        names["model"] = registry.OBJECT_PREFIX + name
    if train_data is not None or eval_data is not None:
        if eval_data is None:
            raise RecipeError(
                "eval_data=: required with train_data= (a Dataset or DataLoader to evaluate on; pass "
                "the training data again to evaluate on it)"
            )
        for value, keyword in ((train_data, "train_data="), (eval_data, "eval_data=")):
            if value is not None:
                _check_data(value, keyword)
        registry.datasets.put_object(
            DATA_NAME,
            data_factory(train_data, eval_data, num_classes, class_names, (input_key, target_key), facts),
            source="data objects passed from Python",
        )
        names["dataset"] = registry.OBJECT_PREFIX + DATA_NAME
    return names


def describe(section: Any) -> str:
    if isinstance(section, dict):
        name = section.get("name", "?")
        params = ", ".join(f"{k}: {v}" for k, v in section.items() if k != "name")
        return f"{name} ({params})" if params else str(name)
    return str(section)


def use_objects(loaded: LoadedRecipe, names: dict[str, str], echo: Any = None) -> list[str]:
    """Put the objects' names in place of the recipe's sections; returns one note per section replaced (said on
    standard error unless ``echo`` is given)."""
    notes = []
    for section, name in names.items():
        replaced = loaded.data.get(section)
        keyword = "model=" if section == "model" else "train_data=/eval_data="
        if replaced is not None and replaced != {"name": name}:
            notes.append(f"note: {keyword} replaces the recipe's {section}: {describe(replaced)}")
        loaded.data[section] = {"name": name}
        for key in [k for k in loaded.sources if k == section or k.startswith(section + ".")]:
            del loaded.sources[key]
        loaded.sources[f"{section}.name"] = f"{keyword} of dlrecipes.train"
    for note in notes:
        (echo or (lambda line: print(line, file=sys.stderr)))(note)
    return notes
