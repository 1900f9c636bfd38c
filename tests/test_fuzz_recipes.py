"""Property-based fuzzing of recipes: mutated or malformed recipes give a named user error
(or validate), never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
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
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["-1ep", "0ba", "1e999", "nan", "~", "../../etc", "cnn_simple", "auto"]),
)
MUTATION = st.tuples(st.sampled_from(["delete", "rename", "replace"]), st.sampled_from(PATHS), ODD_VALUES, st.text(min_size=1, max_size=4))


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


def _check(path: Path) -> None:
    try:
        resolve(path)
    except UserError as exc:
        message = str(exc)
        assert message and ":" in message, message  # "key.path: what is wrong" or "file: what is wrong"
        assert "Traceback" not in message


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_recipes_fail_with_a_named_error_or_validate(tmp_path, mutations):
    recipe = VALID
    for mutation in mutations:
        recipe = _apply(recipe, mutation)
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    _check(path)


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
