"""The registries: one per kind of buildable thing, and nothing else.

This module declares registries and imports no implementation, so it can never be part
of an import cycle.  Implementations register themselves next to their code::

    from dlrecipes.registry import models

    @models.register("my_net", input_size=(3, 32, 32))
    def my_net(num_classes: int = 10, width: int = 64):
        \"\"\"One-line description shown by ``dlrecipes list models``.\"\"\"
        from my_pkg.nets import MyNet  # heavy imports go inside the factory
        return MyNet(num_classes, width)

An entry is a *factory*: a function whose keyword parameters (with type annotations and
defaults) are exactly the keys a recipe may give next to ``name:``.  Recipes are checked
against that signature before anything is built, so keep heavy imports (torch, composer,
timm) inside the factory body: ``validate`` and ``list`` then answer quickly.

Keyword metadata after the name: each registry declares the keys it reads (below, and
:data:`COMMON_METADATA`), and registering with any other key is an error naming the valid ones:

- any entry: ``validator=fn(params, key_path)``: checks beyond types, at validation;
  ``paths=("root", ...)``: parameters that are file paths, resolved against the recipe's folder.
- models: ``input_size=(C, H, W)``, ``param_count=`` (at the factory's defaults; a test compares
  it with the built model), ``pretrained="how to get weights"`` and ``example_params=`` (what
  ``list models`` shows and builds); ``multi_io=True``: takes several inputs (needs ``task:``).
- datasets: ``image_side=fn(params)`` (the side of the images a model sees, checked against its
  ``min_input_size``); ``in_memory=True`` (``trainer.loader: device`` can hold it on the device); ``pil_images=True``
  (yields PIL images: the tensor cache, RandAugment and AugMix need it); ``io=fn(params)`` (the inputs and outputs of a
  multi-output dataset, a ``DataIO``); ``classes=fn(params)`` (its class count when known without reading the data, else
  None); ``pixels=False`` (its images are random tensors, not normalised pixels: augmentations that work on pixel values
  refuse it at validation); ``made_by="command (page)"`` (what makes its files: a missing one's error names it);
  ``source_side=fn(params)`` (``(side, which image)`` of the source images when known before training, else None:
  validation warns when the crop upsamples them more than twice, :mod:`dlrecipes.data.source_sizes`);
  ``channels=fn(params)`` (the channels of an image the model sees) and ``held_samples=fn(params)`` (how many images an
  in-memory dataset holds at that size when built): with ``image_side``, what validation multiplies to refuse a batch or
  a dataset that cannot fit in this machine's memory (:func:`dlrecipes.config.checks.check_memory`).
- algorithms: ``conflicts_with={name: reason}``, ``requires=fn(config)``,
  ``image_label_batch="reason"`` (cannot work on a task's ``(inputs..., targets...)`` batch) and
  ``changes_network=True`` (it changes the network's modules, as Composer's ``Algorithm.required_on_load()``
  says: ``dlrecipes eval`` rebuilds the trained network with it before loading a checkpoint's weights;
  ``--resume`` refuses to add, remove or retune it, unless ``checkpoint_state=False``, as for
  ``channels_last``, which changes only the memory order) and ``checkpoint_state=True`` (it keeps its own
  state in the checkpoint, as EMA's averaged weights: ``--resume`` refuses to add, remove or retune it);
  ``reads_back="what and why"`` (its step reads a value back from the device, a synchronisation per step on
  a GPU: ``validate`` says so for a GPU run; tests/test_sync_census.py holds every other algorithm to none).
- losses: ``targets="class"`` or ``"regression"`` (what the loss trains; checked per task output).
- metrics: ``report=True`` (a table written at the end of the run, see :mod:`dlrecipes.metrics`);
  ``top_k=fn(params)`` (the k of a top-k metric, checked against the data's classes).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dlrecipes.errors import PluginError, RecipeError, did_you_mean

# Names of objects passed to ``dlrecipes.train(model=..., train_data=...)`` from a notebook or script (see
# :mod:`dlrecipes.notebook.objects`): registered for that process only, so a run's recipe.yaml names them and
# another process (or a fresh kernel) says to pass them again.
OBJECT_PREFIX = "object:"
# which keyword of dlrecipes.train gives each registry's objects
OBJECT_KEYWORDS = {"models": "model=", "datasets": "train_data=/eval_data="}


@dataclass(frozen=True)
class Entry:
    """One registered factory."""

    name: str
    factory: Callable[..., Any]
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def description(self) -> str:
        doc = inspect.getdoc(self.factory) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    @property
    def meanings(self) -> dict[str, str]:
        """``{parameter: one sentence}`` from the factory's ``Args:`` section or ``Doc`` annotations
        (:mod:`dlrecipes.core.param_docs`)."""
        from dlrecipes.core.param_docs import meanings

        return meanings(self.factory)

    @property
    def parameters(self) -> dict[str, inspect.Parameter]:
        """Keyword parameters a recipe may set (``*args``/``**kwargs`` excluded)."""
        params = inspect.signature(self.factory).parameters
        return {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


class Registry:
    """Name -> factory, for one group (``models``, ``datasets``, ...)."""

    def __init__(self, group: str, what: str, returns: str, expected: str = "", metadata: tuple[str, ...] = ()):
        self.group = group
        self.what = what  # e.g. "model", used in messages
        self.returns = returns  # what a factory must return, in words (build_component says so when one does not)
        self.expected = expected  # the same as a dotted type name ("torch.nn.Module"), imported when checked
        self.metadata_keys = (*COMMON_METADATA, *metadata)  # what dlrecipes reads of an entry's metadata
        self._entries: dict[str, Entry] = {}

    def register(self, name: str | None = None, **metadata: Any) -> Callable:
        """Decorator registering a factory under ``name`` (default: the function name)."""

        def decorator(factory: Callable) -> Callable:
            self.add(name or factory.__name__, factory, **metadata)
            return factory

        return decorator

    def add(self, name: str, factory: Callable, source: str | None = None, **metadata: Any) -> None:
        source = source or _source_of(factory)
        unknown = [key for key in metadata if key not in self.metadata_keys]
        if unknown:
            raise PluginError(
                f"{self.what} '{name}' from {source}: unknown registry metadata "
                f"{', '.join(repr(k) for k in unknown)}{did_you_mean(unknown[0], self.metadata_keys)}; "
                f"{self.group} read {', '.join(self.metadata_keys)}"
            )
        if name in self._entries:
            existing = self._entries[name]
            if existing.factory is factory:
                return  # the same module imported twice (e.g. as a plugin and a built-in)
            raise PluginError(
                f"two {self.group} are registered as '{name}': one from {existing.source}, "
                f"one from {source}. Rename one of them."
            )
        self._entries[name] = Entry(name, factory, source, dict(metadata))

    def put_object(self, name: str, factory: Callable, source: str) -> None:
        """Register (or replace) ``OBJECT_PREFIX + name``: an object passed in from Python, this process only."""
        self._entries[OBJECT_PREFIX + name] = Entry(OBJECT_PREFIX + name, factory, source, {})

    def add_variant(self, name: str, of: str, description: str, **defaults: Any) -> None:
        """Register ``name``: entry ``of`` with other defaults (a named variant, as timm names ``resnet50``).

        The variant's recipe keys are ``of``'s, with ``defaults`` shown and used as theirs; its
        metadata is ``of``'s.  One factory, one signature, however many named variants.
        """
        base = self.get(of)
        signature = inspect.signature(base.factory)
        unknown = [key for key in defaults if key not in signature.parameters]
        if unknown:
            raise PluginError(f"{self.what} '{name}': '{of}' has no parameter {', '.join(unknown)}")

        def variant(*args: Any, **params: Any) -> Any:
            return base.factory(*args, **{**defaults, **params})

        variant.__signature__ = signature.replace(
            parameters=[
                p.replace(default=defaults[p.name]) if p.name in defaults else p for p in signature.parameters.values()
            ]
        )
        variant.__wrapped__ = base.factory  # its annotations, read in its module (typing.get_type_hints)
        variant.__annotations__ = dict(base.factory.__annotations__)
        variant.__name__ = variant.__qualname__ = name
        variant.__module__ = base.factory.__module__
        variant.__doc__ = description
        self.add(name, variant, source=f"{base.source}, as a variant of '{of}'", **base.metadata)

    def get(self, name: str, key_path: str = "name") -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            if str(name).startswith(OBJECT_PREFIX):
                keyword = OBJECT_KEYWORDS.get(self.group, "the object")
                raise RecipeError(
                    f"{key_path}: '{name}' is a {self.what} that was passed to dlrecipes.train as a Python object, "
                    f"not a registered name: pass it again ({keyword} of dlrecipes.train, evaluate or predict) in "
                    f"this process"
                ) from None
            valid = (
                ", ".join(sorted(n for n in self._entries if not n.startswith(OBJECT_PREFIX))) or "(none registered)"
            )
            raise RecipeError(
                f"{key_path}: unknown {self.what} '{name}'{did_you_mean(str(name), self._entries)}. "
                f"Valid {self.group}: {valid}"
            ) from None

    def build(self, name: str, **params: Any) -> Any:
        """``name``'s factory called with ``params`` and its result type-checked (:func:`build_component`)."""
        return build_component(self, name, params, f"{self.group}.{name}")

    def expected_type(self) -> Any:
        """The type a factory's result must have (imported now: only building needs it), or None."""
        if not self.expected:
            return None
        import importlib

        module, _, name = self.expected.rpartition(".")
        return getattr(importlib.import_module(module), name)

    def names(self) -> list[str]:
        """The registered names (objects passed in from Python are not listed)."""
        return sorted(n for n in self._entries if not n.startswith(OBJECT_PREFIX))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries[n] for n in self.names())

    def __len__(self) -> int:
        return len(self._entries)


def build_component(reg: Registry, name: str, params: dict[str, Any], key: str, **context: Any) -> Any:
    """``reg[name](*supplied, **params)``, checked to be an instance of the registry's type: the one
    door every build goes through (``Registry.build`` included).

    Factories may take positional-only parameters that are not recipe keys (the model for an
    optimizer, the run directory for a callback, as a Path (``run_dir``) or a RunDir (``layout``), the class
    count for a metric, the run being built for a callback or logger: :mod:`dlrecipes.core.run_context`); they
    are supplied from ``context`` by name.
    """
    entry = reg.get(name, key_path=key)
    supplied = []
    for pname, param in inspect.signature(entry.factory).parameters.items():
        if param.kind is not param.POSITIONAL_ONLY:
            break
        if pname not in context:
            if param.default is not param.empty:  # optional: its default, and the rest's
                break
            raise TypeError(f"{entry.source}: positional-only parameter '{pname}' cannot be supplied")
        supplied.append(context[pname])
    built = entry.factory(*supplied, **params)
    expected = reg.expected_type()
    if expected is not None and not isinstance(built, expected):
        raise TypeError(f"{reg.what} '{name}' ({entry.source}) returned {type(built).__name__}, expected {reg.returns}")
    return built


def _source_of(factory: Callable) -> str:
    module = getattr(factory, "__module__", "?")
    try:
        return f"{module} ({inspect.getsourcefile(factory)})"
    except TypeError:
        return module


COMMON_METADATA = ("validator", "paths")

models = Registry(
    "models",
    "model",
    "a torch.nn.Module producing class logits",
    "torch.nn.Module",
    ("input_size", "param_count", "pretrained", "example_params", "multi_io"),
)
datasets = Registry(
    "datasets",
    "dataset",
    "a dlrecipes.data.DatasetSplits",
    "dlrecipes.data.splits.DatasetSplits",
    (
        "image_side",
        "in_memory",
        "pil_images",
        "io",
        "classes",
        "pixels",
        "made_by",
        "source_side",
        "channels",
        "held_samples",
        "data_check",
    ),
)
optimizers = Registry(
    "optimizers", "optimizer", "a torch.optim.Optimizer (given the param groups)", "torch.optim.Optimizer"
)
schedulers = Registry("schedulers", "scheduler", "a composer ComposerScheduler", "collections.abc.Callable")
algorithms = Registry(
    "algorithms",
    "algorithm",
    "a composer Algorithm",
    "composer.core.Algorithm",
    ("conflicts_with", "requires", "image_label_batch", "changes_network", "checkpoint_state", "reads_back"),
)
callbacks = Registry("callbacks", "callback", "a composer Callback", "composer.core.Callback")
loggers = Registry("loggers", "logger", "a composer LoggerDestination", "composer.loggers.LoggerDestination")
losses = Registry(
    "losses",
    "loss",
    "a function (predictions, targets) -> scalar loss tensor",
    "collections.abc.Callable",
    ("targets",),
)
metrics = Registry(
    "metrics", "metric", "a torchmetrics Metric (given the class count)", "torchmetrics.Metric", ("report", "top_k")
)

REGISTRIES: dict[str, Registry] = {
    r.group: r for r in (models, datasets, optimizers, schedulers, algorithms, callbacks, loggers, losses, metrics)
}
