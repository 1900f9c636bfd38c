"""Every override of a private method of Composer's Trainer or Engine in dlrecipes/engine/ names, in its docstring,
the Composer 0.32.1 function it replaces and the dlrecipes test that guards it (a file and a test in it that exist):
a new Composer release is checked method by method, each against its test. The private attributes of Composer's
objects that dlrecipes reaches beside them are listed in dlrecipes.engine.COMPOSER_PRIVATE, and each must exist."""

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


# --- Composer's private attributes, beside the overrides ------------------------------------------------------------

REACHED_FROM = ("engine", "callbacks", "records", "fit", "builders", "loggers", "after_training")


def _composer_classes() -> dict:
    from composer.callbacks import CheckpointSaver
    from composer.core import DataSpec, Evaluator, State, Time, Timestamp

    return {
        "Trainer": ComposerTrainer,
        "Engine": Engine,
        "State": State,
        "Time": Time,
        "Timestamp": Timestamp,
        "DataSpec": DataSpec,
        "Evaluator": Evaluator,
        "CheckpointSaver": CheckpointSaver,
    }


def _has(cls: type, attribute: str) -> bool:
    """Whether Composer's ``cls`` has ``attribute``: on the class, or set on its instances (``self._x`` in its
    source)."""
    return hasattr(cls, attribute) or re.search(rf"self\.{attribute}\b", inspect.getsource(cls)) is not None


def test_every_private_composer_attribute_dlrecipes_reaches_is_listed_and_exists():
    """dlrecipes.engine.COMPOSER_PRIVATE lists each private attribute of Composer's objects that dlrecipes reads or
    sets outside its overrides: each must exist in the installed Composer (a new release that renames one fails
    here, not in a training), and an AST walk of the packages that touch Composer's objects finds none unlisted."""
    from dlrecipes.engine import COMPOSER_PRIVATE

    classes = _composer_classes()
    missing = [name for name in COMPOSER_PRIVATE if not _has(classes[name.split(".")[0]], name.split(".")[1])]
    assert not missing, f"the installed Composer lacks: {missing}"
    private: dict[str, list[str]] = {}  # each private name of those classes, with the classes that have it
    for short, cls in classes.items():
        names = set(re.findall(r"self\.(_[a-z]\w*)\b", inspect.getsource(cls))) | set(vars(cls))
        for name in names:
            if name.startswith("_") and not name.startswith("__"):
                private.setdefault(name, []).append(short)
    allowed = {name.split(".")[1] for name in COMPOSER_PRIVATE} | {name for _, name in _overrides()}
    unlisted = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in REACHED_FROM
        for path in sorted((REPO / "dlrecipes" / folder).rglob("*.py"))
        for line in _reached(path.read_text(), private, allowed)
    ]
    assert not unlisted, "reached but not in COMPOSER_PRIVATE:\n" + "\n".join(unlisted)


def _reached(source: str, private: dict, allowed: set) -> list[str]:
    """``line name (classes)`` for each attribute of ``source`` that is one of ``private``'s names and not
    ``allowed``."""
    return [
        f"{node.lineno} {node.attr} ({'/'.join(private[node.attr])})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in private and node.attr not in allowed
    ]


def test_the_reach_check_sees_an_unlisted_attribute():
    assert _has(ComposerTrainer, "_train_data_spec") and not _has(ComposerTrainer, "_no_such_attribute")
    private = {"_rng_state": ["Trainer"], "_train_data_spec": ["Trainer"]}
    source = "state._rng_state = None\nx = self._train_data_spec.dataloader\nself._own = 1\n"
    assert _reached(source, private, {"_train_data_spec"}) == ["1 _rng_state (Trainer)"]
