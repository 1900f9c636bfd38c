"""Crash safety: kill -9 at chosen points, resume, and end with the weights of an uninterrupted run.

Each scenario trains the same deterministic recipe (3 epochs of 4 batches, a checkpoint
every 2 batches) in a subprocess that ``tests/fault_injection.py`` kills with SIGKILL,
then reruns the same command with ``--resume`` until it finishes.
"""

from __future__ import annotations

import math
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, TINY_RECIPE, run_cli, write

PLUGIN = str(REPO / "tests" / "fault_injection.py")


@pytest.fixture(scope="module")
def crash_recipe(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("crash")
    path = write(root / "crash.yaml", TINY_RECIPE)
    path.write_text(
        path.read_text()
        .replace("max_duration: 2ep", "max_duration: 3ep")
        .replace("train_subset_num_batches: 3", "train_subset_num_batches: 4")
        .replace("save_interval: 1ep", "save_interval: 2ba")
        + f"runs_dir: {root / 'runs'}\n"
        + "callbacks: {fault_injection: {}}\n"
    )
    path.write_text(path.read_text().replace("  device: cpu\n", "  device: cpu\n  deterministic: true\n"))
    return path


def _train(recipe: Path, run: str, *extra: str):
    return run_cli("train", str(recipe), f"run_name={run}", "--plugin", PLUGIN, *extra)


def _batch(path: Path) -> int:
    """The batch a checkpoint (or the file ``latest`` points at) was saved after."""
    return int(re.search(r"-ba(\d+)-", path.resolve().name).group(1))


def _final_weights(recipe: Path, run: str) -> dict:
    latest = recipe.parent / "runs" / run / "checkpoints" / "latest-rank0.pt"
    assert _batch(latest) == 12  # the whole run: 3 epochs of 4 batches
    return torch.load(latest, map_location="cpu", weights_only=False)["state"]["model"]


@pytest.fixture(scope="module")
def reference(crash_recipe) -> dict:
    result = _train(crash_recipe, "reference")
    assert result.returncode == 0, result.stderr[-2000:]
    return _final_weights(crash_recipe, "reference")


SCENARIOS = {
    "mid_interval": ["callbacks.fault_injection.kill_at_batch=5"],
    "before_first_checkpoint": ["callbacks.fault_injection.kill_at_batch=1"],
    "during_save": ["callbacks.fault_injection.kill_in_save=3"],
    "between_save_and_link": ["callbacks.fault_injection.kill_before_link=4"],
    "twice": ["callbacks.fault_injection.kill_at_batch=3", "callbacks.fault_injection.kill_at_batch=9"],
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_killed_runs_resume_to_the_weights_of_an_uninterrupted_run(crash_recipe, reference, scenario):
    run = f"killed-{scenario}"
    checkpoints = crash_recipe.parent / "runs" / run / "checkpoints"
    for i, fault in enumerate(SCENARIOS[scenario]):
        killed = _train(crash_recipe, run, fault, *(["--resume"] if i else []))
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    if scenario == "during_save":
        assert [p.name for p in checkpoints.glob("*-partial")] == ["ep1-ba6-rank0.pt-partial"]
        assert _batch(checkpoints / "latest-rank0.pt") == 4
    if scenario == "between_save_and_link":
        assert (checkpoints / "ep1-ba8-rank0.pt").exists()
        assert _batch(checkpoints / "latest-rank0.pt") == 6
    resumed = _train(crash_recipe, run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not list(checkpoints.glob("*-partial"))
    weights = _final_weights(crash_recipe, run)
    assert weights.keys() == reference.keys()
    different = [k for k in reference if not torch.equal(weights[k], reference[k])]
    assert not different, f"weights differ from the uninterrupted run: {different}"


@pytest.mark.slow
def test_a_failed_save_keeps_the_previous_checkpoint_and_says_why(crash_recipe):
    result = _train(crash_recipe, "disk-full", "callbacks.fault_injection.fail_save=2")
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert "ep0-ba4-rank0.pt failed (No space left on device)" in message
    assert "the previous checkpoint" in message and "ep0-ba2-rank0.pt is intact" in message and "--resume" in message
    assert "Traceback" not in result.stderr
    checkpoints = crash_recipe.parent / "runs" / "disk-full" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("ep*")) == ["ep0-ba2-rank0.pt"]
    assert _batch(checkpoints / "latest-rank0.pt") == 2


def _saved_batch(checkpoints: Path) -> int:
    """The batch of the run's latest checkpoint; 0 before there is one."""
    try:
        return _batch(checkpoints / "latest-rank0.pt")
    except (OSError, AttributeError):  # no link yet, or one being replaced
        return 0


@pytest.mark.slow
def test_killed_at_random_moments_still_ends_with_the_same_weights(crash_recipe, reference, monkeypatch):
    """SIGKILL at random moments, then resume, as a requeued job does: --resume after the first start, which a
    kill may stop before it made the run's directory (--resume would then refuse a run that is not there, unless
    told to start it).  The first start is killed after a random delay (import, build, training or saving:
    wherever it lands); each restart once it has trained and saved (a checkpoint past the one it resumed from),
    then after a random delay shorter than two batches (every batch takes 0.4 s at least), so that it is killed
    while training or saving and the run still has batches left for the next."""
    import random
    import time

    from tests import forked

    monkeypatch.setenv("DLRECIPES_RESUME_MISSING", "start")
    rng = random.Random(7)
    checkpoints = crash_recipe.parent / "runs" / "random-kills" / "checkpoints"
    args = [
        "train",
        str(crash_recipe),
        "run_name=random-kills",
        "--plugin",
        PLUGIN,
        "callbacks.slow_batches={seconds: 0.4}",
    ]
    kills = []  # per start: (the batch it resumed from, whether it had trained and saved when killed)
    for attempt in range(3):
        resumed_from = _saved_batch(checkpoints)
        # a process of its own (forked from one that imported everything: the random delay falls in the build or
        # training, not in 5-10 s of imports)
        process = forked.start(
            [*args, *(["--resume"] if attempt else [])],
            REPO,
            crash_recipe.parent / "out.txt",
            crash_recipe.parent / "err.txt",
        )
        launched = time.monotonic()
        deadline = launched + rng.uniform(0.5, 6.0) if attempt == 0 else math.inf
        trained = False
        while time.monotonic() < deadline:
            assert process.poll() is None, f"start {attempt} ended (exit {process.returncode}) before its kill"
            assert time.monotonic() - launched < 300, f"start {attempt} saved no checkpoint in 300 s"
            if _saved_batch(checkpoints) > resumed_from:
                trained = True
                time.sleep(rng.uniform(0.0, 0.6))
                break
            time.sleep(0.05)
        process.kill()
        assert process.wait() == -signal.SIGKILL, f"start {attempt} had ended (exit {process.returncode})"
        kills.append((resumed_from, trained))
    assert sum(trained for _, trained in kills) >= 2, kills  # the restarts were killed while training
    assert 0 < _saved_batch(checkpoints) < 12, kills  # some of the run saved, some of it left to do
    resumed = _train(crash_recipe, "random-kills", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    weights = _final_weights(crash_recipe, "random-kills")
    assert all(torch.equal(weights[k], reference[k]) for k in reference)
    again = _train(crash_recipe, "random-kills", "--resume")  # a finished run: nothing more is trained, no error
    assert again.returncode == 0, again.stderr[-2000:]
    weights = _final_weights(crash_recipe, "random-kills")
    assert all(torch.equal(weights[k], reference[k]) for k in reference)


@pytest.mark.slow
def test_resuming_a_finished_run_trains_nothing_and_says_so(crash_recipe):
    done = _train(crash_recipe, "finished", "checkpoint.save_interval=1ep")
    assert done.returncode == 0, done.stderr[-2000:]
    again = _train(crash_recipe, "finished", "checkpoint.save_interval=1ep", "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "finished already finished (12 batches); nothing to resume" in again.stderr
    assert "Traceback" not in again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP"])
def test_a_signal_saves_at_the_next_batch_and_resume_ends_identically(crash_recipe, reference, name):
    """Batch 5 is not a save point (every 2 batches): the signal writes its own checkpoint, the run is recorded
    as stopped and its lock released.  SIGHUP (a closed terminal or ssh session) is one of them."""
    import json

    run = f"signalled-{name}"
    stopped = _train(
        crash_recipe,
        run,
        "callbacks.fault_injection.signal_at_batch=5",
        f"callbacks.fault_injection.signal_name={name}",
    )
    run_dir = crash_recipe.parent / "runs" / run
    checkpoint = run_dir / "checkpoints" / "ep1-ba5-rank0.pt"
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"stopped by {name} after batch 5 (epoch 2): checkpoint {checkpoint}; continue with --resume"
    )
    assert _batch(checkpoint.parent / "latest-rank0.pt") == 5 and "Traceback" not in stopped.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["reason"].startswith(f"stopped by {name}")
    assert not (run_dir / "run.lock").exists()
    resumed = _train(crash_recipe, run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    weights = _final_weights(crash_recipe, run)
    for key in reference:
        assert torch.equal(weights[key], reference[key]), key


@pytest.mark.slow
def test_a_stop_at_an_epochs_last_batch_resumes_to_its_evaluation_without_a_warning(crash_recipe, reference):
    """Batch 4 ends epoch 1: the resumed run has no batch of that epoch left to train, only its evaluation and its
    history row. Composer warns then that no batch was trained (as for a broken loader); the resume does not."""
    import csv

    run = "stopped-at-epoch-end"
    stopped = _train(crash_recipe, run, "callbacks.fault_injection.signal_at_batch=4")
    assert stopped.returncode == 75 and "after batch 4 (epoch 1)" in stopped.stderr, stopped.stderr[-2000:]
    resumed = _train(crash_recipe, run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "No batches were trained" not in resumed.stderr and "Warning" not in resumed.stderr, resumed.stderr[-2000:]
    with open(crash_recipe.parent / "runs" / run / "history.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [1, 2, 3]
    weights = _final_weights(crash_recipe, run)
    assert all(torch.equal(weights[k], reference[k]) for k in reference)


def test_sighup_stops_the_run_unless_nohup_ignored_it(monkeypatch):
    """Under nohup (SIGHUP ignored) a closed terminal must not stop the run; under launch, which starts the ranks
    with SIGHUP ignored so that launch survives it, the ranks are told to stop on it all the same."""
    from dlrecipes.callbacks.stop_on_signal import _handled
    from dlrecipes.runtime.hangup import HANGUP_STOPS

    monkeypatch.delenv(HANGUP_STOPS, raising=False)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert signal.SIGHUP not in _handled() and signal.SIGTERM in _handled()
        monkeypatch.setenv(HANGUP_STOPS, "1")
        assert signal.SIGHUP in _handled()
        monkeypatch.delenv(HANGUP_STOPS)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert signal.SIGHUP in _handled()
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_output_to_a_terminal_that_hung_up_goes_to_dev_null_and_an_open_one_is_left_alone():
    """After a hangup the terminal answers no ioctl (isatty is False) and every write fails with EIO: the fds that
    were a terminal when the run started are pointed at /dev/null; a SIGHUP sent by hand changes nothing."""
    import os

    from dlrecipes.runtime.hangup import leave_closed_terminal, terminal_fds

    assert set(terminal_fds()) <= {1, 2}
    master, slave = os.openpty()
    try:
        leave_closed_terminal([slave])  # still open: left alone
        assert os.isatty(slave)
        os.close(master)
        with pytest.raises(OSError):
            os.write(slave, b"lost")
        leave_closed_terminal([slave])
        assert os.write(slave, b"kept going") == len(b"kept going")
        assert os.path.realpath(f"/proc/self/fd/{slave}") == os.devnull
    finally:
        os.close(slave)
