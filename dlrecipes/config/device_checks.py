"""What a launch can run: no more processes per node than GPUs and batches that divide over the processes
(checked at validation, before anything is built); and what a recipe's GPU steps read back.  Whether this
machine can run the recipe's device, precision, FSDP and microbatching is :mod:`dlrecipes.core.devices`' (the
one place that asks torch about GPUs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrecipes.core.devices import check_gpus_per_node, on_gpu, resolve_device
from dlrecipes.core.distributed import split_batch
from dlrecipes.core.precision import precision_of

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig


def check_launch(config: RecipeConfig, nproc: int, processes: int) -> None:
    """``launch`` (and a run started by a launcher): no more processes per node than GPUs, and
    global batches that divide over all the processes."""
    if on_gpu(resolve_device(config.trainer.device)):
        check_gpus_per_node(nproc)
    check_batches_divide(config, processes)


def check_batches_divide(config: RecipeConfig, processes: int) -> None:
    """The recipe's global batches split evenly over ``processes`` (a per-device batch always does)."""
    t = config.trainer
    if t.batch_size_per_device is None:
        split_batch(t.batch_size, processes, "trainer.batch_size")
    if t.eval_batch_size is not None:
        split_batch(t.eval_batch_size, processes, "trainer.eval_batch_size")


def read_back_notes(config: RecipeConfig) -> list[str]:
    """What the recipe's GPU steps must read back from the device (each a synchronisation per step: the GPU's
    queue drains before the next step can be queued), one line each; none for a CPU recipe."""
    if config.trainer.device == "cpu":
        return []
    from dlrecipes import registry

    algorithms = registry.algorithms
    notes = [
        f"algorithms.{name} reads back on a GPU: {algorithms.get(name).metadata['reads_back']}"
        for name in config.algorithms or {}
        if algorithms.get(name).metadata.get("reads_back")
    ]
    optimizer = config.optimizer
    fused = "fused" in registry.optimizers.get(optimizer.name).parameters and optimizer.params.get("fused") is not False
    if precision_of(config.trainer.precision).grad_scaler and not fused:
        notes.append(
            f"trainer.precision {config.trainer.precision} with optimizer {optimizer.name} (not fused) reads "
            "back on a GPU: torch's gradient scaler asks every step whether the gradients overflowed, to skip "
            "that step (a fused sgd or adamw keeps that on the device; bf16 needs no scaler)"
        )
    return [f"note: {line} (docs/performance.md)" for line in notes]
