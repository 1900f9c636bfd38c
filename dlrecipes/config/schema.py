"""A small strict type checker for recipe values.

Checks a plain value (from YAML) against a type annotation and returns it, converting
only where no information is lost (an int where a float is expected).  Errors name the
full key path, the expected type and the value.  Supported annotations: ``int``,
``float``, ``str``, ``bool``, ``Any``, ``None``, ``Optional``/``Union``, ``Literal``,
``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``, :data:`Duration` and dataclasses (whose
fields are checked recursively, unknown keys refused with a suggestion).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from dlrecipes.core.durations import Duration, parse_duration
from dlrecipes.core.ranges import range_of
from dlrecipes.errors import RecipeError, did_you_mean, shown

__all__ = ["Duration", "check", "check_dataclass", "check_params", "parse_duration", "type_name"]


def _is_duration(value: str) -> bool:
    try:
        parse_duration(value)
    except ValueError:
        return False
    return True


def type_name(tp: Any) -> str:
    """How a type reads in an error message."""
    inner, rng = range_of(tp)
    if rng is not None and inner is Duration:
        return "duration above zero such as '10ep', '200ba' or '0.5dur'"
    if rng is not None:
        return f"{type_name(inner)} {rng.describe()}"
    if inner is not tp:  # Annotated with no range (a meaning only: dlrecipes.core.param_docs.Doc)
        return type_name(inner)
    if tp is Duration:
        return "duration such as '10ep', '200ba' or '0.5dur'"
    if tp is Any:
        return "any value"
    if tp is type(None) or tp is None:
        return "null"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        inner = ", ".join(type_name(a) for a in args) if args else "any"
        return f"list of {inner}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def check(value: Any, tp: Any, path: str) -> Any:
    """Return ``value`` checked against ``tp``; raise :class:`RecipeError` naming ``path``."""
    inner, rng = range_of(tp)
    if inner is not tp:  # Annotated: the type, then its range (dlrecipes.core.ranges)
        checked = check(value, inner, path)
        number = parse_duration(checked)[0] if inner is Duration else checked
        if rng is not None and isinstance(number, (int, float)) and not rng.contains(number):
            raise _wrong(path, tp, value)
        return checked
    if tp is Any or tp is typing.Any:
        return value
    if tp is type(None) or tp is None:
        if value is None:
            return None
        raise _wrong(path, tp, value)
    if tp is Duration:
        if isinstance(value, str) and _is_duration(value):
            return value.strip()
        raise _wrong(path, tp, value)
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise _wrong(path, tp, value)
    if origin in (Union, types.UnionType):
        return _check_union(value, typing.get_args(tp), path, tp)
    for kind, checker in _CONTAINERS.items():
        if origin is kind or tp is kind:
            return checker(value, tp, path)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # already checked (e.g. a component)
            return value
        if not isinstance(value, dict):
            raise _wrong(path, tp, value)
        return check_dataclass(tp, value, path)
    return _check_scalar(value, tp, path)


def _check_list(value: Any, tp: Any, path: str) -> list:
    if not isinstance(value, list):
        raise _wrong(path, tp, value)
    (item_tp,) = typing.get_args(tp) or (Any,)
    return [check(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]


def _check_tuple(value: Any, tp: Any, path: str) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise _wrong(path, tp, value)
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(check(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if args and len(args) != len(value):
        raise RecipeError(f"{path}: expected a list of {len(args)} values, got {shown(value)}")
    return tuple(check(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args or [Any] * len(value))))


def _check_dict(value: Any, tp: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise _wrong(path, tp, value)
    args = typing.get_args(tp)
    value_tp = args[1] if args else Any
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise RecipeError(f"{path}: keys must be strings, got {shown(k)}")
        out[k] = check(v, value_tp, f"{path}.{k}")
    return out


_CONTAINERS = {list: _check_list, tuple: _check_tuple, dict: _check_dict}


def _check_scalar(value: Any, tp: Any, path: str) -> Any:
    """bool, int, float (an int is accepted and made a float), str, or any other class."""
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _wrong(path, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _wrong(path, tp, value)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _wrong(path, tp, value)
    return value  # an annotation we cannot check (e.g. a forward reference string)


def _check_union(value: Any, options: tuple, path: str, tp: Any) -> Any:
    if value is None and type(None) in options:
        return None
    # a mapping or a list fits at most one container option: report the error inside it
    containers = [o for o in options if _is_container_for(o, value)]
    if len(containers) == 1:
        return check(value, containers[0], path)
    # most specific first, so that 3 stays an int in `int | float`
    for option in sorted(options, key=lambda o: o is float):
        if option is type(None):
            continue
        try:
            return check(value, option, path)
        except RecipeError:
            continue
    raise _wrong(path, tp, value)


def _is_container_for(option: Any, value: Any) -> bool:
    origin = typing.get_origin(option) or option
    if isinstance(value, dict):
        return dataclasses.is_dataclass(option) or origin is dict
    if isinstance(value, list):
        return origin in (list, tuple)
    return False


def _wrong(path: str, tp: Any, value: Any) -> RecipeError:
    return RecipeError(f"{path}: expected {type_name(tp)}, got {shown(value)} ({type(value).__name__})")


def check_dataclass(cls: type, data: dict, path: str) -> Any:
    """Build dataclass ``cls`` from ``data``: unknown keys, missing keys and types are checked."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    for key in data:
        if key not in fields:
            raise RecipeError(
                f"{prefix}{key}: unknown key{did_you_mean(str(key), fields)}. "
                f"Valid keys{' in ' + path if path else ''}: {', '.join(fields)}"
            )
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = check(data[name], hints[name], f"{prefix}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecipeError(
                f"{prefix}{name}: missing required key ({f.metadata.get('help', type_name(hints[name]))})"
            )
    return cls(**kwargs)


def check_params(
    params: dict[str, Any], parameters: dict, hints: dict[str, Any], path: str, what: str
) -> dict[str, Any]:
    """Check recipe ``params`` against a factory's signature (``inspect.Parameter`` by name)."""
    out = {}
    for key, value in params.items():
        if key not in parameters:
            valid = ", ".join(parameters) or "(it takes none)"
            raise RecipeError(
                f"{path}.{key}: unknown parameter of {what}{did_you_mean(str(key), parameters)}. "
                f"Valid parameters: {valid}"
            )
        out[key] = check(value, hints.get(key, Any), f"{path}.{key}")
    for name, param in parameters.items():
        if name not in params and param.default is param.empty:
            raise RecipeError(
                f"{path}.{name}: missing required parameter of {what} ({type_name(hints.get(name, Any))})"
            )
    return out
