"""The recipe schema: what a resolved recipe may contain, with types, defaults and help.

:func:`validate` turns a loaded recipe (a nested dict) into a :class:`RecipeConfig`,
checking unknown keys, types, required keys, registry names and the parameters of every
named component against its factory's signature.  It builds nothing and imports no torch,
except to ask whether a GPU exists when the recipe wants one.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from dlrecipes import registry
from dlrecipes.errors import RecipeError, did_you_mean
from dlrecipes.metrics import DEFAULT_METRICS, DEFAULT_TRAIN_METRICS, EVAL_LOSS
from dlrecipes.recipe import LoadedRecipe
from dlrecipes.config import devices
from dlrecipes.config.schema import Duration, check, check_dataclass, check_params
from dlrecipes.config.multi_io import check_task, declared_io, metric_names


def _help(text: str, **kw: Any) -> Any:
    return field(metadata={"help": text}, **kw)


@dataclass
class Component:
    """A registry entry by name, with the parameters for its factory."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.params}


@dataclass
class TrainerConfig:
    max_duration: Duration = _help("how long to train: '10ep', '500ba', ...", default="1ep")
    eval_interval: Duration = _help("how often to evaluate", default="1ep")
    precision: Literal["fp32", "amp_fp16", "amp_bf16"] = _help("numeric precision; AMP needs a GPU", default="fp32")
    device: Literal["auto", "cpu", "gpu"] = _help("auto = gpu if one is available, else cpu", default="auto")
    seed: int = _help("random seed for weights, data order and augmentation", default=17)
    deterministic: bool = _help("use deterministic algorithms only (slower, reproducible)", default=False)
    batch_size: int = _help("global training batch size, split evenly over all devices", default=128)
    batch_size_per_device: Optional[int] = _help(
        "instead of batch_size: the batch each device trains on; the global batch (and the lr that "
        "optimizer.scale_lr derives from it) then grows with the number of devices",
        default=None,
    )
    eval_batch_size: Optional[int] = _help("global evaluation batch size (default: batch_size)", default=None)
    device_train_microbatch_size: Union[int, Literal["auto"], None] = _help(
        "per-device microbatch for gradient accumulation; 'auto' (GPU only) finds the largest that fits",
        default=None,
    )
    num_workers: int = _help("dataloader worker processes per device", default=2)
    loader: Literal["torch", "device", "tensor_cache"] = _help(
        "torch: a DataLoader with per-sample transforms; device: keep an in-memory dataset on the "
        "training device and crop/flip/normalise whole batches there (digits, MNIST, CIFAR, synthetic); "
        "tensor_cache: decode an image folder once to a uint8 memory map, then augment whole batches",
        default="torch",
    )
    cache_dir: Optional[str] = _help("tensor_cache: where to write the cache (default: .dlrecipes-cache next to the data)", default=None)
    cache_size: Optional[int] = _help("tensor_cache: side of the cached square images (default: dataset resize_size)", default=None)
    progress_bar: bool = _help(
        "on a terminal, a live progress line per phase (a summary row per epoch is printed either way)", default=True
    )
    console_log_interval: Duration = _help("with `train --verbose`: how often Composer prints every metric", default="1ep")
    log_interval: int = _help(
        "every how many batches the terminal and the run log read the training loss back from the device "
        "(and at each epoch's last batch); every batch's loss reaches the loggers, and the steps in between "
        "never wait for the device",
        default=50,
    )
    train_metrics_interval: int = _help(
        "every how many batches the step's own outputs update the train metrics, which cover the epoch and are "
        "reported at its end (1 = every batch; 0 = no train metrics)",
        default=10,
    )
    dist_timeout: float = _help(
        "seconds that processes wait for each other (process group setup and every collective) before "
        "the run stops with an error",
        default=300.0,
    )
    fsdp: Optional[dict[str, Any]] = _help(
        "shard the model with FSDP through Composer's parallelism_config (GPU only), e.g. "
        "{sharding_strategy: FULL_SHARD, mixed_precision: DEFAULT}",
        default=None,
    )
    compile: Union[bool, dict[str, Any]] = _help(
        "torch.compile the model through Composer's compile_config: true, or options such as {mode: max-autotune}",
        default=False,
    )
    eval_subset_num_batches: int = _help("evaluate on this many batches only (-1 = all)", default=-1)
    train_subset_num_batches: int = _help("train on this many batches per epoch only (-1 = all)", default=-1)


@dataclass
class CheckpointConfig:
    save: bool = _help("write checkpoints under the run directory", default=True)
    save_interval: Duration = _help("how often to save", default="1ep")
    keep: int = _help("how many periodic checkpoints to keep (-1 = all)", default=2)
    monitor: Optional[str] = _help(
        "eval metric to track for best.pt, e.g. 'top1' or 'macro_f1' (one the run computes; null = no best checkpoint)", default=None
    )
    mode: Literal["max", "min"] = _help("whether a larger or smaller monitored metric is better", default="max")
    best_only: bool = _help("keep only best.pt (needs monitor); periodic checkpoints are not written", default=False)
    load_path: Optional[str] = _help("checkpoint to load weights from before training (fine-tuning)", default=None)
    load_strict: bool = _help("require every weight in load_path to match the model", default=True)
    load_weights_only: bool = _help("load only the weights from load_path, not the optimizer or time", default=True)
    load_ignore_keys: list[str] = _help("glob patterns of state keys not to load, e.g. 'state/model/*fc*'", default_factory=list)


@dataclass
class OutputConfig:
    loss: Union[str, dict[str, Any]] = _help(
        "this output's loss, a name or {name: ..., <params>}: cross_entropy, binary_cross_entropy, focal "
        "(class labels), mse, l1 (regression values), or a plugin's (dlrecipes list losses)",
        default="cross_entropy",
    )
    weight: float = _help("weight of this output's loss in the total (0 or more)", default=1.0)
    num_classes: Optional[int] = _help("class count, checked against the dataset's", default=None)


@dataclass
class TaskConfig:
    """Several inputs and outputs: the batch is (inputs..., targets...) as the dataset declares them."""

    inputs: list[str] = _help("the model's inputs, in the order its forward takes them (the dataset's input names)")
    outputs: dict[str, OutputConfig] = _help("one entry per output: {name: {loss, weight, num_classes}}")


@dataclass
class FinetuneConfig:
    """Fine-tuning a pretrained network: a frozen backbone at first, a head learning rate, layer-wise decay."""

    freeze_backbone: Duration = _help("train only the head for this long, then everything ('0ep': never frozen)", default="0ep")
    head_lr: Optional[float] = _help("the head's learning rate (default: optimizer.lr, like the backbone)", default=None)
    head: list[str] = _help("module names (globs) forming the head (default: the classifier, found from the model)",
                            default_factory=list)
    layer_decay: Optional[float] = _help("layer-wise lr decay in (0, 1]: block d of D gets lr * decay ** (D-1-d)",
                                         default=None)


@dataclass
class RecipeConfig:
    """A validated recipe."""

    model: Component = _help("the network: {name: <model>, ...params}")
    dataset: Component = _help("the data: {name: <dataset>, ...params}")
    name: Optional[str] = _help("recipe name, used in run names (default: the file name)", default=None)
    description: str = _help("one line about what this recipe is for", default="")
    run_name: Optional[str] = _help("run directory name (default: <name>-<timestamp>)", default=None)
    runs_dir: str = _help("where run directories are written", default="runs")
    imports: list[str] = _help("plugin modules or .py files to import before building", default_factory=list)
    loss: Union[str, dict[str, Any]] = _help(
        "training loss, a name or {name: ..., <params>}: cross_entropy, binary_cross_entropy (MosaicML's ResNet "
        "recipes), focal, each with label_smoothing; or a plugin's (dlrecipes list losses)",
        default="cross_entropy",
    )
    metrics: dict[str, dict[str, Any]] = _help(
        "evaluation metrics, a list of names or {name: {params}} (dlrecipes list metrics); the evaluation loss "
        "is always computed; confusion_matrix and per_class_accuracy are written at the end of the run",
        default_factory=lambda: {name: {} for name in DEFAULT_METRICS},
    )
    train_metrics: dict[str, dict[str, Any]] = _help(
        "training metrics, as metrics:, from every trainer.train_metrics_interval-th step's own outputs",
        default_factory=lambda: {name: {} for name in DEFAULT_TRAIN_METRICS},
    )
    task: Optional[TaskConfig] = _help(
        "several inputs and outputs: {inputs: [names], outputs: {name: {loss, weight}}} (null: one image, one label)",
        default=None,
    )
    trainer: TrainerConfig = _help("training loop settings", default_factory=TrainerConfig)
    optimizer: Component = _help(
        "optimizer: {name: <optimizer>, lr: ..., ...}",
        default_factory=lambda: Component("sgd"),
    )
    scheduler: Component = _help(
        "learning-rate schedule: {name: <scheduler>, warmup: ..., ...}",
        default_factory=lambda: Component("constant"),
    )
    checkpoint: CheckpointConfig = _help("saving and loading checkpoints", default_factory=CheckpointConfig)
    finetune: Optional[FinetuneConfig] = _help(
        "fine-tuning: {freeze_backbone: 2ep, head_lr: ..., head: [names], layer_decay: ...} (null: train all alike)",
        default=None,
    )
    algorithms: dict[str, dict[str, Any]] = _help("composer algorithms by name: {name: {params}}", default_factory=dict)
    callbacks: dict[str, dict[str, Any]] = _help("callbacks by name: {name: {params}}", default_factory=dict)
    loggers: dict[str, dict[str, Any]] = _help("loggers by name: {name: {params}}", default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what ``show`` prints and runs save)."""
        out: dict[str, Any] = {}
        for name in TOP_LEVEL_ORDER:
            value = getattr(self, name)
            if name in ("task", "finetune") and value is None:
                continue  # recipes without a task resolve exactly as before tasks existed
            if name in ("loss", "metrics", "train_metrics") and self.task is not None:
                continue  # each output of the task names its own loss; its metrics follow from its kind
            if isinstance(value, Component):
                value = value.to_dict()
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            out[name] = value
        return out


# How sections are listed in resolved recipes: what the run is, then what it builds.
TOP_LEVEL_ORDER = (
    "name", "description", "run_name", "runs_dir", "imports", "model", "dataset", "loss", "metrics", "train_metrics",
    "task", "trainer",
    "optimizer", "scheduler", "checkpoint", "finetune", "algorithms", "callbacks", "loggers",
)


# Sections holding one named component, and the registry that names it.
COMPONENT_SECTIONS = {
    "model": registry.models,
    "dataset": registry.datasets,
    "optimizer": registry.optimizers,
    "scheduler": registry.schedulers,
}
# Sections holding any number of components as {name: params}.
COMPONENT_MAPS = {
    "algorithms": registry.algorithms,
    "callbacks": registry.callbacks,
    "loggers": registry.loggers,
}

_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def validate(recipe: LoadedRecipe, check_device: bool = True) -> RecipeConfig:
    """Check a loaded recipe against the schema and the registries (builds nothing).

    ``check_device=False`` skips asking whether this machine can run the recipe's device
    and precision (for checking a GPU recipe on a laptop).
    """
    data = dict(recipe.data)
    components: dict[str, Component] = {}
    for section, reg in COMPONENT_SECTIONS.items():
        if section in data:
            components[section] = check_component(data.pop(section), section, reg)
    maps = {}
    for section, reg in COMPONENT_MAPS.items():
        if section in data:
            maps[section] = _check_component_map(data.pop(section), section, reg)
    for section in ("metrics", "train_metrics"):
        if section in data:
            maps[section] = _check_metrics(data.pop(section), section)
    if "loss" in data:
        data["loss"] = check_loss(data["loss"], "loss")
    # the remaining keys, and whether required sections are there, are checked by the dataclass
    config = check_dataclass(RecipeConfig, {**data, **components, **maps}, "")
    for section in ("optimizer", "scheduler"):
        if section not in components:  # defaults still go through the registry check
            setattr(config, section, check_component(getattr(config, section).to_dict(), section, COMPONENT_SECTIONS[section]))
    if config.name is None:
        config.name = recipe.name
    resolve_paths(config, recipe)
    _resolve_batch_size(config, given=data.get("trainer") or {})
    if config.task is not None:
        for name, out in config.task.outputs.items():
            out.loss = check_loss(out.loss, f"task.outputs.{name}.loss")
        if "metrics" in maps or "train_metrics" in maps:
            raise RecipeError("metrics: with task:, each output's metrics follow from its kind (top1/top5 or "
                              "mse/mae); remove metrics and train_metrics")
    check_task(config, loss_given="loss" in data)
    _check_cross_fields(config)
    if check_device:
        devices.check_device(config)
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
    if per_device < 1:
        raise RecipeError(f"trainer.batch_size_per_device: must be at least 1, got {per_device}")
    config.trainer.batch_size = per_device * devices.world_size()


def _anchor(recipe: LoadedRecipe, key_path: str) -> Path:
    """The folder a relative path at ``key_path`` is relative to: its recipe file's, or the working directory."""
    source = recipe.sources.get(key_path, "")
    if not source or source.startswith("override ") or source == "?":
        return Path.cwd()
    return Path(source).resolve().parent


def _resolved(value: Any, anchor: Path) -> Any:
    if isinstance(value, list):
        return [_resolved(v, anchor) for v in value]
    if not isinstance(value, str) or not value or "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (anchor / path).resolve())


def resolve_paths(config: RecipeConfig, recipe: LoadedRecipe) -> None:
    """Input paths in a recipe file are relative to that file (``base:`` files: to theirs).

    Paths given as command-line overrides are relative to the working directory, and so
    are output locations (``runs_dir``, ``trainer.cache_dir``).  Which parameters are
    paths: ``checkpoint.load_path`` and each factory's ``paths=`` registry metadata.
    """
    if config.checkpoint.load_path:
        config.checkpoint.load_path = _resolved(config.checkpoint.load_path, _anchor(recipe, "checkpoint.load_path"))
    for section, reg in COMPONENT_SECTIONS.items():
        component = getattr(config, section, None)
        if isinstance(component, Component):
            for key in reg.get(component.name).metadata.get("paths", ()):
                if key in component.params:
                    component.params[key] = _resolved(component.params[key], _anchor(recipe, f"{section}.{key}"))
    for section, reg in COMPONENT_MAPS.items():
        for name, params in (getattr(config, section, None) or {}).items():
            for key in reg.get(name).metadata.get("paths", ()):
                if key in params:
                    params[key] = _resolved(params[key], _anchor(recipe, f"{section}.{name}.{key}"))


# Optimizer keys the builder handles itself (they are not the optimizer factory's parameters).
LR_SCALING_KEYS = {
    "scale_lr": Literal["none", "linear", "sqrt"],
    "reference_batch_size": Optional[int],
}


def check_component(value: Any, section: str, reg: registry.Registry) -> Component:
    if isinstance(value, str):  # `optimizer: adamw` is short for {name: adamw}
        value = {"name": value}
    if not isinstance(value, dict):
        raise RecipeError(f"{section}: expected a mapping with 'name:' (one of {', '.join(reg.names())}), got {value!r}")
    if "name" not in value:
        raise RecipeError(f"{section}.name: missing required key (one of {', '.join(reg.names())})")
    name = value["name"]
    if not isinstance(name, str):
        raise RecipeError(f"{section}.name: expected a {reg.what} name, got {name!r}")
    entry = reg.get(name, key_path=f"{section}.name")
    params = {k: v for k, v in value.items() if k != "name"}
    own = {}
    if section == "optimizer":
        own = {k: check(params.pop(k), tp, f"optimizer.{k}") for k, tp in LR_SCALING_KEYS.items() if k in params}
        if own.get("scale_lr", "none") != "none" and not own.get("reference_batch_size"):
            raise RecipeError("optimizer.reference_batch_size: required with optimizer.scale_lr (the batch size lr was tuned for)")
    checked = check_params(params, entry.parameters, _hints(entry.factory), section, f"{reg.what} '{name}'")
    _run_validator(entry, checked, section)
    return Component(name, {**checked, **own})


def _check_component_map(value: Any, section: str, reg: registry.Registry) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{section}: expected a mapping of {reg.what} names to parameters, got {value!r}")
    out = {}
    for name, params in value.items():
        if params is None or params is False:  # `ema: null` in a child recipe switches it off
            continue
        if params is True:
            params = {}
        if not isinstance(params, dict):
            raise RecipeError(
                f"{section}.{name}: expected a mapping of parameters, true (defaults) or null (off), got {params!r}"
            )
        entry = reg.get(name, key_path=f"{section}.{name}")
        out[name] = check_params(params, entry.parameters, _hints(entry.factory), f"{section}.{name}", f"{reg.what} '{name}'")
        _run_validator(entry, out[name], f"{section}.{name}")
    return out


def check_loss(value: Any, path: str) -> Union[str, dict[str, Any]]:
    """A loss: a registered name, or ``{name: ..., <params>}`` checked against its factory.

    Written back one way (so that a resumed run compares equal): the bare name when every
    parameter is the factory's default, else the name with the parameters that differ.
    """
    if isinstance(value, str):
        registry.losses.get(value, key_path=path)  # a misspelled name is the key's error, not `name`'s
        value = {"name": value}
    if not isinstance(value, dict):
        raise RecipeError(f"{path}: expected a loss name or {{name: ..., <params>}}, got {value!r}")
    component = check_component(value, path, registry.losses)
    defaults = _with_defaults(registry.losses.get(component.name), {})
    changed = {k: v for k, v in component.params.items() if defaults.get(k, object()) != v}
    return {"name": component.name, **changed} if changed else component.name


def _check_metrics(value: Any, section: str) -> dict[str, dict[str, Any]]:
    """``metrics``/``train_metrics``: a list of names or a mapping of names to parameters."""
    if isinstance(value, list):
        if not all(isinstance(name, str) for name in value):
            raise RecipeError(f"{section}: expected a list of metric names, got {value!r}")
        value = {name: {} for name in value}
    metrics = _check_component_map(value, section, registry.metrics)
    if section == "train_metrics":
        for name in metrics:
            if registry.metrics.get(name).metadata.get("report"):
                raise RecipeError(f"train_metrics.{name}: a table written for the best evaluation; list it "
                                  "under metrics: instead")
    return metrics


def _run_validator(entry: registry.Entry, params: dict[str, Any], path: str) -> None:
    """An entry may register ``validator=fn(params, key_path)`` for checks beyond types."""
    validator = entry.metadata.get("validator")
    if validator is not None:
        validator(params, path)


def _hints(factory: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(factory)
    except Exception:  # an annotation we cannot resolve: check only names, not types
        return {}


# What Composer's FSDPConfig accepts (kept here so validation imports neither Composer nor torch;
# tests/test_validation.py checks it against the installed Composer).
FSDP_KEYS = (
    "activation_checkpointing", "activation_checkpointing_reentrant", "activation_cpu_offload", "auto_wrap",
    "backward_prefetch", "backward_prefetch_limit", "cpu_offload", "data_parallel_replicate_degree",
    "data_parallel_shard_degree", "forward_prefetch", "forward_prefetch_limit", "ignored_modules",
    "keep_low_precision_grads", "limit_all_gathers", "load_monolith_rank0_only", "load_planner", "mixed_precision",
    "process_group", "save_planner", "sharded_ckpt_prefix_dir", "sharding_strategy", "state_dict_type",
    "sync_module_states", "te_checkpoint_wrapper", "te_shard_fp8_weight", "use_orig_params", "verbose",
)


def compile_keys() -> tuple[str, ...]:
    """What the installed torch.compile accepts (it grows with torch releases, so asked of torch; only a
    recipe giving compile options pays the import)."""
    import inspect

    import torch

    return tuple(name for name in inspect.signature(torch.compile).parameters if name != "model")


def _check_option_keys(key: str, given: Any, valid: tuple[str, ...]) -> None:
    if isinstance(given, dict):
        for name in given:
            if name not in valid:
                raise RecipeError(
                    f"{key}.{name}: unknown option{did_you_mean(str(name), valid)}; valid: {', '.join(valid)}"
                )


def _with_defaults(entry: registry.Entry, params: dict[str, Any]) -> dict[str, Any]:
    defaults = {n: p.default for n, p in entry.parameters.items() if p.default is not p.empty}
    return {**defaults, **params}


def _check_input_side(config: RecipeConfig) -> None:
    """A model with ``min_input_size`` (timm, torchvision) against the data's image side, before building."""
    if config.task is not None:
        return
    data, model = registry.datasets.get(config.dataset.name), registry.models.get(config.model.name)
    side_of = data.metadata.get("image_side")
    if side_of is None or "min_input_size" not in model.parameters:
        return
    from dlrecipes.models.factories import refuse_small_inputs

    side = side_of(_with_defaults(data, config.dataset.params))
    params = _with_defaults(model, config.model.params)
    refuse_small_inputs(config.model.name, params.get("arch", config.model.name), (3, side, side), params["min_input_size"])


def _logged_metrics(config: RecipeConfig, split: str) -> tuple[list[str], str]:
    """The metric names an evaluation (``eval``) or the training (``train``) logs, and an example."""
    if config.task is not None:
        outputs = {name: io for name, io in declared_io(config.dataset.name, config.dataset.params).outputs.items()
                   if name in config.task.outputs}
        example = next((f"{n}/top1" for n, s in outputs.items() if s.kind == "class"), f"{next(iter(outputs))}/loss")
        return metric_names(outputs, train=split == "train"), example
    if split == "train":
        names = list(config.train_metrics)
        return names, (names or ["top1"])[0]
    scalar = [n for n in config.metrics if not registry.metrics.get(n).metadata.get("report")]
    return [*scalar, EVAL_LOSS], (scalar or [EVAL_LOSS])[0]


def _check_monitors(config: RecipeConfig) -> None:
    """checkpoint.monitor and every callback's ``monitor`` must be a metric the run logs."""
    watched = []
    if config.checkpoint.monitor:
        watched.append(("checkpoint.monitor", config.checkpoint.monitor, "eval"))
    for name, params in config.callbacks.items():
        entry = registry.callbacks.get(name)
        if "monitor" in entry.parameters:
            default = entry.parameters["monitor"].default
            split = params.get("split", "eval")
            watched.append((f"callbacks.{name}.monitor", params.get("monitor", default), split))
    for path, monitor, split in watched:
        if split == "train" and config.trainer.train_metrics_interval == 0:
            raise RecipeError(f"{path}: split 'train' watches a train metric, but trainer.train_metrics_interval "
                              "is 0 (no train metrics); set it to 1 or more, or watch split 'eval'")
        known, example = _logged_metrics(config, split)
        if monitor not in known:
            raise RecipeError(
                f"{path}: '{monitor}' is not {'an eval' if split == 'eval' else 'a train'} metric of this "
                f"{'task' if config.task is not None else 'run'}"
                f"{did_you_mean(str(monitor), known)}; it logs {', '.join(known)} (e.g. {path}={example})"
            )


def _check_cross_fields(config: RecipeConfig) -> None:
    t = config.trainer
    _check_monitors(config)
    if config.checkpoint.load_ignore_keys and not config.checkpoint.load_weights_only:
        raise RecipeError("checkpoint.load_ignore_keys: applies to weights-only loads; set "
                          "checkpoint.load_weights_only=true, or remove load_ignore_keys")
    _check_option_keys("trainer.fsdp", t.fsdp, FSDP_KEYS)
    if isinstance(t.compile, dict):
        _check_option_keys("trainer.compile", t.compile, compile_keys())
    _check_input_side(config)
    if config.run_name is not None and not _RUN_NAME_RE.match(config.run_name):
        raise RecipeError(
            f"run_name: {config.run_name!r} must be a plain name (letters, digits, '.', '_', '-'; no '/' or '..')"
        )
    if t.batch_size < 1:
        raise RecipeError(f"trainer.batch_size: must be at least 1, got {t.batch_size}")
    if t.eval_batch_size is not None and t.eval_batch_size < 1:
        raise RecipeError(f"trainer.eval_batch_size: must be at least 1, got {t.eval_batch_size}")
    if t.num_workers < 0:
        raise RecipeError(f"trainer.num_workers: must be 0 or more, got {t.num_workers}")
    if t.log_interval < 1:
        raise RecipeError(f"trainer.log_interval: must be at least 1 (batches), got {t.log_interval}")
    if t.train_metrics_interval < 0:
        raise RecipeError(f"trainer.train_metrics_interval: must be 0 (off) or more, got {t.train_metrics_interval}")
    if not t.dist_timeout > 0:
        raise RecipeError(f"trainer.dist_timeout: must be more than 0 seconds, got {t.dist_timeout}")
    micro = t.device_train_microbatch_size
    if isinstance(micro, int) and micro < 1:
        raise RecipeError(f"trainer.device_train_microbatch_size: must be at least 1, got {micro}")
    f = config.finetune
    if f is not None:
        if f.head_lr is not None and f.head_lr <= 0:
            raise RecipeError(f"finetune.head_lr: must be above 0, got {f.head_lr}")
        if f.layer_decay is not None and not 0 < f.layer_decay <= 1:
            raise RecipeError(f"finetune.layer_decay: must be in (0, 1], got {f.layer_decay}")
        if f.layer_decay is not None and "layerwise_lr_decay" in config.algorithms:
            raise RecipeError("finetune.layer_decay: algorithms.layerwise_lr_decay is set too; keep one of them")
    c = config.checkpoint
    if c.best_only and not c.monitor:
        raise RecipeError("checkpoint.best_only: needs checkpoint.monitor, the metric that decides what is best")
    if c.keep < -1:
        raise RecipeError(f"checkpoint.keep: must be -1 (all) or 0 or more, got {c.keep}")
    if t.loader == "device" and not registry.datasets.get(config.dataset.name).metadata.get("in_memory"):
        usable = ", ".join(e.name for e in registry.datasets if e.metadata.get("in_memory"))
        raise RecipeError(
            f"trainer.loader: 'device' needs a dataset held in memory as tensors ({usable}); "
            f"'{config.dataset.name}' reads files: use trainer.loader=torch"
        )
    if t.loader == "tensor_cache" and not registry.datasets.get(config.dataset.name).metadata.get("pil_images"):
        usable = ", ".join(e.name for e in registry.datasets if e.metadata.get("pil_images"))
        raise RecipeError(
            f"trainer.loader: 'tensor_cache' caches image folders ({usable}); for '{config.dataset.name}' "
            "use trainer.loader=device (in-memory data) or torch"
        )
    _check_algorithm_prerequisites(config)


def _check_algorithm_prerequisites(config: RecipeConfig) -> None:
    """Algorithms that exclude each other, or need a kind of model or data (entry metadata)."""
    for name in config.algorithms:
        entry = registry.algorithms.get(name)
        for other, reason in entry.metadata.get("conflicts_with", {}).items():
            if other in config.algorithms:
                raise RecipeError(f"algorithms: {name} and {other} cannot be used together ({reason}); remove one")
        requires = entry.metadata.get("requires")
        problem = requires(config) if requires is not None else None
        if problem:
            raise RecipeError(f"algorithms.{name}: {problem}")


