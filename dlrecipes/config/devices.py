"""What this machine and a launch can run: the device, precision, FSDP and microbatching a recipe
asks for, the GPUs per node, and batches that divide over the processes (checked at validation,
before anything is built).  Torch is imported only to ask about GPUs.
"""

from __future__ import annotations

from typing import Any

from dlrecipes.core.distributed import local_world_size, resolve_device, split_batch
from dlrecipes.core.precision import precision_of
from dlrecipes.errors import RecipeError, UserError

# Ends every "this machine has no GPU" error: a GPU recipe is often checked on a laptop before it is sent to a cluster.
ON_A_MACHINE_WITHOUT_GPU = (
    "(dlrecipes validate --skip-device-check checks the rest of a GPU recipe on a machine without one)"
)


def check_device(config: Any) -> None:
    """Whether this machine can run the recipe's device, precision, FSDP and microbatching."""
    t = config.trainer
    needs_gpu = (
        precision_of(t.precision).mixed or t.device_train_microbatch_size == "auto" or t.device == "gpu" or t.fsdp is not None
    )
    if not needs_gpu:
        return
    device = resolve_device(t.device)
    if device == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise RecipeError("trainer.device: 'gpu' requested but no CUDA GPU is available: use 'cpu' or 'auto' "
                              + ON_A_MACHINE_WITHOUT_GPU)
        if precision_of(t.precision).needs_bf16 and not torch.cuda.is_bf16_supported():
            raise RecipeError("trainer.precision: amp_bf16 is not supported by this GPU (use amp_fp16 or fp32)")
        if local_world_size() > torch.cuda.device_count():  # started by a launcher with too many processes
            raise UserError(f"-n/--nproc: {local_world_size()} processes per node but this node has "
                            f"{torch.cuda.device_count()} GPU(s)")
        return
    if t.fsdp is not None:
        raise RecipeError(f"trainer.fsdp: FSDP needs GPUs (NCCL); this run is on the CPU. Remove trainer.fsdp "
                          f"{ON_A_MACHINE_WITHOUT_GPU}.")
    if precision_of(t.precision).mixed:
        raise RecipeError(
            f"trainer.precision: {t.precision} needs a GPU, and this run is on the CPU "
            f"(Composer supports only fp32 there). Use trainer.precision=fp32 {ON_A_MACHINE_WITHOUT_GPU}."
        )
    if t.device_train_microbatch_size == "auto":
        raise RecipeError(
            f"trainer.device_train_microbatch_size: 'auto' needs a GPU; on the CPU give a number or null "
            f"{ON_A_MACHINE_WITHOUT_GPU}"
        )


def check_launch(config: Any, nproc: int, processes: int) -> None:
    """``launch`` (and a run started by a launcher): no more processes per node than GPUs, and
    global batches that divide over all the processes."""
    device = resolve_device(config.trainer.device)
    if device == "gpu":
        import torch

        available = torch.cuda.device_count()
        if nproc > available:
            raise UserError(f"-n/--nproc: {nproc} processes per node but this node has {available} GPU(s)")
    check_batches_divide(config, processes)


def check_batches_divide(config: Any, processes: int) -> None:
    """The recipe's global batches split evenly over ``processes`` (a per-device batch always does)."""
    t = config.trainer
    if t.batch_size_per_device is None:
        split_batch(t.batch_size, processes, "trainer.batch_size")
    if t.eval_batch_size is not None:
        split_batch(t.eval_batch_size, processes, "trainer.eval_batch_size")


def read_back_notes(config: Any) -> list[str]:
    """What the recipe's GPU steps must read back from the device (each a synchronisation per step: the GPU's
    queue drains before the next step can be queued), one line each; none for a CPU recipe."""
    if config.trainer.device == "cpu":
        return []
    from dlrecipes import registry

    algorithms = registry.algorithms
    notes = [f"algorithms.{name} reads back on a GPU: {algorithms.get(name).metadata['reads_back']}"
             for name in config.algorithms or {} if algorithms.get(name).metadata.get("reads_back")]
    optimizer = config.optimizer
    fused = "fused" in registry.optimizers.get(optimizer.name).parameters and optimizer.params.get("fused") is not False
    if precision_of(config.trainer.precision).grad_scaler and not fused:
        notes.append(f"trainer.precision {config.trainer.precision} with optimizer {optimizer.name} (not fused) reads "
                     "back on a GPU: torch's gradient scaler asks every step whether the gradients overflowed, to skip "
                     "that step (a fused sgd or adamw keeps that on the device; bf16 needs no scaler)")
    return [f"note: {line} (docs/performance.md)" for line in notes]
