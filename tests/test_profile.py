"""Model profiling: counts match the published figures; CLI table and JSON."""

from __future__ import annotations

import json

import pytest

from dlrecipes.tools.model_cost import count_flops, profile_model, resolve_model

from .conftest import REPO, run_cli

# Published: torchvision/timm ResNet-18 11.69 M parameters and 1.82 GMACs, ResNet-50 25.56 M and 4.1 GMACs at 224 px.
PUBLISHED = {"resnet18": (11.69e6, 1.82e9), "resnet50": (25.56e6, 4.11e9)}


@pytest.mark.parametrize("family", ["timm", "torchvision"])
@pytest.mark.parametrize("arch", sorted(PUBLISHED))
def test_counts_match_published_figures(family, arch):
    import torch

    model = resolve_model(f"{family}/{arch}", {}, (3, 224, 224)).eval()
    params, macs = PUBLISHED[arch]
    assert abs(sum(p.numel() for p in model.parameters()) - params) / params < 0.01
    assert abs(count_flops(model, torch.randn(1, 3, 224, 224)) / 2 - macs) / macs < 0.03


# Published (DeiT paper, table 1; timm's model cards): DeiT-Ti 5.72 M parameters and 1.26 GMACs, DeiT-S 22.05 M
# and 4.6 GMACs at 224 px. Their attention runs fused (scaled_dot_product_attention): without counting its
# two matmuls a counter reads 14% and 8% low.
PUBLISHED_VIT = {"deit_tiny_patch16_224": (5.72e6, 1.26e9), "deit_small_patch16_224": (22.05e6, 4.6e9)}


@pytest.mark.parametrize("arch", sorted(PUBLISHED_VIT))
def test_fused_attention_is_counted(arch):
    import torch

    model = resolve_model(f"timm/{arch}", {}, (3, 224, 224)).eval()
    assert any(getattr(m, "fused_attn", False) for m in model.modules())  # timm calls the fused kernel
    params, macs = PUBLISHED_VIT[arch]
    assert abs(sum(p.numel() for p in model.parameters()) - params) / params < 0.01
    assert abs(count_flops(model, torch.randn(1, 3, 224, 224)) / 2 - macs) / macs < 0.02


def test_fused_attention_backward_is_counted():
    import torch
    from torch.nn.functional import scaled_dot_product_attention
    from torch.utils.flop_counter import FlopCounterMode

    from dlrecipes.tools.model_cost import attention_flop_formulas

    q = torch.randn(2, 3, 50, 16, requires_grad=True)
    counter = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
    with counter:
        scaled_dot_product_attention(q, q, q).sum().backward()
    forward = 2 * (2 * 3 * 50 * 50 * 16) * 2  # two matmuls, 2 FLOPs per multiply-accumulate
    assert counter.get_total_flops() >= 3 * forward  # the backward costs about twice the forward


def test_profile_reports_latency_and_size_for_a_small_model():
    model = resolve_model("cifar_resnet18", {"num_classes": 10}, (3, 32, 32))
    result = profile_model(model, (3, 32, 32), batch=4, device="cpu", warmup=1, repeats=3)
    assert abs(result["parameters"] - 11.17e6) / 11.17e6 < 0.01
    assert result["size_mb"] == pytest.approx(result["parameters"] * 4 / 2**20, rel=0.01)  # fp32 weights + BN buffers
    for key in ("batch_1", "batch_4"):
        assert 0 < result["latency"][key]["median_ms"] <= result["latency"][key]["p90_ms"]
    assert result["peak_memory_mb"] is None and result["device"] == "cpu"  # CPU: no GPU memory to report


def test_cli_profile_by_model_and_by_recipe():
    out = run_cli("profile", "--model", "timm/resnet18", "--batch", "2", "--repeats", "2", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["parameters"] == 11_689_512 and result["model"] == "timm/resnet18"
    table = run_cli("profile", str(REPO / "recipes" / "quickstart.yaml"), "--batch", "4", "--repeats", "2")
    assert table.returncode == 0 and "input            1x28x28" in table.stdout and "MACs" in table.stdout
    bad = run_cli("profile", "--model", "resnet5000")
    assert bad.returncode == 2 and "unknown model 'resnet5000'" in bad.stderr and "Traceback" not in bad.stderr


def test_profile_speaks_the_recipes_device_words():
    """``--device`` takes auto, cpu or gpu, as ``trainer.device`` does (default auto); any other word (torch's
    ``cuda`` included) is refused in one line that names the valid ones."""
    import torch

    auto = run_cli(
        "profile",
        "--model",
        "cifar_resnet18",
        "--input-size",
        "3,32,32",
        "--batch",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--json",
    )
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["device"] == ("gpu" if torch.cuda.is_available() else "cpu")
    for word in ("cuda", "GPU"):
        bad = run_cli("profile", "--model", "cifar_resnet18", "--device", word)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        line = bad.stderr.strip()
        assert "\n" not in line and f"--device: expected one of auto, cpu, gpu, got '{word}'" in line, line
