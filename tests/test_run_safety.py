"""Runs that cannot clobber or confuse each other: the run lock, checked resumes, history rows
after a resume that starts inside an epoch."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from dlrecipes.records.layout import LOCK_FILE
from dlrecipes.records.resume_check import check_resume, fixed_on_resume
from dlrecipes.records.run_lock import RunLockedError, acquire
from tests.conftest import fit

from .conftest import REPO, run_cli


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    lock = acquire(tmp_path)
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(
        RunLockedError,
        match=rf"is in use by another training run \(host {socket.gethostname()}, "
        rf"pid {os.getpid()}, started ",
    ):
        acquire(tmp_path)
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    acquire(tmp_path).release()


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_warning(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "then"}))
    lock = acquire(tmp_path)
    warning = capsys.readouterr().err
    assert "no longer exists" in warning and f"pid {dead.pid}" in warning and "taking it over" in warning
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    """The pid exists (it is ours) but started after the lock was written: a different process."""
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "process_start": 1, "started": "long ago"})
    )
    acquire(tmp_path).release()


def test_a_holder_on_another_host_is_named_with_the_file_to_delete(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "node-17", "pid": 4242, "started": "2026-11-23 10:00:00"}))
    with pytest.raises(
        RunLockedError,
        match=f"host node-17, pid 4242.*on another host; if that run is dead, delete {tmp_path / LOCK_FILE}",
    ):
        acquire(tmp_path)


@pytest.mark.slow
def test_two_runs_started_together_one_is_refused_at_once(tiny_recipe, tmp_path):
    """The start-up window: both launched at the same moment into one run directory."""
    from tests import forked

    args = ["train", str(tiny_recipe), "run_name=twin", "trainer.max_duration=3ep"]
    errs = [tmp_path / f"err{i}.txt" for i in range(2)]
    procs = [forked.start(args, REPO, tmp_path / f"out{i}.txt", err) for i, err in enumerate(errs)]  # two processes
    for p in procs:
        p.wait(300)
    results = [(p.returncode, err.read_text()) for p, err in zip(procs, errs)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert (
        refused.strip().count("\n") == 0
        and "is in use by another training run" in refused
        and "Traceback" not in refused
    )
    assert not (tmp_path / "runs" / "twin" / LOCK_FILE).exists()  # released by the run that finished


@pytest.mark.slow
def test_resume_refuses_changes_the_run_cannot_continue_with(tiny_recipe, tmp_path):
    fit(resolve(tiny_recipe, ["run_name=r", "trainer.max_duration=1ep"]))
    run_dir = tmp_path / "runs" / "r"
    changed = resolve(tiny_recipe, ["run_name=r", "model={name: mnist_cnn}", "optimizer={name: adamw, lr: 0.001}"])
    with pytest.raises(
        RecipeError,
        match=r"--resume: .* cannot continue it: model.hidden \(16 -> \(none\)\); "
        r"model.name \('cnn_simple' -> 'mnist_cnn'\).*optimizer.name \('sgd' -> 'adamw'\)",
    ):
        check_resume(run_dir, changed.to_dict())
    accepted = check_resume(
        run_dir, resolve(tiny_recipe, ["run_name=r", "trainer.max_duration=3ep", "trainer.num_workers=1"]).to_dict()
    )
    assert accepted == ["trainer.max_duration ('1ep' -> '3ep')", "trainer.num_workers (0 -> 1)"]


@pytest.mark.slow
def test_resume_with_a_changed_model_is_one_line_and_exit_2(tiny_recipe, tmp_path):
    first = run_cli("train", str(tiny_recipe), "run_name=m", "trainer.max_duration=1ep")
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli("train", str(tiny_recipe), "run_name=m", "model={name: mnist_cnn}", "--resume")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.strip().count("\n") == 0 and "model.name ('cnn_simple' -> 'mnist_cnn')" in again.stderr
    longer = run_cli("train", str(tiny_recipe), "run_name=m", "trainer.max_duration=2ep", "--resume")
    assert longer.returncode == 0 and "with changed settings: trainer.max_duration ('1ep' -> '2ep')" in longer.stderr


def test_a_recipe_recorded_without_the_default_lr_resumes_unchanged(tiny_recipe, tmp_path):
    """Validation fills the optimizer's default lr in; a run recorded before it did left it out and trained with that
    default: resuming it is no change (another lr still is one)."""
    import yaml

    from dlrecipes.records.layout import RunDir

    config = resolve(tiny_recipe, ["run_name=old", "~optimizer.lr"])
    assert config.optimizer.params["lr"] == 0.1  # sgd's default, filled in
    recorded = config.to_dict()
    del recorded["optimizer"]["lr"]
    run = RunDir(tmp_path / "runs" / "old")
    run.path.mkdir(parents=True)
    run.recipe.write_text(yaml.safe_dump(recorded, sort_keys=False))
    assert check_resume(run.path, config.to_dict()) == []
    assert check_resume(run.path, resolve(tiny_recipe, ["run_name=old", "optimizer.lr=0.2"]).to_dict()) == [
        "optimizer.lr ((none) -> 0.2)"
    ]


def test_the_algorithms_a_resume_cannot_change_are_those_registered_as_changing_the_network_or_checkpoint():
    """The set the hand-kept list held before the fact was registered with each algorithm (issue 37)."""
    from dlrecipes.registry import algorithms

    fixed = {name for name in algorithms.names() if fixed_on_resume(name)}
    assert fixed == {
        "blurpool",
        "squeeze_excite",
        "stochastic_depth",
        "ghost_batchnorm",
        "weight_standardization",
        "gradient_checkpointing",
        "qat",
        "ema",
        "swa",
        "sam",
    }
    assert not fixed_on_resume("a_plugin_not_loaded")  # as before: its facts cannot be read


def _rows(run_dir) -> list[dict]:
    with open(run_dir / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_history_after_a_resume_inside_an_epoch_covers_the_whole_epoch(tiny_recipe, tmp_path):
    """The first run stops inside epoch 1 (batch 2 of 3); the resumed one trains batch 3 of it. The row of epoch 1
    is that of an uninterrupted run: the mean loss of its 3 batches (the checkpoint carries the first two)."""
    deterministic = ["trainer.deterministic=true", "trainer.max_duration=2ep", "checkpoint.save_interval=1ba"]
    fit(resolve(tiny_recipe, ["run_name=whole", *deterministic]))
    start = time.perf_counter()
    fit(resolve(tiny_recipe, ["run_name=h", *deterministic, "trainer.max_duration=2ba"]))
    fit(resolve(tiny_recipe, ["run_name=h", *deterministic]), resume=True)
    wall = time.perf_counter() - start
    whole, resumed = _rows(tmp_path / "runs" / "whole"), _rows(tmp_path / "runs" / "h")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole] == ["3", "6"]
    for mine, theirs in zip(resumed, whole):
        assert float(mine["train_loss"]) == pytest.approx(float(theirs["train_loss"]), rel=1e-6)
        assert float(mine["eval_top1"]) == pytest.approx(float(theirs["eval_top1"]))
    # the 3 batches of 64 samples, over the training time of both parts: at least 192 / (both calls' wall time)
    assert float(resumed[0]["images_per_sec"]) >= 192 / wall


@pytest.mark.slow
@pytest.mark.parametrize("batch", [5, 6], ids=["inside-an-epoch", "after-its-last-batch"])
def test_a_signal_stop_leaves_each_epoch_once_after_the_resume(tiny_recipe, tmp_path, batch):
    """The stop writes no row for the unfinished epoch: the resume finishes it and writes it once, also when the
    signal came after the epoch's last batch, before its evaluation (the resume then trains no batch of it)."""
    args = ["run_name=cut", "trainer.max_duration=3ep", "checkpoint.save_interval=1ep"]
    stopped = run_cli(
        "train",
        str(tiny_recipe),
        *args,
        "--plugin",
        str(REPO / "tests" / "fault_injection.py"),
        f"callbacks.fault_injection={{signal_at_batch: {batch}}}",
    )  # epoch 2 has batches 4-6
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    assert [r["epoch"] for r in _rows(tmp_path / "runs" / "cut")] == ["1"]  # no row for the epoch cut short
    resumed = run_cli("train", str(tiny_recipe), *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = _rows(tmp_path / "runs" / "cut")
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert all(float(r["train_loss"]) > 0 and float(r["images_per_sec"]) > 0 for r in rows)


def test_a_run_that_fails_before_training_leaves_no_run_directory(tiny_recipe, tmp_path):
    offline = run_cli(
        "train",
        str(tiny_recipe),
        "run_name=offline",
        f"dataset={{name: cifar10, root: {tmp_path}/cifar, download: false}}",
    )
    assert offline.returncode == 2 and f"dataset.root: {tmp_path}/cifar does not exist" in offline.stderr
    assert not (tmp_path / "runs" / "offline").exists() and not (tmp_path / "cifar").exists()
    invalid = run_cli("train", str(tiny_recipe), "run_name=invalid", "trainer.bogus=1")
    assert invalid.returncode == 2 and not (tmp_path / "runs" / "invalid").exists()


# --- failures that are honest (issue 25) -------------------------------------------------------------

FAILING_PLUGIN = '''
from dlrecipes.registry import callbacks


@callbacks.register("fail_at_batch")
def fail_at_batch(batch: int = 2):
    """Test helper: raise an unexpected exception after batch `batch`."""
    from composer.core import Callback

    class Fail(Callback):
        def batch_end(self, state, logger):
            if int(state.timestamp.batch) == batch:
                raise RuntimeError("something broke inside training\\nsecond line")

    return Fail()
'''


@pytest.mark.slow
def test_a_diverging_run_stops_with_one_line_and_exit_3(tiny_recipe, tmp_path):
    runs = tmp_path / "runs"
    early = run_cli("train", str(tiny_recipe), "optimizer.lr=1e12", "trainer.log_interval=1")
    assert early.returncode == 3 and early.stderr.strip().splitlines()[-1].startswith(
        "error: training diverged: the loss is nan by batch 2 (epoch 1); try a lower learning rate "
        "(optimizer.lr is 1e+12; try 1e+11)"
    ), early.stderr[-2000:]
    assert not runs.exists() or not list(runs.iterdir())  # no checkpoint yet: no run directory left
    kept = run_cli(
        "train",
        str(tiny_recipe),
        "optimizer.lr=1e12",
        "run_name=hot",
        "checkpoint.save_interval=1ba",
        "trainer.log_interval=2",
    )
    assert kept.returncode == 3 and "Traceback" not in kept.stderr
    summary = json.loads((runs / "hot" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["reason"].startswith("training diverged")
    assert not (runs / "hot" / "checkpoints" / "best.pt").exists()
    again = run_cli("train", str(tiny_recipe), "run_name=hot", "trainer.max_duration=1ep")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"warning: {runs / 'hot'} held a run that diverged; it was moved to {runs}/hot.diverged-" in again.stderr
    assert json.loads((runs / "hot" / "summary.json").read_text())["status"] == "finished"
    assert len(list(runs.glob("hot.diverged-*"))) == 1


@pytest.mark.slow
def test_an_unexpected_exception_is_one_line_with_the_traceback_in_the_run_log(tiny_recipe, tmp_path):
    (tmp_path / "fail_plugin.py").write_text(FAILING_PLUGIN)
    args = (
        "train",
        str(tiny_recipe),
        "imports=[./fail_plugin.py]",
        "callbacks.fail_at_batch={batch: 4}",
        "checkpoint.save_interval=1ba",
    )
    result = run_cli(*args, "run_name=broken")
    log = tmp_path / "runs" / "broken" / "train-rank0.log"
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: training failed: RuntimeError: something broke inside training (run directory "
        f"{tmp_path / 'runs' / 'broken'}; its traceback is in {log})"
    )
    assert "Traceback (most recent call last)" in log.read_text() and "something broke" in log.read_text()
    assert json.loads((tmp_path / "runs" / "broken" / "summary.json").read_text())["status"] == "failed"
    verbose = run_cli(*args, "run_name=loud", "--verbose")
    assert verbose.returncode == 1 and "Traceback (most recent call last)" in verbose.stderr
    before = run_cli(*args[:-1], "callbacks.fail_at_batch={batch: 1}", "run_name=soon")
    assert (
        before.returncode == 1
        and "no run directory was kept (no checkpoint yet); rerun with --verbose" in before.stderr
        and not (tmp_path / "runs" / "soon").exists()
    )


def test_default_run_names_are_unique_within_a_second(tiny_recipe, tmp_path, monkeypatch):
    from dlrecipes.records.run_dir import choose_run_name

    config = resolve(tiny_recipe)
    monkeypatch.setattr(time, "strftime", lambda fmt, *t: "20260102-030405")  # all three start in the same second
    names = [choose_run_name(config, resume=False, device="cpu", runs=Path(config.runs_dir)) for _ in range(3)]
    assert names == ["tiny-20260102-030405", "tiny-20260102-030405-2", "tiny-20260102-030405-3"]
    assert all((tmp_path / "runs" / n).is_dir() for n in names)


@pytest.mark.slow
def test_keep_holds_across_resumes(tiny_recipe, tmp_path):
    common = ["run_name=kept", "checkpoint.keep=2", "checkpoint.save_interval=1ep", "checkpoint.monitor=null"]
    for epochs, resume in ((2, False), (3, True), (4, True)):
        config = resolve(tiny_recipe, [*common, f"trainer.max_duration={epochs}ep"])
        fit(config, resume=resume)
    periodic = sorted(p.name for p in (tmp_path / "runs" / "kept" / "checkpoints").glob("ep*-ba*-rank0.pt"))
    assert periodic == ["ep3-ba9-rank0.pt", "ep4-ba12-rank0.pt"]
