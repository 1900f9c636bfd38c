"""dlrecipes' own algorithms, registered exactly as a user's plugin registers its own.

Imported with the built-ins (:mod:`dlrecipes.algorithms`).  The factories are light; the
implementations (which import torch and Composer) load only when a recipe uses them.
"""

from __future__ import annotations

import inspect
from typing import Literal, Optional

from dlrecipes.core.distributed import world_size
from dlrecipes.errors import RecipeError
from dlrecipes.registry import algorithms
from dlrecipes.core.durations import Duration, parse_duration


@algorithms.register("layerwise_lr_decay")
def layerwise_lr_decay(decay: float = 0.75, block_depth: int = 2):
    """Smaller learning rates nearer the input: block d of D trains at lr * decay ** (D - 1 - d)."""
    from dlrecipes.algorithms.layerwise_lr_decay import LayerwiseLRDecay

    return LayerwiseLRDecay(decay=decay, block_depth=block_depth)


@algorithms.register("gradient_checkpointing")
def gradient_checkpointing(targets: Optional[list[str]] = None, every: int = 1):
    """Recompute the activations of residual blocks in backward instead of storing them (memory for compute)."""
    from dlrecipes.algorithms.gradient_checkpointing import GradientCheckpointing

    return GradientCheckpointing(targets=targets, every=every)


# --- quantization-aware training -------------------------------------------------------------

_QAT_TIMES = ("start", "freeze_bn", "freeze_observers")


def _qat_times(params: dict) -> dict[str, str]:
    """The recipe's QAT times, defaults filled in, unset freezes left out."""
    defaults = {k: p.default for k, p in inspect.signature(qat).parameters.items() if k in _QAT_TIMES}
    times = {k: params.get(k, defaults[k]) for k in _QAT_TIMES}
    return {k: v for k, v in times.items() if v is not None}


def _check_qat_times(params: dict, path: str) -> None:
    """The freezes come after ``start`` (checked where the units agree; Composer checks nothing)."""
    times = _qat_times(params)
    start = parse_duration(times["start"])
    for key in ("freeze_bn", "freeze_observers"):
        if key in times and parse_duration(times[key])[1] == start[1] and parse_duration(times[key])[0] < start[0]:
            raise RecipeError(
                f"{path}.{key}: {times[key]!r} comes before start {times['start']!r}; "
                "it freezes what QAT inserts, so give a time at or after start"
            )


def _qat_fits_the_run(config) -> Optional[str]:
    """QAT runs in fp32, in one process, uncompiled, and its times fall inside training."""
    t = config.trainer
    if t.precision != "fp32":
        return f"fake quantization needs fp32 activations; trainer.precision is {t.precision} (use fp32)"
    if t.compile is not False:
        return (
            "swaps the network's modules mid-training, which a torch.compile'd model does not follow; "
            "set trainer.compile=false"
        )
    if getattr(config, "task", None) is not None:
        return "quantizes single-output classifiers; remove the task section (several inputs/outputs)"
    if t.fsdp is not None or world_size() > 1:
        return "runs in a single process (DDP/FSDP would not keep the inserted observers in sync); train on one device"
    end = parse_duration(t.max_duration)
    for key, value in _qat_times(config.algorithms["qat"]).items():
        number, unit = parse_duration(value)
        if (unit == "dur" and number >= 1) or (unit == end[1] and number >= end[0]):
            # a problem of one key: name it (requires' messages name only the algorithm)
            raise RecipeError(
                f"algorithms.qat.{key}: {value!r} is not before the end of training "
                f"(trainer.max_duration={t.max_duration}); QAT would never {'start' if key == 'start' else 'freeze'}"
            )
    return None


@algorithms.register(
    "qat",
    conflicts_with={
        "ema": "EMA keeps weights by name, and the QAT switch renames the fused layers",
        "swa": "SWA averages a copy of the network made before the QAT switch",
    },
    requires=_qat_fits_the_run,
    validator=_check_qat_times,
)
def qat(
    run_dir=None,
    /,
    start: Duration = "0.5dur",
    backend: Literal["x86", "fbgemm", "qnnpack"] = "x86",
    freeze_bn: Optional[Duration] = None,
    freeze_observers: Optional[Duration] = None,
    export: bool = True,
):
    """Quantization-aware training from `start` (conv-bn folding, int8 fake quantization); exports int8 TorchScript."""
    from pathlib import Path

    from dlrecipes.algorithms.qat import QAT

    export_dir = Path(run_dir) / "export" if export and run_dir is not None else None
    return QAT(start=start, backend=backend, freeze_bn=freeze_bn, freeze_observers=freeze_observers, export_dir=export_dir)
