"""timm's optimizers by name, built by timm's optimizer factory, validated without importing timm.

Each optimizer timm lists (``timm.optim.list_optimizers()``) is a registry entry of the same name
(``lamb``, ``lars``, ``lion``, ``rmsproptf``, ``adabelief``, ``adopt``, ...), but for:

- the names dlrecipes already has for the same torch class: ``sgd``, ``adamw``, and timm's
  ``momentum`` / ``nesterov`` (torch SGD: dlrecipes' ``sgd`` with ``nesterov: true|false``), and ``muon``
  (dlrecipes' ``muon`` steps timm's Muon with a second optimizer: :mod:`dlrecipes.optim.muon`);
- optimizers Composer's training step cannot drive or dlrecipes does not install:
  ``adahessian`` (second order: needs ``backward(create_graph=True)``), ``kron*`` (needs
  ``opt_einsum`` and compiles its kernels with torch.compile at the first step), ``bnb*``
  (bitsandbytes) and ``fused*`` (NVIDIA apex).

``rmsprop_tf`` is also accepted for ``rmsproptf`` (timm's module and function spelling).

A recipe sets an optimizer's own constructor arguments (``lr``, ``weight_decay``, ``betas``,
``eps``, ``momentum``, ``trust_clip``, ...), as its class takes them, plus
``no_decay_norm_and_bias`` like every dlrecipes optimizer; the defaults are the class's, with
timm's settings for that name over them (``nesterov: true`` for ``sgdw``, ``decoupled_decay:
true`` for ``lambw``) and ``momentum: 0.9`` where timm's factory gives it.  Arguments that only
choose an implementation (``foreach``, ``capturable``, ``differentiable``, ``fused``,
``maximize``) or take a torch dtype are left to timm.

The signatures ship in ``timm_optimizers.json``, written from the installed timm by
``python -m dlrecipes.optim.timm_optim`` (its ``timm`` key records the version), so that
``validate`` and ``list`` never import timm (``import timm.optim`` takes seconds);
tests/test_optim.py compares it with the installed timm.  The optimizer itself is made by
``timm.optim.create_optimizer_v2`` from dlrecipes' parameter groups.

What each key means (the factory's ``Args:``, for ``list``, ``show --explain`` and validation errors) is declared
in :mod:`dlrecipes.optim.timm_meanings`: once per name, and per optimizer family where a name means something else.
"""

from __future__ import annotations

import inspect
import json
import typing
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from dlrecipes.core.ranges import NonNegative, Positive, Probability
from dlrecipes.optim.timm_meanings import args_section

if TYPE_CHECKING:
    from timm.optim import OptimInfo
    from torch import nn
    from torch.optim import Optimizer

    from dlrecipes.registry import Registry

TABLE = "timm_optimizers.json"
# dlrecipes' own entries for the same torch optimizer (timm's 'sgd' is torch SGD with nesterov on)
DUPLICATES = ("sgd", "adamw", "momentum", "nesterov", "muon")  # muon: timm's update with a second optimizer
# not drivable by Composer's step, or needing a library dlrecipes does not install
EXCLUDED_PREFIXES = ("adahessian", "kron", "bnb", "fused")
ALIASES = {"rmsprop_tf": "rmsproptf"}
# constructor arguments that choose an implementation, not the update a recipe describes
IMPLEMENTATION = ("params", "foreach", "capturable", "differentiable", "fused", "maximize", "verbose")
# the types a table may name (evaluated in this namespace only)
TYPES: dict[str, Any] = {
    "Positive": Positive,
    "NonNegative": NonNegative,
    "Probability": Probability,
    "Optional": Optional,
    "Any": Any,
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "tuple": tuple,
}
# arguments whose range is known by name, whatever the class annotates
BY_NAME = {
    "lr": "Positive",
    "weight_decay": "NonNegative",
    "eps": "Positive",
    "momentum": "Probability",
    "dampening": "Probability",
    "alpha": "Probability",
}


@cache
def shipped() -> dict[str, Any]:
    """The table:
    ``{"timm": version, "optimizers": {name: {"description", "parameters": [[name, type(, default)]]}}}``."""
    return json.loads(Path(__file__).with_name(TABLE).read_text())  # not importlib.resources: tens of ms to import


def register_all(registry: Registry) -> None:
    """Register every optimizer of the table (and the aliases) in ``registry``."""
    optimizers = shipped()["optimizers"]
    source = f"{__name__} ({TABLE}, timm {shipped()['timm']})"
    for name, spec in optimizers.items():
        registry.add(name, TimmOptimizer(name, spec), source=source)
    for alias, name in ALIASES.items():
        if name in optimizers:
            registry.add(alias, TimmOptimizer(name, optimizers[name], alias=alias), source=source)


@cache
def _type(text: str) -> Any:
    """A type of the table (``"tuple[Probability, Probability]"``), made of :data:`TYPES` alone."""
    return eval(text, {"__builtins__": {}}, TYPES)  # noqa: S307 (the shipped table's names, nothing else)


class TimmOptimizer:
    """The registry's factory for one of timm's optimizers: ``(model, /, **recipe keys)``, its signature the
    optimizer's, from the table.  The signature is made when first asked for (validating a recipe asks for one
    entry's; making all of them at import would cost every command tens of milliseconds)."""

    def __init__(self, timm_name: str, spec: dict[str, Any], alias: str | None = None):
        self.timm_name = timm_name
        self.spec = spec
        self.__name__ = self.__qualname__ = alias or timm_name
        self.__module__ = __name__
        same = f" (timm's '{timm_name}')" if alias else ""
        keys = [name for name, *_ in spec["parameters"]] + ["no_decay_norm_and_bias"]
        self.__doc__ = f"timm: {spec['description']}{same}.\n\n{args_section(timm_name, keys)}".strip()

    @cached_property
    def __signature__(self) -> inspect.Signature:
        parameters = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_ONLY)]
        for name, annotation in self.__annotations__.items():
            default = self._defaults.get(name, inspect.Parameter.empty)
            parameters.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            )
        return inspect.Signature(parameters)

    @cached_property
    def __annotations__(self) -> dict[str, Any]:  # what typing.get_type_hints reads
        annotations = {name: _type(type_text) for name, type_text, *_ in self.spec["parameters"]}
        return {**annotations, "no_decay_norm_and_bias": bool}

    @cached_property
    def _defaults(self) -> dict[str, Any]:
        defaults = {
            name: tuple(default[0]) if isinstance(default[0], list) else default[0]
            for name, _, *default in self.spec["parameters"]
            if default
        }
        return {**defaults, "no_decay_norm_and_bias": False}

    def __call__(self, model: nn.Module, /, **params: Any) -> Optimizer:
        bound = self.__signature__.bind(model, **params)
        bound.apply_defaults()
        arguments = {k: tuple(v) if isinstance(v, list) else v for k, v in bound.arguments.items()}  # betas
        return build(self.timm_name, model, arguments)

    def __repr__(self) -> str:
        return f"<timm optimizer {self.__name__}>"


def build(timm_name: str, model: nn.Module, arguments: dict[str, Any]) -> Optimizer:
    """``timm.optim.create_optimizer_v2`` over dlrecipes' parameter groups (norms and biases apart or not)."""
    from timm.optim import create_optimizer_v2, list_optimizers

    from dlrecipes.optim.groups import parameter_groups

    arguments.pop("model")
    no_decay = arguments.pop("no_decay_norm_and_bias")
    if timm_name not in list_optimizers():
        import timm

        raise RuntimeError(
            f"optimizer '{timm_name}': the installed timm {timm.__version__} has no such optimizer "
            f"(dlrecipes' table is from timm {shipped()['timm']})"
        )
    groups = parameter_groups(model, arguments.get("weight_decay", 0.0), no_decay)
    return create_optimizer_v2(groups, opt=timm_name, **arguments)


# --- writing the table from the installed timm ------------------------------------------------------------------


def installed() -> dict[str, Any]:
    """The table as the installed timm gives it (imports timm)."""
    import timm
    from timm.optim import get_optimizer_info, list_optimizers

    optimizers = {}
    for name in list_optimizers():
        if name in DUPLICATES or name.startswith(EXCLUDED_PREFIXES):
            continue
        info = get_optimizer_info(name)
        optimizers[name] = {"description": info.description, "parameters": _parameters(info)}
    return {"timm": timm.__version__, "optimizers": optimizers}


def _parameters(info: OptimInfo) -> list[list[Any]]:
    """``[name, type, default]`` (no default: required) for each constructor argument a recipe may set."""
    cls = info.opt_class
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation timm's module cannot resolve: types from the defaults
        hints = {}
    defaults = dict(info.defaults or {})
    if info.has_momentum:
        defaults.setdefault("momentum", 0.9)  # as create_optimizer_v2 does
    out = []
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        name = param.name
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name in IMPLEMENTATION:
            continue
        if (name == "eps" and not info.has_eps) or (name == "betas" and not info.has_betas):
            continue  # create_optimizer_v2 drops them for this name
        default = defaults.get(name, param.default)
        if type(default).__name__ == "_RequiredParameter":  # torch.optim.optimizer.required
            default = param.empty
        type_text = _type_text(name, hints.get(name), default)
        if type_text is None:
            continue  # a dtype or a callable: timm's default
        if isinstance(default, int) and not isinstance(default, bool) and "int" not in type_text:
            default = float(default)  # weight_decay=0 in a class's signature is the float 0.0 it means
        if default is param.empty:
            out.append([name, type_text])
        else:
            out.append([name, type_text, list(default) if isinstance(default, tuple) else default])
    return out


def _type_text(name: str, hint: Any, default: Any) -> str | None:
    """The type of one argument, as a name of :data:`TYPES`; None when a recipe cannot give it."""
    import torch

    options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else ((hint,) if hint else ())
    optional = default is None or type(None) in options
    options = tuple(o for o in options if o is not type(None) and o is not torch.Tensor)
    if any(o is torch.dtype for o in options):
        return None
    if name == "betas" or name.startswith("betas_") or (isinstance(default, tuple) and name.startswith("beta")):
        count = len(default) if isinstance(default, tuple) else 2
        text = f"tuple[{', '.join(['Probability'] * count)}]"
    elif name in BY_NAME:
        text = BY_NAME[name]
    else:
        simple = [o for o in options if o in (bool, int, float, str)]
        if simple:
            text = simple[0].__name__
        elif options and not isinstance(default, (bool, int, float, str)):
            return None  # only a callable, a tensor or a nested structure: left to timm
        elif isinstance(default, (bool, int, float, str)):
            text = type(default).__name__
        else:
            text = "Any"
    return f"Optional[{text}]" if optional else text


def write_table() -> None:
    """Rewrite the shipped table from the installed timm."""
    table = installed()
    path = Path(__file__).with_name(TABLE)
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{path}: {len(table['optimizers'])} optimizers from timm {table['timm']}")


if __name__ == "__main__":
    write_table()
