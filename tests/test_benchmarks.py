"""The benchmark scripts run end to end at tiny sizes (their timings are never asserted)."""

from __future__ import annotations

import json
import sys

import pytest

from .conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def _script(name, *args, tmp_path, new_python=False):
    """``python benchmarks/NAME ARGS --json OUT`` to its end: OUT's JSON. Forked from the server that has imported
    torch and Composer once (tests/forked.py), as ``python SCRIPT`` runs it (its folder first on sys.path); in a
    new Python with ``new_python`` (a script whose own processes are the point)."""
    from . import forked

    out = tmp_path / "out.json"
    script = str(REPO / "benchmarks" / name)
    if new_python:
        result = run_cli(sys.executable, script, *args, "--json", str(out), module=False, timeout=600)
    else:
        result = forked.run([*args, "--json", str(out)], REPO, timeout=600, module=script)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_bench_command_compares_both_loops(tiny_recipe):
    result = run_cli("bench", str(tiny_recipe), "--steps", "2", "--rounds", "2", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["plain_img_s"] > 0 and data["dlrecipes_img_s"] > 0 and len(data["ratios"]) == 2
    assert isinstance(data["overhead_ms_per_step"], float)


def test_gpu_suite_smoke_run_on_cpu(tmp_path):
    """The GPU suite's every section at tiny sizes on the CPU: it runs and fills its table. Its precision section
    is precision.py at batch 8 for 2 steps on the CPU (what test_precision_script_on_cpu ran, merged here)."""
    data = _script("gpu_suite.py", "--tiny", "--device", "cpu", "--data-dir", str(tmp_path / "images"), tmp_path=tmp_path)
    assert data["meta"]["tiny"] and data["meta"]["composer"] == "0.32.1"
    assert [r["model"] for r in data["overhead"]] == ["cifar_resnet18"] and data["overhead"][0]["ratio"] > 0
    flagship = data["flagship"]
    assert len(flagship["loader_epochs"]) == 3 and flagship["model_img_s"] > 0
    assert len(flagship["end_to_end"]["epochs"]) == 3 and flagship["next_run_first"] > 0
    assert flagship["numba_tracebacks"] == 0
    assert [r["config"] for r in data["precision"]] == ["fp32", "fp32 + accumulation (microbatch 2)"]
    assert all(r["peak_memory_mb"] > 0 and r["train_loss"] > 0 for r in data["precision"])
    assert [r["algorithm"] for r in data["augment"]] == ["batch_randaugment", "batch_trivialaugment", "batch_augmix",
                                                          "batch_color_jitter", "batch_random_erasing"]
    assert all(r["img_s"] > 0 for r in data["augment"])


def test_gpu_check_smoke_run_on_cpu(tmp_path):
    """The engine's correctness matrix (gpu_suite.py --check) on the CPU: the cases that can run here
    pass (ours against Composer's Trainer in fp32 with accumulation, the two-process cases on gloo),
    the rest say why they are skipped."""
    rows = _script("gpu_suite.py", "--check", "--device", "cpu", tmp_path=tmp_path)
    results = {r["case"]: r["result"] for r in rows}
    assert results["same as Composer: fp32, accumulation"] == "pass"
    assert results["2 ranks: DDP with uneven loaders"] == results["2 ranks: SIGTERM stop, then --resume"] == "pass"
    assert results["no sync in steps 3-20: cifar10_fast"] == "skip" and "needs CUDA" in str(rows)
    assert set(results.values()) == {"pass", "skip"} and len(rows) == 13


def test_sweep_start_script_gives_the_same_results_forked_and_in_new_pythons(tmp_path):
    data = _script("sweep_start.py", "--points", "2", "--batches", "1", tmp_path=tmp_path, new_python=True)
    assert [r["mode"] for r in data["rows"]] == ["forked", "new Python"] and data["same_results"]
    assert len(data["rows"][0]["results"]) == 2 and all(r["seconds"] > 0 for r in data["rows"])


def test_trainer_overhead_script(tmp_path, tiny_recipe):
    rows = _script("trainer_overhead.py", "--case", str(tiny_recipe), "--steps", "2", "--rounds", "1", "--warmup", "1",
                   tmp_path=tmp_path)
    assert rows[0]["ratio"] > 0


def test_gpu_throughput_script_on_cpu(tmp_path):
    data = _script("gpu_throughput.py", "--device", "cpu", "--models", "resnet18_cifar", "--precisions", "fp32",
                   "--channels-last", "off,on", "--compile", "off", "--batch", "4", "--steps", "1", "--warmup", "1",
                   tmp_path=tmp_path)
    assert [r["channels_last"] for r in data["rows"]] == ["off", "on"] and all(r["img_s"] > 0 for r in data["rows"])


def test_data_loading_script(tmp_path):
    data = _script("data_loading.py", "--images", "24", "--classes", "3", "--batch", "4", "--workers", "1",
                   "--epochs", "2", "--crop", "32", "--max-resolution", "48", "--cache-size", "40",
                   "--data-dir", str(tmp_path / "imgs"), "--loaders", "torchvision,tensor_cache",
                   "--augment", "none,rand-m9-mstd0.5-inc1", tmp_path=tmp_path)
    strong = "+rand-m9-mstd0.5-inc1"  # each loader with the batch RandAugment, and the PIL path with timm's
    assert set(data["results"]) == {"torchvision", "tensor_cache", "torchvision" + strong, "tensor_cache" + strong,
                                    "torchvision_pil" + strong}
    assert all(r["steady"] > 0 for r in data["results"].values())


def test_checkpoint_save_script():
    from . import forked

    out = forked.run(["--model", "resnet18", "--rounds", "2"], REPO, module=str(REPO / "benchmarks" / "checkpoint_save.py"))
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| plain") or line.startswith("| atomic")]
    assert len(rows) == 2 and all(float(r.split("|")[2]) > 0 for r in rows)
    assert "atomic / plain:" in out.stdout


def test_framework_overhead_script_compares_composers_step_with_ours(tmp_path):
    rows = _script("framework_overhead.py", "--models", "cnn_simple", "--steps", "2", "--rounds", "1", "--warmup", "1",
                   "--repeats", "1", tmp_path=tmp_path)
    assert [r["trainer"] for r in rows] == ["Composer's step", "dlrecipes (this checkout)"]
    assert all(len(r["ratios"]) == 1 and r["ratios"][0] > 0 for r in rows)


def test_distillation_script(tmp_path):
    data = _script("distillation.py", "--seeds", "0", "--epochs", "1", "--teacher-epochs", "1", "--kinds", "hard",
                   tmp_path=tmp_path)
    assert set(data["top1"]) == {"teacher (cnn_simple width 32)", "student alone", "student distilled (hard)"}
    assert all(0 <= accs[0] <= 1 for accs in data["top1"].values())
