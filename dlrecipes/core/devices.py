"""One device vocabulary, and every question about this machine's devices, in one place.

A device is named ``auto``, ``cpu`` or ``gpu`` everywhere: a recipe's ``trainer.device``, ``profile --device``,
the benchmarks' ``--device``.  ``auto`` resolves to ``gpu`` when this machine has a CUDA GPU, else ``cpu``; torch's
own name of a GPU (``cuda``) stays inside this module and torch's tensors.

- :data:`DEVICES`, :func:`check_device_name`: the words, and the one-line refusal of any other;
- :func:`resolve_device`: ``auto`` -> ``gpu`` or ``cpu``; :func:`torch_device`: this process's torch device for a
  resolved name; :func:`device_name`: the name of a torch device;
- :func:`gpu_available`, :func:`gpu_count`, :func:`visible_gpus`: what GPUs this machine has (and this process may
  use);
- :func:`check_runs_here`, :func:`check_gpus_per_node`, :func:`check_device`: whether this machine can run a device,
  a launch's processes per node, and a recipe's device, precision, FSDP and microbatching (validation asks it).

Torch is imported only inside the functions that ask it: ``import dlrecipes`` and validation stay fast.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from dlrecipes.core.distributed import local_world_size
from dlrecipes.core.precision import precision_of
from dlrecipes.errors import RecipeError, UserError

DEVICES = ("auto", "cpu", "gpu")  # the schema's trainer.device lists the same (config/sections.py)

# Ends every "this machine has no GPU" error about a recipe: a GPU recipe is often checked on a laptop before it is
# sent to a cluster.
ON_A_MACHINE_WITHOUT_GPU = (
    "(dlrecipes validate --skip-device-check checks the rest of a GPU recipe on a machine without one)"
)


def on_gpu(device: str) -> bool:
    """Whether a resolved device (``resolve_device``'s ``cpu`` or ``gpu``) is the GPU: the one place that compares."""
    return device == "gpu"


def check_device_name(device: str, key: str) -> str:
    """``device`` when it is one of :data:`DEVICES`; any other word is refused in one line naming ``key``."""
    if device not in DEVICES:
        hint = " (a CUDA GPU is 'gpu')" if str(device).lower() == "cuda" else ""
        raise RecipeError(f"{key}: expected one of {', '.join(DEVICES)}, got {device!r}{hint}")
    return device


def gpu_available() -> bool:
    """Whether this machine has a CUDA GPU torch can use."""
    import torch

    return torch.cuda.is_available()


def gpu_count() -> int:
    """How many GPUs torch sees (0 on a machine without)."""
    import torch

    return torch.cuda.device_count()


def visible_gpus() -> list[str]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES``, else all of them); none on a CPU machine."""
    return [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g] or _gpu_ids()


def _gpu_ids() -> list[str]:
    try:
        return [str(i) for i in range(gpu_count())]
    except Exception:  # no torch CUDA: a CPU machine
        return []


def resolve_device(device: str) -> str:
    """'auto' -> 'gpu' when CUDA is available, else 'cpu'."""
    if device != "auto":
        return device
    return "gpu" if gpu_available() else "cpu"  # torch asked only when the device is left to us


def torch_device(device: str):
    """The torch device of this process for a resolved device name: its GPU (by local rank), or the CPU."""
    import torch

    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if device == "gpu" else torch.device("cpu")


def device_name(device: Any) -> str:
    """The name ('gpu' or 'cpu') of a torch device."""
    return "gpu" if device.type == "cuda" else "cpu"


def check_runs_here(device: str, key: str, advice: str = "") -> str:
    """``device`` resolved ('cpu' or 'gpu') when this machine can run it; 'gpu' on a machine without one is refused
    in one line naming ``key`` (and ``advice`` after it)."""
    resolved = resolve_device(device)
    if resolved == "gpu" and not gpu_available():
        raise RecipeError(
            f"{key}: 'gpu' requested but no CUDA GPU is available: use 'cpu' or 'auto'"
            + (f" {advice}" if advice else "")
        )
    return resolved


def check_gpus_per_node(processes: int) -> None:
    """No more processes on this node than it has GPUs (a GPU run: one GPU per process)."""
    available = gpu_count()
    if processes > available:
        raise UserError(f"-n/--nproc: {processes} processes per node but this node has {available} GPU(s)")


class _DeviceSettings(Protocol):
    """What :func:`check_device` reads of a recipe's trainer section (``dlrecipes.config.sections.TrainerConfig``)."""

    @property
    def device(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def device_train_microbatch_size(self) -> int | str | None: ...
    @property
    def fsdp(self) -> dict | None: ...


class DeviceRecipe(Protocol):
    """A recipe as :func:`check_device` reads it: a ``RecipeConfig`` (the foundation imports no config)."""

    @property
    def trainer(self) -> _DeviceSettings: ...


def check_device(config: DeviceRecipe) -> None:
    """Whether this machine can run the recipe's device, precision, FSDP and microbatching."""
    t = config.trainer
    needs_gpu = (
        precision_of(t.precision).mixed
        or t.device_train_microbatch_size == "auto"
        or t.device == "gpu"
        or t.fsdp is not None
    )
    if not needs_gpu:
        return
    if check_runs_here(t.device, "trainer.device", ON_A_MACHINE_WITHOUT_GPU) == "gpu":
        import torch

        if precision_of(t.precision).needs_bf16 and not torch.cuda.is_bf16_supported():
            raise RecipeError("trainer.precision: amp_bf16 is not supported by this GPU (use amp_fp16 or fp32)")
        check_gpus_per_node(local_world_size())  # started by a launcher with too many processes
        return
    if t.fsdp is not None:
        raise RecipeError(
            f"trainer.fsdp: FSDP needs GPUs (NCCL); this run is on the CPU. Remove trainer.fsdp "
            f"{ON_A_MACHINE_WITHOUT_GPU}."
        )
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
