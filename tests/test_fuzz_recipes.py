"""Property-based fuzzing of recipes: mutated or malformed recipes give a named user error
(or validate), never a traceback."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dlrecipes.api import resolve
from dlrecipes.errors import UserError

from .conftest import TINY_RECIPE

VALID = yaml.safe_load(TINY_RECIPE.replace("\n    ", "\n"))
VALID["algorithms"] = {"label_smoothing": {"smoothing": 0.1}, "ema": {"half_life": "10ba"}}
VALID["scheduler"] = {"name": "cosine", "warmup": "1ep"}


def _paths(node, prefix=()):
    for key, value in node.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _paths(value, prefix + (key,))


PATHS = list(_paths(VALID))
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["-1ep", "0ba", "1e999", "nan", "~", "../../etc", "cnn_simple", "auto"]),
)
MUTATION = st.tuples(
    st.sampled_from(["delete", "rename", "replace"]),
    st.sampled_from(PATHS),
    ODD_VALUES,
    st.text(min_size=1, max_size=4),
)


def _apply(recipe: dict, mutation) -> dict:
    kind, path, value, suffix = mutation
    recipe = copy.deepcopy(recipe)
    node = recipe
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            return recipe
        node = node[key]
    last = path[-1]
    if last not in node:
        return recipe
    if kind == "delete":
        del node[last]
    elif kind == "rename":
        node[f"{last}{suffix}"] = node.pop(last)
    else:
        node[last] = value
    return recipe


MISSING = object()


def _leaves(node, prefix=()):
    """(path, value) of every value that is not a mapping (an empty mapping has none)."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _at(node, path):
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return MISSING
        node = node[key]
    return node


def _numbers(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _numbers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _numbers(value)
    elif isinstance(node, float):
        yield node


def _holds(resolved: dict, path: tuple, value) -> bool:
    """Whether the resolved recipe holds ``value`` at ``path``, as the recipe gave it."""
    got = _at(resolved, path)
    if path[0] == "algorithms" and len(path) <= 2 and (value is None or value is False):
        return got in (MISSING, {})  # null/false: switched off (the whole section: none)
    if path[0] == "algorithms" and len(path) == 2 and value is True:
        return got == {}  # true: on, with its defaults
    if isinstance(value, int) and not isinstance(value, bool) and type(got) is float:
        return got == value  # an int where a float is expected
    if isinstance(value, str) and type(got) is float:
        return got == float(value)  # a number YAML 1.1 reads as a string, such as 1e-3
    if len(path) == 1 and isinstance(value, str) and isinstance(got, dict):
        return got.get("name") == value.strip()  # `model: cnn_simple` is short for {name: cnn_simple}
    if isinstance(value, str) and isinstance(got, str):
        return got == value.strip()  # durations are stripped
    return type(got) is type(value) and got == value


def _check(path: Path, recipe: dict | None = None) -> None:
    try:
        config = resolve(path)
    except UserError as exc:
        message = str(exc)
        assert message and ":" in message, message  # "key.path: what is wrong" or "file: what is wrong"
        assert "Traceback" not in message
        return
    # Accepted: it must be a recipe that means what it says, not garbage let through.
    resolved = config.to_dict()
    assert all(math.isfinite(x) for x in _numbers(resolved)), resolved  # no NaN or infinite lr, smoothing...
    for key, value in _leaves(recipe or {}):
        assert _holds(resolved, key, value), (key, value, _at(resolved, key))
    again = path.with_name(f"resolved-{path.name}")  # what a run saves, and --resume reads back
    again.write_text(yaml.safe_dump(resolved, allow_unicode=True))
    assert resolve(again).to_dict() == resolved


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(MUTATION, min_size=1, max_size=3))
# Always, whatever hypothesis draws: recipes that are accepted (each value kept as given) and garbage that is not.
@example(
    [
        ("replace", ("trainer", "device"), "auto", ""),
        ("replace", ("model", "hidden"), 363, ""),
        ("replace", ("algorithms", "ema"), True, ""),
        ("replace", ("checkpoint", "monitor"), None, ""),
    ]
)
@example([("replace", ("model",), "cnn_simple", "")])  # a section given by its name alone (found by hypothesis)
@example([("rename", ("trainer", "num_workers"), None, "X")])  # unknown keys are refused, not dropped
@example([("rename", ("model", "width"), None, "X")])
@example([("replace", ("optimizer", "lr"), float("nan"), "")])
@example([("replace", ("optimizer", "lr"), "1e999", "")])
@example([("replace", ("algorithms", "label_smoothing", "smoothing"), float("inf"), "")])
def test_mutated_recipes_fail_with_a_named_error_or_validate(tmp_path, mutations):
    recipe = VALID
    for mutation in mutations:
        recipe = _apply(recipe, mutation)
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    _check(path, recipe)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_never_crash_the_loader(tmp_path, data):
    path = tmp_path / "bytes.yaml"
    path.write_bytes(data)
    _check(path)


ODD_YAML = {
    "tabs": "model:\n\tname: cnn_simple\n",
    "anchor_loop": "a: &x [*x]\n",
    "alias_bomb": "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n",
    "duplicate": "model: {name: cnn_simple}\nmodel: {name: mnist_cnn}\n",
    "not_a_mapping": "- model\n- dataset\n",
    "python_tag": "model: !!python/name:os.system\n",
    "huge_int": "trainer: {batch_size: 99999999999999999999999999999}\n",
    "binary_tag": "model: !!binary aGVsbG8=\n",
    "bad_utf8": b"model: {name: \xff\xfe}\n",
}


def test_odd_yaml_is_a_named_error(tmp_path):
    for name, text in ODD_YAML.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        try:
            resolve(path)
        except UserError as exc:
            assert str(path) in str(exc) or ":" in str(exc), (name, str(exc))
        else:
            raise AssertionError(f"{name} validated")


def test_a_10_mb_recipe_is_handled(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(TINY_RECIPE.replace("\n    ", "\n") + "".join(f"\nextra_{i}: {'x' * 100}" for i in range(100_000)))
    assert path.stat().st_size > 10 * 2**20
    try:
        resolve(path)
    except UserError as exc:
        assert "extra_0: unknown key" in str(exc)
