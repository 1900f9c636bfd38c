"""The recipe's sections: what a resolved recipe may contain, with types, defaults and help.

Each section is a dataclass whose fields are its keys (``help`` in their metadata, what ``show``,
``list`` and the reference pages print); components are named by registry (``COMPONENT_SECTIONS``,
``COMPONENT_MAPS``) and checked against their factories by :mod:`.checks`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from dlrecipes import registry
from dlrecipes.core.addresses import RUNS_DIR
from dlrecipes.core.durations import DURATION_FORM, Duration
from dlrecipes.core.outputs import DEFAULT_METRICS, DEFAULT_TRAIN_METRICS
from dlrecipes.core.precision import precisions_meaning
from dlrecipes.core.ranges import AtLeastOne, Positive, PositiveDuration, Range, Size
from dlrecipes.core.secrets import redact


def _help(text: str, **kw: Any) -> Any:
    return field(metadata={"help": text}, **kw)


@dataclass
class Component:
    """A registry entry by name, with the parameters for its factory."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.params}

    def __repr__(self) -> str:  # a notebook cell shows it, and keeps it in the .ipynb
        return f"Component({redact(self.to_dict())!r})"


@dataclass
class TrainerConfig:
    max_duration: PositiveDuration = _help("how long to train: '10ep', '500ba', ...", default="1ep")
    eval_interval: PositiveDuration = _help(
        f"how often to evaluate on the eval split (metrics, checkpoint.monitor, best.pt), {DURATION_FORM}; also at "
        "the end of training when the interval does not divide it. 0 and null are refused: evaluation always runs at "
        "least at the end (trainer.eval_subset_num_batches shortens it)",
        default="1ep",
    )
    precision: Literal["fp32", "amp_fp16", "amp_bf16"] = _help(precisions_meaning(), default="fp32")
    device: Literal["auto", "cpu", "gpu"] = _help("auto = gpu if one is available, else cpu", default="auto")
    seed: Annotated[int, Range(0, 2**32 - 1)] = _help(
        "random seed for weights, data order and augmentation", default=17
    )  # NumPy's range: Composer seeds it too
    deterministic: bool = _help("use deterministic algorithms only (slower, reproducible)", default=False)
    batch_size: AtLeastOne = _help("global training batch size, split evenly over all devices", default=128)
    batch_size_per_device: AtLeastOne | None = _help(
        "instead of batch_size: the batch each device trains on; the global batch (and the lr that "
        "optimizer.scale_lr derives from it) then grows with the number of devices",
        default=None,
    )
    eval_batch_size: AtLeastOne | None = _help("global evaluation batch size (default: batch_size)", default=None)
    device_train_microbatch_size: AtLeastOne | Literal["auto"] | None = _help(
        "per-device microbatch for gradient accumulation; 'auto' (GPU only) finds the largest that fits",
        default=None,
    )
    num_workers: Annotated[int, Range(0)] = _help("dataloader worker processes per device", default=2)
    loader: Literal["torch", "device", "tensor_cache"] = _help(
        "torch: a DataLoader with per-sample transforms; device: keep an in-memory dataset on the "
        "training device and crop/flip/normalise whole batches there (digits, MNIST, CIFAR, synthetic); "
        "tensor_cache: decode an image folder once to a uint8 memory map, then augment whole batches",
        default="torch",
    )
    cache_dir: str | None = _help(
        "tensor_cache: where to write the cache (default: .dlrecipes-cache next to the data)", default=None
    )
    cache_size: Size | None = _help(
        "tensor_cache: side of the cached square images (default: dataset resize_size)", default=None
    )
    progress_bar: bool = _help(
        "on a terminal, a live progress line per phase (a summary row per epoch is printed either way)", default=True
    )
    console_log_interval: Duration = _help(
        "with `train --verbose`: how often Composer prints every metric", default="1ep"
    )
    log_interval: AtLeastOne = _help(
        "every how many batches the terminal and the run log read the training loss back from the device "
        "(and at each epoch's last batch); every batch's loss reaches the loggers, and the steps in between "
        "never wait for the device",
        default=50,
    )
    train_metrics_interval: Annotated[int, Range(0)] = _help(
        "every how many batches the step's own outputs update the train metrics, which cover the epoch and are "
        "reported at its end (1 = every batch; 0 = no train metrics)",
        default=10,
    )
    dist_timeout: Positive = _help(
        "seconds that processes wait for each other (process group setup and every collective) before "
        "the run stops with an error",
        default=300.0,
    )
    fsdp: dict[str, Any] | None = _help(
        "shard the model with FSDP through Composer's parallelism_config (GPU only), e.g. "
        "{sharding_strategy: FULL_SHARD, mixed_precision: DEFAULT}",
        default=None,
    )
    compile: bool | dict[str, Any] = _help(
        "torch.compile the model through Composer's compile_config: true, or options such as {mode: max-autotune}",
        default=False,
    )
    eval_subset_num_batches: int = _help("evaluate on this many batches only (-1 = all)", default=-1)
    train_subset_num_batches: int = _help("train on this many batches per epoch only (-1 = all)", default=-1)


@dataclass
class CheckpointConfig:
    save: bool = _help("write checkpoints under the run directory", default=True)
    save_interval: PositiveDuration = _help(
        f"how often to write a periodic checkpoint (checkpoints/ep<E>-ba<B>-rank0.pt, what --resume continues "
        f"from), {DURATION_FORM}; one is also written at the end of training. 0 and null are refused: "
        "checkpoint.save=false writes none, checkpoint.best_only=true only best.pt",
        default="1ep",
    )
    keep: Annotated[int, Range(-1)] = _help("how many periodic checkpoints to keep (-1 = all)", default=2)
    monitor: str | None = _help(
        "eval metric to track for best.pt, e.g. 'top1' or 'macro_f1' (one the run computes; null = no best checkpoint)",
        default=None,
    )
    mode: Literal["max", "min"] = _help("whether a larger or smaller monitored metric is better", default="max")
    best_only: bool = _help("keep only best.pt (needs monitor); periodic checkpoints are not written", default=False)
    upload_wait: Annotated[float, Range(0)] = _help(
        "runs_dir in a bucket: the most seconds the end of a run waits for its uploads (what is not up then is "
        "named, and --resume uploads it)",
        default=120.0,
    )
    load_path: str | None = _help("checkpoint to load weights from before training (fine-tuning)", default=None)
    load_strict: bool = _help("require every weight in load_path to match the model", default=True)
    load_weights_only: bool = _help("load only the weights from load_path, not the optimizer or time", default=True)
    load_ignore_keys: list[str] = _help(
        "glob patterns of state keys not to load, e.g. 'state/model/*fc*'", default_factory=list
    )


@dataclass
class OutputConfig:
    loss: str | dict[str, Any] = _help(
        "this output's loss, a name or {name: ..., <params>}: cross_entropy, binary_cross_entropy, focal "
        "(class labels), mse, l1 (regression values), or a plugin's (dlrecipes list losses)",
        default="cross_entropy",
    )
    weight: float = _help("weight of this output's loss in the total (0 or more)", default=1.0)
    num_classes: int | None = _help("class count, checked against the dataset's", default=None)


@dataclass
class TaskConfig:
    """Several inputs and outputs: the batch is (inputs..., targets...) as the dataset declares them."""

    inputs: list[str] = _help("the model's inputs, in the order its forward takes them (the dataset's input names)")
    outputs: dict[str, OutputConfig] = _help("one entry per output: {name: {loss, weight, num_classes}}")


@dataclass
class FinetuneConfig:
    """Fine-tuning a pretrained network: a frozen backbone at first, a head learning rate, layer-wise decay."""

    freeze_backbone: Duration = _help(
        "train only the head for this long, then everything ('0ep': never frozen)", default="0ep"
    )
    head_lr: Positive | None = _help(
        "the head's learning rate (default: optimizer.lr, like the backbone)", default=None
    )
    head: list[str] = _help(
        "module names (globs) forming the head (default: the classifier, found from the model)", default_factory=list
    )
    layer_decay: Annotated[float, Range(0, 1, low_open=True)] | None = _help(
        "layer-wise lr decay in (0, 1]: block d of D gets lr * decay ** (D-1-d)", default=None
    )


@dataclass
class RecipeConfig:
    """A validated recipe; ``origin`` (set by validation, not a recipe key) is the file it was read from, or None
    for a recipe given as a dict."""

    origin = None  # class default: a config made without validation has no file

    model: Component = _help("the network: {name: <model>, ...params}")
    dataset: Component = _help("the data: {name: <dataset>, ...params}")
    name: str | None = _help("recipe name, used in run names (default: the file name)", default=None)
    description: str = _help("one line about what this recipe is for", default="")
    run_name: str | None = _help("run directory name (default: <name>-<timestamp>)", default=None)
    runs_dir: str = _help(
        "where run directories are written: a local folder (relative to the working directory), or a bucket, "
        "s3://BUCKET/PREFIX (also gs://, oci://, azure://; credentials from the environment: AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, S3_ENDPOINT_URL for another server), whose runs are written in a local staging folder "
        "($DLRECIPES_STAGING_DIR, default ~/.cache/dlrecipes/staging/BUCKET/PREFIX/RUN) and uploaded as they are "
        "written (docs/object-storage.md)",
        default=RUNS_DIR,
    )
    imports: list[str] = _help("plugin modules or .py files to import before building", default_factory=list)
    loss: str | dict[str, Any] = _help(
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
    task: TaskConfig | None = _help(
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
    finetune: FinetuneConfig | None = _help(
        "fine-tuning: {freeze_backbone: 2ep, head_lr: ..., head: [names], layer_decay: ...} (null: train all alike)",
        default=None,
    )
    algorithms: dict[str, dict[str, Any]] = _help(
        "training methods (Composer's and dlrecipes'), each by its registered name: {name: {params}} (true: its "
        "defaults; null: off, in a recipe over a base); e.g. {label_smoothing: {smoothing: 0.1}, ema: {}}; the names "
        "and their parameters: dlrecipes list algorithms",
        default_factory=dict,
    )
    callbacks: dict[str, dict[str, Any]] = _help(
        "what runs at training events besides the training itself (monitors, early stopping, a profiler, an export "
        "at the end), each a Composer Callback by its registered name: {name: {params}} (true: its defaults; null: "
        "off, in a recipe over a base); e.g. {early_stopping: {monitor: top1, patience: 3}, lr_monitor: {}}; the names "
        "and their parameters: dlrecipes list callbacks (a plugin registers its own)",
        default_factory=dict,
    )
    loggers: dict[str, dict[str, Any]] = _help(
        "where metrics go besides the terminal and the run's files (MLflow, W&B, TensorBoard), each by its registered "
        "name: {name: {params}}; e.g. {tensorboard: {}}; the names and their parameters: dlrecipes list loggers",
        default_factory=dict,
    )
    plots: bool = _help(
        "draw the end-of-run PNGs: loss, accuracy and lr from history.csv, and the report's confusion matrix and "
        "per-class accuracy (about a second of CPU a run); false: their CSVs only (dlrecipes plot RUN draws the "
        "history's later)",
        default=True,
    )

    def __repr__(self) -> str:  # a notebook cell shows it, and keeps it in the .ipynb: secrets redacted
        return f"RecipeConfig({redact(self.to_dict())!r})"

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what ``show`` prints and runs save)."""
        out: dict[str, Any] = {}
        for name in TOP_LEVEL_ORDER:
            value = getattr(self, name)
            if name in ("task", "finetune") and value is None:
                continue  # a recipe without a task resolves as a single-output classifier
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
    "name",
    "description",
    "run_name",
    "runs_dir",
    "imports",
    "model",
    "dataset",
    "loss",
    "metrics",
    "train_metrics",
    "task",
    "trainer",
    "optimizer",
    "scheduler",
    "checkpoint",
    "finetune",
    "algorithms",
    "callbacks",
    "loggers",
    "plots",
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


# What Composer's FSDPConfig accepts (kept here so validation imports neither Composer nor torch;
# tests/test_validation.py checks it against the installed Composer).
FSDP_KEYS = (
    "activation_checkpointing",
    "activation_checkpointing_reentrant",
    "activation_cpu_offload",
    "auto_wrap",
    "backward_prefetch",
    "backward_prefetch_limit",
    "cpu_offload",
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "forward_prefetch",
    "forward_prefetch_limit",
    "ignored_modules",
    "keep_low_precision_grads",
    "limit_all_gathers",
    "load_monolith_rank0_only",
    "load_planner",
    "mixed_precision",
    "process_group",
    "save_planner",
    "sharded_ckpt_prefix_dir",
    "sharding_strategy",
    "state_dict_type",
    "sync_module_states",
    "te_checkpoint_wrapper",
    "te_shard_fp8_weight",
    "use_orig_params",
    "verbose",
)


def compile_keys() -> tuple[str, ...]:
    """What the installed torch.compile accepts (it grows with torch releases, so asked of torch; only a
    recipe giving compile options pays the import)."""
    import inspect

    import torch

    return tuple(name for name in inspect.signature(torch.compile).parameters if name != "model")
