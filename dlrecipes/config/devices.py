"""Where a run executes: the device it asks for, and this process among the launcher's processes.

One place for what was asked in several: the rank and process counts a launcher (``composer -n``,
torchrun, srun through ``dlrecipes launch``) puts in the environment (read from there, so that
validation can use them before torch.distributed starts), the choice of device, the torch device
of this process, and the checks that this machine can run the recipe (the host-side reductions
among the processes are :mod:`dlrecipes.distributed`).  Torch is imported only when needed.
"""

from __future__ import annotations

import os
from typing import Any

from dlrecipes.errors import RecipeError, UserError


def rank() -> int:
    """This process's global rank (0 without a launcher)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many processes train together (1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_world_size() -> int:
    """How many of them run on this node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size()))


def resolve_device(device: str) -> str:
    """'auto' -> 'gpu' when CUDA is available, else 'cpu'."""
    if device != "auto":
        return device
    import torch  # only asked when the recipe leaves the device to us

    return "gpu" if torch.cuda.is_available() else "cpu"


def torch_device(device: str):
    """The torch device of this process for a resolved device name: its GPU (by local rank), or the CPU."""
    import torch

    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if device == "gpu" else torch.device("cpu")


def check_device(config: Any) -> None:
    """Whether this machine can run the recipe's device, precision, FSDP and microbatching."""
    t = config.trainer
    needs_gpu = (
        t.precision != "fp32" or t.device_train_microbatch_size == "auto" or t.device == "gpu" or t.fsdp is not None
    )
    if not needs_gpu:
        return
    device = resolve_device(t.device)
    if device == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise RecipeError("trainer.device: 'gpu' requested but no CUDA GPU is available (use 'cpu' or 'auto')")
        if t.precision == "amp_bf16" and not torch.cuda.is_bf16_supported():
            raise RecipeError("trainer.precision: amp_bf16 is not supported by this GPU (use amp_fp16 or fp32)")
        return
    if t.fsdp is not None:
        raise RecipeError("trainer.fsdp: FSDP needs GPUs (NCCL); this run is on the CPU. Remove trainer.fsdp.")
    if t.precision != "fp32":
        raise RecipeError(
            f"trainer.precision: {t.precision} needs a GPU, and this run is on the CPU "
            "(Composer supports only fp32 there). Use trainer.precision=fp32."
        )
    if t.device_train_microbatch_size == "auto":
        raise RecipeError(
            "trainer.device_train_microbatch_size: 'auto' needs a GPU; on the CPU give a number or null"
        )


def check_devices(config: Any, nproc: int, processes: int) -> None:
    """More processes than GPUs, or a global batch that does not split evenly, fail here."""
    device = resolve_device(config.trainer.device)
    if device == "gpu":
        import torch

        available = torch.cuda.device_count()
        if nproc > available:
            raise UserError(f"-n/--nproc: {nproc} processes per node but this node has {available} GPU(s)")
    batches = [("trainer.eval_batch_size", config.trainer.eval_batch_size)]
    if config.trainer.batch_size_per_device is None:  # a per-device batch always splits evenly
        batches.insert(0, ("trainer.batch_size", config.trainer.batch_size))
    for key, batch in batches:
        if batch is not None and batch % processes:
            raise UserError(
                f"{key}: the global batch size {batch} does not divide evenly over {processes} processes "
                f"(use a multiple of {processes})"
            )
