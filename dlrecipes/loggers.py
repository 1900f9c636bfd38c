"""Built-in logger destinations (Composer's), registered by name for ``loggers:``.

The run's text log (``train.log`` in the run directory) is always written; these add
experiment trackers.  Optional trackers are pip extras with an install hint.
"""

from __future__ import annotations

from typing import Optional

from dlrecipes.errors import UserError
from dlrecipes.registry import loggers


def _require(module: str, extra: str, pip_spec: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"loggers.{extra}: the '{module}' package is not installed. Install it with: pip install '{pip_spec}'"
        )


@loggers.register("tensorboard")
def tensorboard(run_dir, /, log_dir: Optional[str] = None, flush_interval: int = 100):
    """TensorBoard event files (default: <run dir>/tensorboard)."""
    _require("tensorboard", "tensorboard", "dlrecipes[tensorboard]")
    from composer.loggers import TensorboardLogger

    return TensorboardLogger(log_dir=log_dir or f"{run_dir}/tensorboard", flush_interval=flush_interval)


@loggers.register("wandb")
def wandb(
    project: Optional[str] = None,
    entity: Optional[str] = None,
    group: Optional[str] = None,
    name: Optional[str] = None,
    tags: Optional[list[str]] = None,
    offline: bool = False,
):
    """Weights & Biases (honours WANDB_MODE=offline; `offline: true` forces it)."""
    _require("wandb", "wandb", "wandb<0.19")  # the range Composer 0.32 declares
    import os

    from composer.loggers import WandBLogger

    if offline:
        os.environ["WANDB_MODE"] = "offline"
    return WandBLogger(project=project, entity=entity, group=group, name=name, tags=tags)
