"""Every command against damaged inputs (issue 34): a non-zero exit, one line of at most 1,000 characters that
names the file, no traceback, and the run directory exactly as it was (checksums before and after).

One tiny run is trained once for the module; each case damages a copy of it.  The commands run in-process
through the CLI (Typer's runner): the contract under test is the CLI's, and one subprocess test checks it
holds in a real process too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlrecipes.cli import app
from dlrecipes.cli_args import MAX_MESSAGE

from .conftest import TINY_RECIPE, run_cli

pytestmark = pytest.mark.slow  # the module trains one tiny run (about 3 s)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from dlrecipes import api

    root = tmp_path_factory.mktemp("adversarial")
    api.train(tiny(root / "tiny.yaml", root / "runs"))
    return root / "runs" / "base"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run (and a second, healthy one beside it), to damage."""
    shutil.copytree(trained, tmp_path / "runs" / "base", symlinks=True)
    shutil.copytree(trained, tmp_path / "runs" / "other", symlinks=True)
    return tmp_path / "runs" / "base"


def tiny(path: Path, runs: Path, name: str | None = "base") -> Path:
    """The tiny recipe, training into ``runs`` (as run ``name``)."""
    text = textwrap.dedent(TINY_RECIPE).lstrip() + f"runs_dir: {runs}\n" + (f"run_name: {name}\n" if name else "")
    path.write_text(text)
    return path


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def other_models_checkpoint(path: Path) -> None:
    """A Composer checkpoint whose network has another shape (a wider first layer)."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    model = state["state"]["model"]
    key = next(k for k, v in model.items() if v.dim() == 4)
    model[key] = torch.zeros((model[key].shape[0] * 2, *model[key].shape[1:]))
    torch.save(state, path)


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "png": lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256))),
    "text": lambda p: p.write_text("hello, world\n"),
}
JSON_DAMAGE = {**DAMAGE, "list": lambda p: p.write_text("[1, 2, 3]\n")}


def cut_at_a_line_end(path: Path) -> None:
    """Cut where a line ends, about half way: still valid YAML and a valid recipe (what was lost has defaults)."""
    text = path.read_text()
    path.write_text(text[: text.rindex("\n", 0, len(text) // 2) + 1])


YAML_DAMAGE = {
    **DAMAGE,
    "list": lambda p: p.write_text("- a\n- b\n"),
    "invalid": lambda p: p.write_text("model: [x\n"),
    "cut-at-a-line-end": cut_at_a_line_end,
}
CSV_DAMAGE = {
    "truncated": DAMAGE["truncated"],
    "png": DAMAGE["png"],
    "wrong-row": lambda p: p.write_text(p.read_text() + "3,0.5\n"),
    "not-numbers": lambda p: p.write_text(p.read_text().replace("\n2,", "\ntwo,", 1)),
}
CHECKPOINT_DAMAGE = {**DAMAGE, "other-model": other_models_checkpoint}
IMAGE = "image.png"

CHECKPOINT_COMMANDS = {
    "eval": ["eval", "{run}"],
    "eval-file": ["eval", "{run}", "--checkpoint", "{run}/checkpoints/best.pt"],
    "export": ["export", "{run}"],
    "predict": ["predict", "{run}", "{tmp}/" + IMAGE],
}
CASES = [
    *[("checkpoints/best.pt", how, cmd) for how in CHECKPOINT_DAMAGE for cmd in CHECKPOINT_COMMANDS],
    *[("summary.json", how, cmd) for how in JSON_DAMAGE for cmd in ("runs", "compare")],
    *[("history.csv", how, cmd) for how in CSV_DAMAGE for cmd in ("plot", "compare-plot")],
    *[("recipe.yaml", how, cmd) for how in YAML_DAMAGE for cmd in ("eval", "resume", "runs", "compare")],
]
COMMANDS = {
    **CHECKPOINT_COMMANDS,
    "runs": ["runs", "{runs}"],
    "compare": ["compare", "{run}", "{runs}/other"],
    "compare-plot": ["compare", "{run}", "{runs}/other", "--out", "{tmp}/compare.png"],
    "plot": ["plot", "{run}"],
    "resume": ["train", "{tmp}/tiny.yaml", "--resume"],
}
DAMAGES = {
    "checkpoints/best.pt": CHECKPOINT_DAMAGE,
    "summary.json": JSON_DAMAGE,
    "history.csv": CSV_DAMAGE,
    "recipe.yaml": YAML_DAMAGE,
}


def invoke(args: list[str]):
    return CliRunner().invoke(app, args)


def assert_refused(result, names: str) -> str:
    """A non-zero exit, no traceback, and error lines (one per damaged file) naming ``names``; returns the line."""
    assert result.exit_code not in (0, None), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: ") and names in errors[0] and len(errors[0]) <= MAX_MESSAGE + 10, errors
    return errors[0]


@pytest.mark.parametrize("relative, how, command", CASES, ids=[f"{c}-{r.split('/')[-1]}-{h}" for r, h, c in CASES])
def test_a_damaged_file_is_one_line_and_changes_nothing(run, tmp_path, relative, how, command):
    from PIL import Image

    Image.new("L", (8, 8), 255).save(tmp_path / IMAGE)
    tiny(tmp_path / "tiny.yaml", run.parent)
    DAMAGES[relative][how](run / relative)
    before = checksums(run.parent)
    args = [a.format(run=run, runs=run.parent, tmp=tmp_path) for a in COMMANDS[command]]
    line = assert_refused(invoke(args), str(run / relative))
    assert checksums(run.parent) == before, line
    assert not (tmp_path / "compare.png").exists()
    assert not (run / "export").exists()  # a refused export leaves no (empty) folder behind


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 0.999), flips=st.lists(st.tuples(st.floats(0, 0.999), st.integers(1, 255)), max_size=3))
@example(cut=0.0, flips=[(0.994140625, 1)])  # a member name made invalid UTF-8: was an unexpected UnicodeDecodeError
def test_any_cut_or_flipped_bytes_in_a_checkpoint_refuse_eval_in_one_line(trained, tmp_path_factory, cut, flips):
    folder = tmp_path_factory.mktemp("flip")
    run = folder / "base"
    shutil.copytree(trained, run, symlinks=True)
    best = run / "checkpoints" / "best.pt"
    data = bytearray(best.read_bytes())
    for where, xor in flips:
        data[int(where * len(data))] ^= xor
    best.write_bytes(bytes(data[: max(1, int(len(data) * (1 - cut)))] if cut > 0.001 else data))
    before = checksums(run)
    result = invoke(["eval", str(run), "--out", str(folder / "report")])
    if result.exit_code == 0:  # bytes that nothing reads (zip padding) may change harmlessly
        assert not cut > 0.001 and "top1=" in result.output
    else:
        assert_refused(result, str(best))
    assert checksums(run) == before


def test_resume_with_no_checkpoint_left_refuses_twice_and_its_advice_works(run, tmp_path):
    """The run's results are never overwritten: --resume refuses (again and again) and --restart keeps them."""
    from dlrecipes.records.run_files import read_history

    tiny(tmp_path / "tiny.yaml", run.parent)
    for periodic in (run / "checkpoints").glob("ep*-rank0.pt"):
        periodic.write_bytes(periodic.read_bytes()[:1000])
    (run / "checkpoints" / "ep3-ba9-rank0.pt-partial").write_bytes(b"an interrupted save")  # kept by a refusal too
    before = checksums(run)
    first = assert_refused(invoke(["train", str(tmp_path / "tiny.yaml"), "--resume"]), "ep2-ba6-rank0.pt")
    second = assert_refused(invoke(["train", str(tmp_path / "tiny.yaml"), "--resume"]), "ep2-ba6-rank0.pt")
    assert first == second and "nothing was changed" in first and checksums(run) == before
    advice = first.split("pass ", 1)[1].split(" instead of", 1)[0]  # "--restart run_name=base"
    assert advice == "--restart run_name=base"
    rows_before = read_history(run)
    restarted = invoke(["train", str(tmp_path / "tiny.yaml"), *advice.split(), "trainer.max_duration=1ep"])
    assert restarted.exit_code == 0, restarted.output
    kept = next(run.parent.glob("base.restarted-*"))
    assert checksums(kept) == before and read_history(kept) == rows_before  # the old run, whole
    assert len(read_history(run)) == 1  # the new one, from the beginning


def test_resume_refusals_name_the_way_on(run, tmp_path):
    recipe = tiny(tmp_path / "tiny.yaml", run.parent, name=None)
    before = checksums(run.parent)
    typo = assert_refused(invoke(["train", str(recipe), "--resume", "run_name=bsae"]), "run_name")
    assert "no run 'bsae'" in typo and "the closest: base" in typo
    from dlrecipes.records.run_dir import check_run_exists

    os.environ["DLRECIPES_RESUME_MISSING"] = "start"  # a requeue script's choice: a run that is not there starts
    try:
        check_run_exists(run.parent, "bsae")
    finally:
        del os.environ["DLRECIPES_RESUME_MISSING"]
    shorter = assert_refused(
        invoke(["train", str(recipe), "--resume", "run_name=base", "trainer.max_duration=1ep"]), "trainer.max_duration"
    )
    assert "shorter than what base has trained (2 epochs, 6 batches" in shorter
    both = assert_refused(invoke(["train", str(recipe), "--resume", "--restart", "run_name=base"]), "--restart")
    again = assert_refused(invoke(["train", str(recipe), "run_name=base"]), "already holds a run")
    assert "--restart" in again and "--resume" in both
    assert checksums(run.parent) == before
    assert not (run.parent / "bsae").exists()


def test_an_unexpected_error_is_one_line_and_the_traceback_is_on_request(monkeypatch):
    from dlrecipes import api

    def broken(*args, **kwargs):
        raise ValueError("something nobody foresaw\nsecond line")

    monkeypatch.setattr(api, "runs", broken)
    result = invoke(["runs"])
    assert result.exit_code == 1 and result.stderr.strip() == (
        "error: ValueError: something nobody foresaw (unexpected: please report it; DLRECIPES_TRACEBACK=1 shows the "
        "traceback)"
    )
    monkeypatch.setattr(api, "runs", lambda *a, **k: open("/no/such/folder/file"))
    result = invoke(["runs"])  # the machine said no: not a bug to report
    assert result.exit_code == 1 and result.stderr.strip() == (
        "error: No such file or directory: /no/such/folder/file (DLRECIPES_TRACEBACK=1 shows where)"
    )
    monkeypatch.setattr(api, "runs", broken)
    monkeypatch.setenv("DLRECIPES_TRACEBACK", "1")
    assert isinstance(invoke(["runs"]).exception, ValueError)


def test_a_damaged_checkpoint_is_one_line_in_a_real_process(run):
    best = run / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[:5000])
    result = run_cli("eval", str(run))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --checkpoint: {best} is truncated or damaged (an incomplete zip archive of 5,000 bytes); nothing was "
        "changed. Use another checkpoint of the run (--checkpoint best, latest or a file in its checkpoints/ folder)"
    ]


def test_resume_leaves_a_live_runs_files_alone(run, tmp_path):
    """While another process trains in the run, --resume is refused by its lock before it looks at (and would
    clean up) the checkpoints: the live run's in-flight save and its latest link stay as they are."""
    from dlrecipes.records import run_lock

    tiny(tmp_path / "tiny.yaml", run.parent)
    (run / "checkpoints" / "ep3-ba9-rank0.pt-partial").write_bytes(b"a save in flight")
    (run / "checkpoints" / "latest-rank0.pt").unlink()
    before = checksums(run.parent)
    lock = run_lock.acquire(run)  # this process holds it: a live holder
    try:
        assert "is in use by another training run" in assert_refused(
            invoke(["train", str(tmp_path / "tiny.yaml"), "--resume"]), "run_name"
        )
        assert checksums(run.parent) == {**before, "base/run.lock": checksums(run.parent)["base/run.lock"]}
    finally:
        lock.release()


def test_restart_sets_the_old_run_aside_under_a_free_name(run, monkeypatch):
    import time

    from dlrecipes.records.run_dir import set_aside_for_restart

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260102-030405")
    (run.parent / "base.restarted-20260102-030405").mkdir()  # a restart in the same second
    aside = set_aside_for_restart(run)
    assert aside == run.parent / "base.restarted-20260102-030405-2" and not run.exists()
    assert not (aside / "run.lock").exists() and (aside / "checkpoints" / "best.pt").is_file()


# --- the same matrix against a run in a bucket (the run store's other side) --------------------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from .s3_server import serving

    with serving(tmp_path_factory.mktemp("s3"), "adv") as server:
        yield server


def bucket_checksums(server, prefix: str) -> dict[str, str]:
    return {key: hashlib.sha256(server.read("adv", key)).hexdigest() for key in server.keys("adv", prefix + "/")}


@pytest.fixture
def bucket_run(s3, trained, tmp_path, monkeypatch) -> str:
    """The trained run (and a healthy one beside it) in the bucket as training leaves one there (its pointer
    names its newest checkpoint; no links), under a prefix of this test's own; this test's own staging folder."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path / "staging"))
    prefix = tmp_path.name
    client = s3.client()
    for run in ("base", "other"):
        for path in sorted(trained.rglob("*")):
            if path.is_file() and not path.is_symlink():
                client.upload_file(str(path), "adv", f"{prefix}/{run}/{path.relative_to(trained).as_posix()}")
        newest = max(trained.glob("checkpoints/ep*-rank0.pt"), key=lambda p: p.stat().st_mtime).name
        client.put_object(Bucket="adv", Key=f"{prefix}/{run}/checkpoints/latest.txt", Body=newest.encode() + b"\n")
    return f"s3://adv/{prefix}/base"


# Every file and command of the matrix, each with one kind of damage (what the kind changes is read from the local
# copy, as above; the store's side is the same for all), and a checkpoint of another model and invalid YAML besides.
BUCKET_CASES = [
    *dict.fromkeys((relative, "truncated", command) for relative, _, command in CASES),
    ("checkpoints/best.pt", "other-model", "eval"),
    ("recipe.yaml", "invalid", "resume"),
]


@pytest.mark.parametrize(
    "relative, how, command", BUCKET_CASES, ids=[f"{c}-{r.split('/')[-1]}-{h}" for r, h, c in BUCKET_CASES]
)
def test_a_damaged_file_in_a_bucket_is_one_line_naming_it_there_and_changes_nothing(
    s3, bucket_run, tmp_path, relative, how, command
):
    """As above, the run in a bucket: the line names the damaged object by its address, the bucket unchanged."""
    from PIL import Image

    Image.new("L", (8, 8), 255).save(tmp_path / IMAGE)
    runs = bucket_run.rsplit("/", 1)[0]
    tiny(tmp_path / "tiny.yaml", runs)  # type: ignore[arg-type]
    key = f"{runs[len('s3://adv/') :]}/base/{relative}"
    damaged = tmp_path / "damaged" / relative
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(s3.read("adv", key))
    DAMAGES[relative][how](damaged)
    s3.client().upload_file(str(damaged), "adv", key)
    before = bucket_checksums(s3, runs[len("s3://adv/") :])
    args = [a.format(run=bucket_run, runs=runs, tmp=tmp_path) for a in COMMANDS[command]]
    line = assert_refused(invoke(args), f"{bucket_run}/{relative}")
    assert bucket_checksums(s3, runs[len("s3://adv/") :]) == before, line
    assert not (tmp_path / "compare.png").exists()
