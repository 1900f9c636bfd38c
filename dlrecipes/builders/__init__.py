"""Build: a validated config in, the objects it names out (the third stage).

- :mod:`.components`: one small builder per section (dataset, model, loaders, optimizer,
  scheduler, algorithms, callbacks, loggers), each through :func:`dlrecipes.registry.build_component`;
- :mod:`.trainer`: a run's Trainer around them (and the benchmarks' variant of it).

The fit stage (:mod:`dlrecipes.fit`) and the tools build through these, never by hand.
"""

from dlrecipes.builders.components import (
    DATA_SUPPLIED_MODEL_PARAMS,
    build_algorithms,
    build_callbacks,
    build_dataloaders,
    build_datasets,
    build_loggers,
    build_model,
    build_optimizer,
    build_scheduler,
    device_loader,
    model_params,
    tensor_cache_loader,
)
from dlrecipes.builders.trainer import BuiltRun, build_bench_trainer, build_trainer

__all__ = [
    "DATA_SUPPLIED_MODEL_PARAMS",
    "BuiltRun",
    "build_algorithms",
    "build_bench_trainer",
    "build_callbacks",
    "build_dataloaders",
    "build_datasets",
    "build_loggers",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "build_trainer",
    "device_loader",
    "model_params",
    "tensor_cache_loader",
]
