"""What a model costs before training it: parameters, size, MACs/FLOPs, latency, peak memory.

FLOPs come from torch's own counter (``torch.utils.flop_counter.FlopCounterMode``), which
counts matrix multiplications and convolutions (2 FLOPs per multiply-accumulate) as the
published figures do; MACs are half the FLOPs.  Fused attention is counted on every device:
torch's counter knows the GPU kernels of ``scaled_dot_product_attention``, and
:func:`attention_flop_formulas` adds the CPU one (its two matmuls, as the GPU kernels count).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dlrecipes.core.devices import check_device_name, check_runs_here, on_gpu, torch_device
from dlrecipes.errors import RecipeError, did_you_mean

if TYPE_CHECKING:
    from dlrecipes.config.sections import Component
    from dlrecipes.data.splits import DatasetSplits


def resolve_model(name: str, params: dict[str, Any], input_size: tuple[int, int, int]) -> nn.Module:
    """A registry model by name, or ``timm/<arch>``, ``torchvision/<arch>``, or a bare timm architecture."""
    from dlrecipes import registry
    from dlrecipes.plugins import load_all
    from dlrecipes.registry import build_component

    load_all()
    if "/" in name:
        family, arch = name.split("/", 1)
        if family not in ("timm", "torchvision"):
            raise RecipeError(f"--model: '{family}/' is not a model family (use timm/<arch> or torchvision/<arch>)")
        name, params = family, {"arch": arch, **params}
    elif name not in registry.models:
        import timm

        if not timm.is_model(name):
            raise RecipeError(
                f"--model: unknown model '{name}'{did_you_mean(name, registry.models.names())}; registry models: "
                f"{', '.join(registry.models.names())}, or timm/<arch>, torchvision/<arch>"
            )
        name, params = "timm", {"arch": name, **params}
    entry = registry.models.get(name, key_path="--model")
    if "in_chans" in entry.parameters and "in_chans" not in params:
        params["in_chans"] = input_size[0]
    if "min_input_size" in entry.parameters and "min_input_size" not in params:
        params["min_input_size"] = 1  # profiling only: any size
    return build_component(registry.models, name, params, "--model")


def attention_flop_formulas() -> dict[Any, Any]:
    """FLOP formulas for the CPU kernel of fused attention, which torch's counter (2.7) leaves out: the same
    count as its GPU kernels (``Q @ K^T`` and ``P @ V``)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    formulas = {}
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if forward is not None:
        formulas[forward] = lambda query, key, value, *args, **kwargs: flop_counter.sdpa_flop_count(query, key, value)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if backward is not None:
        formulas[backward] = lambda grad_out, query, key, value, *args, **kwargs: flop_counter.sdpa_backward_flop_count(
            grad_out, query, key, value
        )
    return formulas


def count_flops(model: nn.Module, example: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
    with torch.no_grad(), counter:
        model(example)
    return int(counter.get_total_flops())


def time_forward(model: nn.Module, example: torch.Tensor, warmup: int, repeats: int) -> dict[str, float]:
    """Median and 90th-percentile forward latency in milliseconds, after warm-up."""
    sync = torch.cuda.synchronize if example.is_cuda else (lambda: None)
    times = []
    with torch.no_grad():
        for i in range(warmup + repeats):
            sync()
            start = time.perf_counter()
            model(example)
            sync()
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"median_ms": statistics.median(times), "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))]}


def profile_model(
    model: nn.Module,
    input_size: tuple[int, int, int],
    batch: int = 32,
    device: str = "auto",
    warmup: int = 3,
    repeats: int = 10,
) -> dict[str, Any]:
    """The model's costs on ``device`` (auto, cpu or gpu); ``result["device"]``: the device it ran on."""
    name = check_runs_here(check_device_name(device, "--device"), "--device")
    device = torch_device(name)
    model = model.eval().to(device)
    params = sum(p.numel() for p in model.parameters())
    size_bytes = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    one = torch.randn(1, *input_size, device=device)
    flops = count_flops(model, one)
    result: dict[str, Any] = {
        "input_size": list(input_size),
        "parameters": params,
        "parameters_millions": params / 1e6,
        "size_mb": size_bytes / 2**20,
        "flops": flops,
        "gflops": flops / 1e9,
        "macs": flops // 2,
        "gmacs": flops / 2e9,
        "device": name,
        "latency": {"batch_1": time_forward(model, one, warmup, repeats)},
    }
    batched = torch.randn(batch, *input_size, device=device)
    if on_gpu(name):
        torch.cuda.reset_peak_memory_stats()
    result["latency"][f"batch_{batch}"] = time_forward(model, batched, warmup, repeats)
    result["batch"] = batch
    result["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20 if on_gpu(name) else None
    return result


def parse_input_size(text: str) -> tuple[int, int, int]:
    try:
        c, h, w = (int(v) for v in text.split(","))
    except ValueError:
        raise RecipeError(f"--input-size: expected C,H,W such as 3,224,224, got '{text}'") from None
    return c, h, w


def model_from_recipe(recipe_model: Component, data: DatasetSplits) -> tuple[nn.Module, tuple[int, int, int]]:
    from dlrecipes import registry
    from dlrecipes.builders import model_params
    from dlrecipes.registry import build_component

    if data.io is not None:
        raise RecipeError("task: profile feeds the model one image tensor; multi-input recipes are not profiled yet")
    params = model_params(recipe_model, data)
    return build_component(registry.models, recipe_model.name, params, "model.name"), tuple(data.input_shape)


def format_table(result: dict[str, Any], title: str | None = None) -> str:
    rows = [
        ("input", "x".join(str(s) for s in result["input_size"])),
        ("parameters", f"{result['parameters']:,} ({result['parameters_millions']:.2f} M)"),
        ("size", f"{result['size_mb']:.1f} MB"),
        ("MACs", f"{result['gmacs']:.3f} G"),
        ("FLOPs", f"{result['gflops']:.3f} G"),
    ]
    for key, lat in result["latency"].items():
        rows.append(
            (f"latency {key.replace('_', ' ')}", f"median {lat['median_ms']:.2f} ms, p90 {lat['p90_ms']:.2f} ms")
        )
    if result.get("peak_memory_mb") is not None:
        rows.append((f"peak memory (batch {result['batch']})", f"{result['peak_memory_mb']:.0f} MB"))
    width = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines)
