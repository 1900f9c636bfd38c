"""Every override of a private method of Composer's Trainer or Engine in dlrecipes/engine/ names, in its docstring,
the Composer 0.32.1 function it replaces and the dlrecipes test that guards it (a file and a test in it that exist):
a new Composer release is checked method by method, each against its test."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re

from composer import Trainer as ComposerTrainer
from composer.core import Engine

import dlrecipes.engine

from .conftest import REPO

REPLACES = re.compile(
    r"Replaces ``(composer(?:\.\w+)+)`` \(Composer 0\.32\.1\);\s+guarded by\s+"
    r"``(tests/[\w/]+\.py)::(\w+)``"
)


def _engine_classes() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(dlrecipes.engine.__path__):
        module = importlib.import_module(f"dlrecipes.engine.{info.name}")
        found += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return found


def _overrides() -> list[tuple[type, str]]:
    """(class, name) for each method defined in the engine package that overrides a private (``_name``) one of
    Composer's Trainer or Engine, or Engine's ``run_event``."""
    found = []
    for cls in _engine_classes():
        for name, value in vars(cls).items():
            if not inspect.isfunction(value):
                continue
            private = name.startswith("_") and not name.startswith("__")
            if (
                private
                and (hasattr(ComposerTrainer, name) or hasattr(Engine, name))
                or name == "run_event"
                and issubclass(cls, Engine)
            ):
                found.append((cls, name))
    return found


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(dotted)


def _test_names(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_the_overrides_are_found():
    names = {name for _, name in _overrides()}
    assert {
        "_train_loop",
        "_iter_dataloader",
        "_train_batch",
        "_train_microbatches",
        "_train_microbatch",
        "_use_closures",
        "_compute_and_log_metrics",
        "_accumulate_time_across_ranks",
        "run_event",
    } <= names


def test_each_override_names_the_composer_function_it_replaces_and_its_guarding_test():
    problems = []
    for cls, name in _overrides():
        where = f"{cls.__module__}.{cls.__qualname__}.{name}"
        match = REPLACES.search(inspect.getdoc(getattr(cls, name)) or "")
        if match is None:
            problems.append(f"{where}: no 'Replaces ``composer...`` (Composer 0.32.1); guarded by ``tests/...::test``'")
            continue
        replaced, path, test = match.groups()
        if replaced.rpartition(".")[2] != name:
            problems.append(f"{where}: names {replaced}, a function of another name")
        try:
            if not callable(_resolve(replaced)):
                problems.append(f"{where}: {replaced} is not a function")
        except (ImportError, AttributeError):
            problems.append(f"{where}: Composer has no {replaced}")
        if not (REPO / path).is_file() or test not in _test_names(path):
            problems.append(f"{where}: no test {path}::{test}")
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_wrong_docstring():
    doc = (
        "Replaces ``composer.trainer.trainer.Trainer._train_batch`` (Composer 0.32.1);\n"
        "    guarded by\n    ``tests/x.py::t``"
    )
    assert REPLACES.search(doc).groups() == ("composer.trainer.trainer.Trainer._train_batch", "tests/x.py", "t")
    assert REPLACES.search("Composer 0.32.1's _train_batch") is None
    assert callable(_resolve("composer.trainer.trainer.Trainer._train_batch"))
