"""Builders: a validated section in, an object out.  One small function per section.

Each goes through :func:`dlrecipes.registry.build_component`, which supplies a factory's
positional-only parameters (the model for an optimizer, the run directory for a logger, the
run's :class:`~dlrecipes.core.run_context.RunContext` for a callback or logger that needs it)
from the context and checks the type of what it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlrecipes import registry
from dlrecipes.config import Component, TrainerConfig
from dlrecipes.core import lr_scaling
from dlrecipes.core.devices import on_gpu, torch_device
from dlrecipes.core.distributed import split_batch, world_size
from dlrecipes.core.run_context import RunContext
from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import RecipeError
from dlrecipes.records.layout import RunDir
from dlrecipes.registry import build_component

if TYPE_CHECKING:
    from composer.models import ComposerModel

    from dlrecipes.config.sections import TaskConfig

# Model parameters the builder fills from the dataset (and the recipe's loss) when the recipe leaves them out.
DATA_SUPPLIED_MODEL_PARAMS = ("num_classes", "in_chans", "input_shape", "loss")


def build_datasets(cfg: Component) -> DatasetSplits:
    return build_component(registry.datasets, cfg.name, cfg.params, "dataset.name")


def model_params(cfg: Component, data: DatasetSplits, loss: str = "cross_entropy") -> dict[str, Any]:
    """The model's parameters, with class count and input shape filled from the data (and the loss
    from the recipe, for factories whose initialisation depends on it)."""
    params = dict(cfg.params)
    accepted = registry.models.get(cfg.name).parameters
    supplied = {
        "num_classes": data.num_classes,
        "in_chans": data.input_shape[0],
        "input_shape": data.input_shape,
        "loss": loss,
    }
    for key in DATA_SUPPLIED_MODEL_PARAMS:
        if key in accepted and key not in params:
            params[key] = supplied[key]
    if params.get("num_classes", data.num_classes) != data.num_classes:
        raise RecipeError(
            f"model.num_classes: {params['num_classes']} does not match the dataset, which has "
            f"{data.num_classes} classes (leave model.num_classes out to take it from the data)"
        )
    if params.get("in_chans", data.input_shape[0]) != data.input_shape[0]:
        raise RecipeError(
            f"model.in_chans: {params['in_chans']} does not match the dataset's {data.input_shape[0]} channels"
        )
    if params.get("loss", loss) != loss:
        raise RecipeError(f"model.loss: '{params['loss']}' differs from the recipe's loss '{loss}' (set loss: instead)")
    return params


def build_model(
    cfg: Component,
    data: DatasetSplits,
    loss: str | dict[str, Any] = "cross_entropy",
    task: TaskConfig | None = None,
    metrics: dict | None = None,
    train_metrics: dict | None = None,
) -> ComposerModel:
    """The network wrapped as a Composer classifier with the recipe's loss and metrics.

    With a ``task`` (several inputs/outputs), a per-output loss and metrics wrapper instead.
    """
    from dlrecipes.models.classifier import wrap_classifier

    if task is not None:
        from dlrecipes.models.task_model import build_multi_io_model

        return build_multi_io_model(cfg, data, task)
    from dlrecipes.losses import loss_name

    module = build_component(registry.models, cfg.name, model_params(cfg, data, loss_name(loss)), "model.name")
    return wrap_classifier(module, data.num_classes, loss, metrics, train_metrics)


def build_dataloaders(
    data: DatasetSplits, cfg: TrainerConfig, device: str, seed: int = 0, algorithms: dict[str, Any] | None = None
):
    """Train and eval loaders for this rank; batch sizes in the recipe are global.

    ``algorithms`` tells an FFCV pipeline whether to emit channels-last images.
    """
    from dlrecipes.data.ffcv.loader import FFCVSource, build_ffcv_loaders, ffcv_dataspec

    train_batch = split_batch(cfg.batch_size, world_size(), "trainer.batch_size")
    eval_batch = split_batch(cfg.eval_batch_size or cfg.batch_size, world_size(), "trainer.eval_batch_size")
    if data.loaders is not None:  # passed in from Python: used as they are
        if world_size() > 1:
            raise RecipeError(
                "train_data/eval_data: a DataLoader passed in is used as it is and cannot be split over "
                f"{world_size()} processes; pass its Dataset instead"
            )
        built = (None, None) if all(data.loaders) else _torch_loaders(data, cfg, device, train_batch, eval_batch, seed)
        return data.loaders[0] or built[0], data.loaders[1] or built[1]
    if isinstance(data.train, FFCVSource):
        algorithms = algorithms or {}
        train, evaluation = build_ffcv_loaders(
            data.train,
            data.eval,
            train_batch,
            eval_batch,
            cfg.num_workers,
            device,
            cfg.precision,
            seed,
            channels_last="channels_last" in algorithms,
        )
        return ffcv_dataspec(train), ffcv_dataspec(evaluation)
    if cfg.loader == "device":
        return (
            device_loader(data.train, train_batch, True, device, seed),
            device_loader(data.eval, eval_batch, False, device, seed),
        )
    if cfg.loader == "tensor_cache":
        return (
            tensor_cache_loader(data, data.train, train_batch, True, cfg, device, seed),
            tensor_cache_loader(data, data.eval, eval_batch, False, cfg, device, seed),
        )
    return _torch_loaders(data, cfg, device, train_batch, eval_batch, seed)


def _torch_loaders(data: DatasetSplits, cfg: TrainerConfig, device: str, train_batch: int, eval_batch: int, seed: int):
    """torch DataLoaders over the splits, each rank reading its share: training in the global order
    (:mod:`dlrecipes.data.order`: the same batches, and resumable at any batch, on any number of processes)."""
    from composer.utils import dist
    from torch.utils.data import DataLoader

    from dlrecipes.data.order import ordered

    common = {
        "num_workers": cfg.num_workers,
        "pin_memory": on_gpu(device),
        "persistent_workers": cfg.num_workers > 0,
    }
    if len(data.train) < cfg.batch_size:
        raise RecipeError(
            f"trainer.batch_size: {cfg.batch_size} is larger than the training set ({len(data.train)} samples)"
        )
    later = getattr(data.train, "device_decode", None)  # (size, mean, std): decoded in batches on the device
    loader_type = DataLoader
    if later:
        from dlrecipes.data.device_decode import EncodedLoader, collate_encoded

        common["collate_fn"], loader_type = collate_encoded, EncodedLoader
    samples = ordered(data.train, cfg.batch_size, dist.get_global_rank(), dist.get_world_size(), seed)
    if hasattr(data.train, "check_cache"):  # shards: a cache limit that holds what the loaders read at once
        from dlrecipes.data.shards.cache import samples_in_flight

        spans = samples_in_flight(cfg.batch_size, cfg.eval_batch_size or cfg.batch_size, cfg.num_workers)
        data.train.check_cache(*spans["train"])
        data.eval.check_cache(*spans["val"])
    train = loader_type(samples, batch_size=train_batch, sampler=samples.sampler, drop_last=True, **common)
    evaluation = DataLoader(
        data.eval, batch_size=eval_batch, sampler=dist.get_sampler(data.eval, shuffle=False), **common
    )
    if later:
        return decoded_on_device(train, later, device), decoded_on_device(evaluation, data.eval.device_decode, device)
    return train, evaluation


def decoded_on_device(loader, decode: tuple, device: str):
    """``loader`` of encoded images as a Composer DataSpec that decodes each batch on the training device."""
    from composer.core import DataSpec

    from dlrecipes.data.device_decode import DecodeOnDevice, EncodedLoader, samples_in

    decoder = DecodeOnDevice(torch_device(device), *decode)
    if isinstance(loader, EncodedLoader):  # training's: progressive resizing sets the size the batches are cropped to
        loader.decoder = decoder
    return DataSpec(loader, batch_transforms=decoder, get_num_samples_in_batch=samples_in)


def device_loader(dataset, batch_size: int, train: bool, device: str, seed: int):
    """A :class:`DeviceTensorLoader` over an in-memory dataset, wrapped as a Composer DataSpec."""
    from composer.core import DataSpec
    from composer.utils import dist
    from torch.utils.data import TensorDataset

    from dlrecipes.data.device_loader import DeviceTensorLoader
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset

    if isinstance(dataset, TransformedTensorDataset) and dataset.sample is None:  # (image, label) samples
        images, labels, augment = dataset.images, dataset.labels, dataset.batch_augment
    elif isinstance(dataset, TensorDataset):
        (images, labels), augment = dataset.tensors, None
    else:
        raise RecipeError(f"trainer.loader: 'device' cannot load a {type(dataset).__name__}; use trainer.loader=torch")
    on_device = torch_device(device)
    loader = DeviceTensorLoader(
        images, labels, batch_size, augment, train, on_device, seed, dist.get_global_rank(), dist.get_world_size()
    )
    return DataSpec(loader, num_samples=loader.num_samples)


def tensor_cache_loader(
    data: DatasetSplits, dataset, batch_size: int, train: bool, cfg: TrainerConfig, device: str, seed: int
):
    """A tensor-cache loader (decode once, batched augmentation) as a Composer DataSpec."""
    from composer.core import DataSpec
    from composer.utils import dist

    from dlrecipes.data.tensor_cache import build_tensor_cache_loader

    if data.augment is None or not (hasattr(dataset, "samples") or hasattr(dataset, "pil_image")):
        raise RecipeError("trainer.loader: 'tensor_cache' needs an image-folder or Hugging Face dataset")
    on_device = torch_device(device)
    loader = build_tensor_cache_loader(
        dataset,
        batch_size,
        train,
        on_device,
        cfg.num_workers,
        seed,
        dist.get_global_rank(),
        dist.get_world_size(),
        cfg.cache_dir,
        cfg.cache_size,
        **data.augment,
    )
    return DataSpec(loader, num_samples=loader.num_samples)


def build_optimizer(cfg: Component, model, global_batch_size: int | None = None, fused: bool = False):
    """The optimizer; with ``scale_lr``, its lr is rescaled to the recipe's global batch size
    (:mod:`dlrecipes.core.lr_scaling`).

    ``fused``: what a factory with a ``fused`` parameter gets when the recipe leaves it unset
    (True for amp_fp16 on a GPU: see :mod:`dlrecipes.core.precision`).
    """
    params = lr_scaling.optimizer_params(cfg.params, global_batch_size)
    if fused and "fused" in registry.optimizers.get(cfg.name).parameters and params.get("fused") is None:
        params["fused"] = True
    return build_component(registry.optimizers, cfg.name, params, "optimizer.name", model=model)


def build_scheduler(cfg: Component):
    return build_component(registry.schedulers, cfg.name, cfg.params, "scheduler.name")


def build_algorithms(cfgs: dict[str, dict[str, Any]], layout: RunDir | None = None) -> list:
    """The recipe's algorithms; ``layout`` (the run directory) goes to factories that take it positional-only
    (``qat`` exports there)."""
    return [
        build_component(
            registry.algorithms,
            name,
            params,
            f"algorithms.{name}",
            layout=layout,
            run_dir=None if layout is None else layout.path,
        )
        for name, params in cfgs.items()
    ]


def build_callbacks(cfgs: dict[str, dict[str, Any]], layout: RunDir, run: RunContext | None = None) -> list:
    """The recipe's callbacks; the run directory (``layout``, or as a path: ``run_dir``) and ``run`` go to factories
    that take them positional-only."""
    return [
        build_component(
            registry.callbacks, name, params, f"callbacks.{name}", layout=layout, run_dir=layout.path, run=run
        )
        for name, params in cfgs.items()
    ]


def build_loggers(cfgs: dict[str, dict[str, Any]], layout: RunDir, run: RunContext | None = None) -> list:
    """The recipe's loggers; the run directory (``layout``, or as a path: ``run_dir``) and ``run`` go to factories
    that take them positional-only."""
    return [
        build_component(registry.loggers, name, params, f"loggers.{name}", layout=layout, run_dir=layout.path, run=run)
        for name, params in cfgs.items()
    ]
