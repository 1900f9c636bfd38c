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

import pytest

from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from dlrecipes.records.resume_check import MODEL_CHANGING_ALGORITHMS, check_resume
from dlrecipes.records.run_lock import LOCK_FILE, RunLockedError, acquire
from dlrecipes.train import train

from .conftest import REPO, run_cli


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    lock = acquire(tmp_path)
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(RunLockedError, match=rf"is in use by another training run \(host {socket.gethostname()}, "
                                             rf"pid {os.getpid()}, started "):
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
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                   "process_start": 1, "started": "long ago"}))
    acquire(tmp_path).release()


def test_a_holder_on_another_host_is_named_with_the_file_to_delete(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "node-17", "pid": 4242, "started": "2026-11-23 10:00:00"}))
    with pytest.raises(RunLockedError, match=f"host node-17, pid 4242.*on another host; if that run is dead, delete {tmp_path / LOCK_FILE}"):
        acquire(tmp_path)


@pytest.mark.slow
def test_two_runs_started_together_one_is_refused_at_once(tiny_recipe, tmp_path):
    """The start-up window: both launched at the same moment into one run directory."""
    cmd = [sys.executable, "-m", "dlrecipes", "train", str(tiny_recipe), "run_name=twin", "trainer.max_duration=3ep"]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert refused.strip().count("\n") == 0 and "is in use by another training run" in refused and "Traceback" not in refused
    assert not (tmp_path / "runs" / "twin" / LOCK_FILE).exists()  # released by the run that finished


def test_resume_refuses_changes_the_run_cannot_continue_with(tiny_recipe, tmp_path):
    train(resolve(tiny_recipe, ["run_name=r", "trainer.max_duration=1ep"]))
    run_dir = tmp_path / "runs" / "r"
    changed = resolve(tiny_recipe, ["run_name=r", "model={name: mnist_cnn}", "optimizer={name: adamw, lr: 0.001}"])
    with pytest.raises(RecipeError, match=r"--resume: .* cannot continue it: model.hidden \(16 -> \(none\)\); "
                                          r"model.name \('cnn_simple' -> 'mnist_cnn'\).*optimizer.name \('sgd' -> 'adamw'\)"):
        check_resume(run_dir, changed.to_dict())
    accepted = check_resume(run_dir, resolve(tiny_recipe, ["run_name=r", "trainer.max_duration=3ep",
                                                           "trainer.num_workers=1"]).to_dict())
    assert accepted == ["trainer.max_duration ('1ep' -> '3ep')", "trainer.num_workers (0 -> 1)"]


def test_resume_with_a_changed_model_is_one_line_and_exit_2(tiny_recipe, tmp_path):
    first = run_cli("train", str(tiny_recipe), "run_name=m", "trainer.max_duration=1ep")
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli("train", str(tiny_recipe), "run_name=m", "model={name: mnist_cnn}", "--resume")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.strip().count("\n") == 0 and "model.name ('cnn_simple' -> 'mnist_cnn')" in again.stderr
    longer = run_cli("train", str(tiny_recipe), "run_name=m", "trainer.max_duration=2ep", "--resume")
    assert longer.returncode == 0 and "with changed settings: trainer.max_duration ('1ep' -> '2ep')" in longer.stderr


def test_every_model_changing_algorithm_is_registered():
    from dlrecipes.registry import algorithms

    assert set(MODEL_CHANGING_ALGORITHMS) <= set(algorithms.names())


def test_history_after_a_resume_inside_an_epoch_counts_from_the_resume(tiny_recipe, tmp_path):
    """The first run stops inside epoch 1 (batch 2 of 3); the resumed one trains batch 3 of it."""
    train(resolve(tiny_recipe, ["run_name=h", "trainer.max_duration=2ba", "checkpoint.save_interval=1ba"]))
    start = time.perf_counter()
    train(resolve(tiny_recipe, ["run_name=h", "trainer.max_duration=2ep", "checkpoint.save_interval=1ba"]), resume=True)
    wall = time.perf_counter() - start
    with open(tmp_path / "runs" / "h" / "history.csv") as f:
        rows = list(csv.DictReader(f))
    resumed = [r for r in rows if int(r["step"]) == 3]
    assert len(resumed) == 1
    # one batch of 64 samples trained in this process: at least 64 / (this whole call's wall time) images/s
    assert float(resumed[0]["images_per_sec"]) >= 64 / wall


def test_a_run_that_fails_before_training_leaves_no_run_directory(tiny_recipe, tmp_path):
    offline = run_cli("train", str(tiny_recipe), "run_name=offline",
                      f"dataset={{name: cifar10, root: {tmp_path}/cifar, download: false}}")
    assert offline.returncode == 2 and f"dataset.root: {tmp_path}/cifar does not exist" in offline.stderr
    assert not (tmp_path / "runs" / "offline").exists() and not (tmp_path / "cifar").exists()
    invalid = run_cli("train", str(tiny_recipe), "run_name=invalid", "trainer.bogus=1")
    assert invalid.returncode == 2 and not (tmp_path / "runs" / "invalid").exists()
