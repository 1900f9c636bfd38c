"""A checkpoint never runs code (issue item 6): every command that reads one (eval, predict, export, --resume,
checkpoint.load_path) loads it tensors-only, a run's own files too; a file that carries an object whose
unpickling runs code is refused in one line naming it and the object, nothing of it run and nothing of the run
changed, unless --trust-checkpoint; dlrecipes' own checkpoints, with the state algorithms and callbacks keep,
still pass and resume."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch

from dlrecipes.errors import UserError
from dlrecipes.records.checkpoint_safety import (
    ALLOWED_GLOBALS,
    UntrustedCheckpoint,
    check_trusted,
    read_checkpoint,
    tensors_only,
    unsafe_globals,
)

from .conftest import TINY_RECIPE, run_cli, write

PAYLOAD = "tests.test_checkpoint_safety._touch"


def _touch(path: str) -> None:
    """What the payload runs while it is unpickled: creates a marker file (an attack would run a command)."""
    Path(path).touch()


class RunsCode:
    """An object whose unpickling calls :func:`_touch`, as one calling ``os.system`` would run a command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return _touch, (str(self.marker),)


def poison(checkpoint: Path, marker: Path) -> None:
    """Rewrite ``checkpoint`` (a real one, fully loaded here: the test wrote it) with the payload beside its state."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state["extra"] = RunsCode(marker)
    torch.save(state, checkpoint)
    assert not marker.exists()


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (and where each link points), by content."""
    return {
        p.relative_to(folder).as_posix(): (
            f"-> {p.readlink()}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


@pytest.fixture
def poisoned(tiny_run: Path, tmp_path: Path):
    """The tiny run's copy with its best and newest periodic checkpoints carrying the payload; the marker path."""
    marker = tmp_path / "code-ran"
    for name in ("best.pt", "ep2-ba6-rank0.pt"):
        poison(tiny_run / "checkpoints" / name, marker)
    return tiny_run, marker


def _image(tmp_path: Path) -> Path:
    from PIL import Image

    path = tmp_path / "digit.png"
    Image.new("L", (8, 8), 120).save(path)
    return path


# (command arguments given the run directory, a recipe, an image and tmp_path; the key and file the line names)
COMMANDS = {
    "eval": (lambda run, recipe, image, tmp: ["eval", str(run)], "--checkpoint", "best.pt"),
    "eval-latest": (
        lambda run, recipe, image, tmp: ["eval", str(run), "--checkpoint", "latest"],
        "--checkpoint",
        "ep2-ba6-rank0.pt",
    ),
    "predict": (lambda run, recipe, image, tmp: ["predict", str(run), str(image)], "--checkpoint", "best.pt"),
    "export": (lambda run, recipe, image, tmp: ["export", str(run)], "--checkpoint", "best.pt"),
    "resume": (
        lambda run, recipe, image, tmp: [
            "train",
            str(recipe),
            f"runs_dir={run.parent}",
            "run_name=tiny",
            "plots=true",
            "--resume",
        ],
        "--resume",
        "ep2-ba6-rank0.pt",
    ),
    "load_path": (
        lambda run, recipe, image, tmp: [
            "train",
            str(recipe),
            f"runs_dir={tmp / 'other'}",
            "run_name=new",
            f"checkpoint.load_path={run / 'checkpoints' / 'best.pt'}",
        ],
        "checkpoint.load_path",
        "best.pt",
    ),
    "load_path-full-state": (
        lambda run, recipe, image, tmp: [
            "train",
            str(recipe),
            f"runs_dir={tmp / 'other'}",
            "run_name=new",
            f"checkpoint.load_path={run / 'checkpoints' / 'best.pt'}",
            "checkpoint.load_weights_only=false",
        ],
        "checkpoint.load_path",
        "best.pt",
    ),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_checkpoint_that_runs_code(poisoned, tmp_path, command):
    run, marker = poisoned
    recipe = write(tmp_path / "tiny.yaml", TINY_RECIPE)
    args, key, name = COMMANDS[command]
    before = _files(run)
    refused = run_cli(*args(run, recipe, _image(tmp_path), tmp_path))
    assert refused.returncode == 2, refused.stderr[-2000:]
    path = run / "checkpoints" / name
    assert re.fullmatch(
        rf"error: {re.escape(key)}: {re.escape(str(path))} holds Python objects beyond tensors "
        rf"\({re.escape(PAYLOAD)}\); .*pass --trust-checkpoint",
        refused.stderr.strip(),
    ), refused.stderr
    assert not marker.exists()  # nothing of the file ran
    assert _files(run) == before  # nothing renamed as damaged, no report, no export, no new checkpoint
    assert not (tmp_path / "other" / "new").exists()


def test_trust_checkpoint_loads_the_file_in_full(poisoned, tmp_path):
    run, marker = poisoned
    trusted = run_cli("eval", str(run), "--trust-checkpoint", "--out", str(tmp_path / "report"))
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert marker.exists()  # the user's word: the file was unpickled in full


def test_the_check_names_every_object_and_the_load_behind_it_refuses_what_a_listing_misses(tmp_path, monkeypatch):
    """The listing (static) gives the one line; the load itself is tensors-only all the same, so a global the
    listing did not see is refused by torch, and said in the same line."""
    path = tmp_path / "foreign.pt"
    marker = tmp_path / "ran"
    torch.save({"weights": torch.zeros(2), "a": RunsCode(marker), "b": Path("x")}, path)
    with pytest.raises(UntrustedCheckpoint) as refused:
        check_trusted(path, key="--checkpoint")
    assert refused.value.found == ["pathlib.PosixPath", PAYLOAD]  # sorted, each named once
    assert len(str(refused.value).splitlines()) == 1
    import dlrecipes.records.checkpoint_safety as safety

    monkeypatch.setattr(safety, "unsafe_globals", lambda p: [])  # a pickle that hides its globals
    with pytest.raises(UntrustedCheckpoint, match=re.escape(PAYLOAD)):
        read_checkpoint(path)
    from composer.utils.checkpoint import safe_torch_load

    with pytest.raises(UntrustedCheckpoint, match=re.escape(PAYLOAD)):  # Composer's loader asks for a full unpickle
        with tensors_only(path, key="--resume"):
            safe_torch_load(str(path))
    assert not marker.exists()
    read_checkpoint(path, trust=True)
    assert marker.exists()


def _composer_load_is_tensors_only(path: Path) -> None:
    """Composer's own loader, inside :func:`tensors_only`, loads the file (its full-unpickle request overridden)."""
    from composer.utils.checkpoint import safe_torch_load

    with tensors_only(path):
        state = safe_torch_load(str(path))
    assert "model" in state["state"] and "rng" in state


def _tensors(value, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested state, by its path."""
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    return {k: v for key, item in items for k, v in _tensors(item, f"{prefix}/{key}").items()}


@pytest.mark.slow
def test_a_run_with_state_keeping_algorithms_and_callbacks_passes_and_resumes_exactly(tiny_recipe, tmp_path):
    """EMA's averaged weights, a timm optimizer's state (LAMB), early stopping's and the speed monitor's state: the
    checkpoints of such a run hold nothing beyond the allowlist, Composer's loader reads them tensors-only, and
    --resume (no flag) ends with the weights, EMA state and optimizer state of the run trained straight through."""
    args = [
        "train",
        str(tiny_recipe),
        "optimizer={name: lamb, lr: 0.01}",
        "algorithms.ema={}",
        "callbacks.early_stopping={patience: 5}",
        "callbacks.speed_monitor={}",
    ]
    straight = run_cli(*args, "run_name=straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    first = run_cli(*args, "run_name=kept", "trainer.max_duration=1ep")
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoints = tmp_path / "runs" / "kept" / "checkpoints"
    for path in sorted(checkpoints.glob("*.pt")):
        assert unsafe_globals(path) == [], path
    _composer_load_is_tensors_only(checkpoints / "ep1-ba3-rank0.pt")
    resumed = run_cli(*args, "run_name=kept", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr and "ep1-ba3-rank0.pt" in resumed.stderr
    ours, reference = (
        read_checkpoint(tmp_path / "runs" / name / "checkpoints" / "ep2-ba6-rank0.pt", key="--resume")["state"]
        for name in ("kept", "straight")
    )
    assert [name for name, _ in ours["algorithms"]] == ["EMA"] and ours["optimizers"]
    mine, theirs = (
        _tensors({k: state[k] for k in ("model", "algorithms", "optimizers")}) for state in (ours, reference)
    )
    assert mine.keys() == theirs.keys() and any("ema" in k.lower() for k in mine)
    assert [k for k in mine if not torch.equal(mine[k], theirs[k])] == []


def test_a_runs_own_checkpoints_need_the_allowlist_and_nothing_more(trained_tiny):
    """What torch's tensors-only loader does not allow by itself in a plain run's checkpoints is on the allowlist
    (NumPy's RNG state, the torch version, the time's durations): they load as they are, no flag needed."""
    named = set()
    for path in sorted((trained_tiny / "checkpoints").glob("*.pt")):
        assert unsafe_globals(path) == [], path
        named |= set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    assert named and named <= set(ALLOWED_GLOBALS)
    state = read_checkpoint(trained_tiny / "checkpoints" / "ep2-ba6-rank0.pt", key="--resume")
    assert state["state"]["timestamp"]["Timestamp"]["batch"] == 6 and state["state"]["optimizers"]


# --- a checkpoint's bytes checked before any of it is loaded (issue 63, items 3 and 6) ----------------------------


def with_records(source: Path, target: Path, change) -> Path:
    """``source``'s archive rewritten at ``target``, each entry's bytes passed through ``change(name, data)`` (None
    drops the entry): a file cut or altered as a disk, a copy or an attacker would."""
    import zipfile

    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = change(info.filename, old.read(info.filename))
            if data is not None:
                new.writestr(info.filename, data)
    return target


def short_record(source: Path, target: Path) -> Path:
    """``source`` with its largest tensor record cut to half its bytes (the pickle still declares them all)."""
    import zipfile

    with zipfile.ZipFile(source) as archive:
        largest = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size).filename
    return with_records(source, target, lambda name, data: data[: len(data) // 2] if name == largest else data)


def declaring(path: Path, numel: int, record: int = 4) -> Path:
    """A torch.save archive of ``{'w': tensor}`` whose pickle declares a float storage of ``numel`` elements and
    whose record holds ``record`` bytes (torch would build the tensor over memory past the record)."""
    import collections
    import io
    import pickle

    class Storage:
        pass

    class Tensor:
        def __reduce_ex__(self, protocol):
            return torch._utils._rebuild_tensor_v2, (Storage(), 0, (numel,), (1,), False, collections.OrderedDict())

    class Declaring(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", numel) if isinstance(obj, Storage) else None

    pickled = io.BytesIO()
    Declaring(pickled, protocol=2).dump({"w": Tensor()})
    writer = torch._C.PyTorchFileWriter(str(path))
    for name, data in (
        ("data.pkl", pickled.getvalue()),
        ("byteorder", b"little"),
        ("data/0", b"\0" * record),
        (".data/version", b"3\n"),
    ):
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return path


def test_a_storage_larger_than_its_record_is_refused_trusted_or_not(tmp_path, trained_tiny):
    """The issue's file: a few hundred bytes whose pickle declares a 1 TiB tensor (torch builds it over memory past
    the record); and a real checkpoint with a record cut short (torch reads past it: an evaluation on stray memory).
    Refused before any load, with or without trust, in one line naming the file and the record."""
    from dlrecipes.records.checkpoint_safety import UnreadableCheckpoint
    from dlrecipes.records.checkpoints import loadable

    huge = declaring(tmp_path / "huge.pt", 2**38)
    assert huge.stat().st_size < 2000
    cut = short_record(trained_tiny / "checkpoints" / "ep2-ba6-rank0.pt", tmp_path / "cut.pt")
    for path, said in [
        (huge, "its tensor record data/0 holds 4 bytes where its pickle declares 1,099,511,627,776"),
        (cut, r"its tensor record data/\d+ holds [\d,]+ bytes where its pickle declares [\d,]+"),
    ]:
        for trust in (False, True):
            with pytest.raises(UnreadableCheckpoint) as refused:
                read_checkpoint(path, trust=trust, key="--checkpoint")
            assert re.fullmatch(
                rf"--checkpoint: {re.escape(str(path))} is damaged \({said}: a truncated or altered "
                rf"file\)",
                str(refused.value),
            ), str(refused.value)
        assert loadable(path).startswith("is damaged (its tensor record data/")  # --resume passes over it
    assert read_checkpoint(declaring(tmp_path / "whole.pt", 3, record=12))["w"].shape == (3,)  # records that match


# (command arguments given the run directory, the damaged file and tmp_path; the key the line names)
LOADERS = {
    "eval": (lambda run, bad, tmp: ["eval", str(bad)], "--checkpoint"),
    "predict": (lambda run, bad, tmp: ["predict", str(bad), str(_image(tmp))], "--checkpoint"),
    "export": (lambda run, bad, tmp: ["export", str(bad)], "--checkpoint"),
    "load_path": (
        lambda run, bad, tmp: [
            "train",
            str(write(tmp / "tiny.yaml", TINY_RECIPE)),
            f"runs_dir={tmp / 'o'}",
            "run_name=new",
            f"checkpoint.load_path={bad}",
        ],
        "checkpoint.load_path",
    ),
    "load_path-full-state": (
        lambda run, bad, tmp: [
            "train",
            str(write(tmp / "tiny.yaml", TINY_RECIPE)),
            f"runs_dir={tmp / 'o'}",
            "run_name=new",
            f"checkpoint.load_path={bad}",
            "checkpoint.load_weights_only=false",
        ],
        "checkpoint.load_path",
    ),
    "teacher": (
        lambda run, bad, tmp: [
            "train",
            str(write(tmp / "tiny.yaml", TINY_RECIPE)),
            f"runs_dir={tmp / 'o'}",
            "run_name=new",
            f"algorithms.distillation={{teacher: {{name: cnn_simple, width: 4, hidden: 16, checkpoint: {bad}}}}}",
        ],
        "algorithms.distillation.teacher",
    ),
}


@pytest.mark.parametrize("command", list(LOADERS))
def test_every_loader_refuses_a_short_record_even_when_trusted(tiny_run, tmp_path, command):
    args, key = LOADERS[command]
    bad = short_record(tiny_run / "checkpoints" / "best.pt", tiny_run / "checkpoints" / "cut.pt")
    before = _files(tiny_run)
    refused = run_cli(*args(tiny_run, bad, tmp_path), *([] if command == "teacher" else ["--trust-checkpoint"]))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert re.fullmatch(
        rf"error: {re.escape(key)}: {re.escape(str(bad))} is damaged \(its tensor record data/\d+ "
        r"holds [\d,]+ bytes where its pickle declares [\d,]+: a truncated or altered file\).*",
        refused.stderr.strip(),
    ), refused.stderr
    assert _files(tiny_run) == before and not (tmp_path / "o" / "new").exists()


def _deep(path: Path) -> Path:
    """A checkpoint whose data.pkl nests lists 100,000 deep (code walking it recursively meets RecursionError)."""
    return with_records(
        path,
        path.with_name("deep.pt"),
        lambda name, data: b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"." if name.endswith("/data.pkl") else data,
    )


MALFORMED = {  # how the file is made from a real checkpoint, and the reason the line gives
    "nested 100,000 deep": (_deep, "its pickle nests more than 100 levels deep"),
    "a broken data.pkl": (
        lambda p: with_records(
            p, p.with_name("broken.pt"), lambda name, data: b"\x80\x02garbage" if name.endswith("/data.pkl") else data
        ),
        "its pickle is malformed: .*",
    ),
    "no data.pkl": (
        lambda p: with_records(
            p, p.with_name("nopkl.pt"), lambda name, data: None if name.endswith("/data.pkl") else data
        ),
        "no data.pkl in it",
    ),
    "random bytes": (
        lambda p: (
            p.with_name("random.pt").write_bytes(bytes((i * 167 + 13) % 256 for i in range(5120))),
            p.with_name("random.pt"),
        )[1],
        "unknown binary data, 5,120 bytes",
    ),
    "a model that is a list": (
        lambda p: (torch.save({"state": {"model": [torch.zeros(2)]}}, p.with_name("list.pt")), p.with_name("list.pt"))[
            1
        ],
        "its state/model is a list, not the model's tensors by name",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_file_is_not_a_checkpoint_in_one_line(tiny_run, tmp_path, case):
    """Each was an unexpected error (a RecursionError, an AttributeError from Composer, a refusal that called random
    bytes 'Python objects beyond tensors'): now one line, exit 2, for eval and for a checkpoint.load_path alike."""
    make, why = MALFORMED[case]
    bad = make(tiny_run / "checkpoints" / "best.pt")
    refused = run_cli("eval", str(bad))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert re.fullmatch(
        rf"error: --checkpoint: {re.escape(str(bad))} is not a dlrecipes/Composer checkpoint "
        rf"\({why}\); nothing was changed\. Use another checkpoint .*",
        refused.stderr.strip(),
    ), refused.stderr
    if case != "a model that is a list":  # that one loads as a plain state: load_path says it holds no weights
        with pytest.raises(
            UserError,
            match=rf"^checkpoint.load_path: {re.escape(str(bad))} is not a "
            rf"dlrecipes/Composer checkpoint \({why}\)$",
        ):
            read_checkpoint(bad, trust=True)


@pytest.mark.parametrize(
    "kind", ["a directory", "a FIFO (named pipe)", "a symbolic link to gone.pt, which does not exist"]
)
def test_a_best_pt_that_is_not_a_file_is_named_for_what_it_is(tiny_run, kind):
    import os

    best = tiny_run / "checkpoints" / "best.pt"
    best.unlink()
    {"a directory": best.mkdir, "a FIFO (named pipe)": lambda: os.mkfifo(best)}.get(
        kind, lambda: best.symlink_to("gone.pt")
    )()
    refused = run_cli("eval", str(tiny_run))
    assert refused.returncode == 2
    what = kind if kind.startswith("a symbolic") else f"{kind}, not a checkpoint file"
    assert refused.stderr.strip() == (
        f"error: --checkpoint: {best} is {what}; use --checkpoint latest, or a checkpoint file"
    )


def test_eval_latest_over_a_damaged_newest_checkpoint_says_which_it_used(tiny_run, tmp_path):
    """The newest periodic checkpoint cut short: `eval --checkpoint latest` evaluates the one before it, saying so
    in one note naming the damaged file and why; nothing in the run changes."""
    newest = tiny_run / "checkpoints" / "ep2-ba6-rank0.pt"
    short_record(newest, tmp_path / "cut.pt").replace(newest)
    before = _files(tiny_run)
    result = run_cli("eval", str(tiny_run), "--checkpoint", "latest", "--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert_skipped_the_damaged_newest(result.stderr)
    assert "ep1-ba3-rank0.pt" in result.stdout
    assert _files(tiny_run) == before
    newest.write_bytes(b"")
    (tiny_run / "checkpoints" / "ep1-ba3-rank0.pt").write_bytes(b"")
    none = run_cli("eval", str(tiny_run), "--checkpoint", "latest")
    assert none.returncode == 2 and none.stderr.strip() == (
        f"error: --checkpoint: no periodic checkpoint of {tiny_run} loads (ep2-ba6-rank0.pt is empty (0 bytes); "
        "ep1-ba3-rank0.pt is empty (0 bytes)); use --checkpoint best"
    )


def assert_skipped_the_damaged_newest(stderr: str) -> None:
    """``--checkpoint latest`` said, in one note, that it passed over the damaged ep2 for ep1 (a local run's and a
    bucket's alike)."""
    notes = [line for line in stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and re.fullmatch(
        r"note: checkpoints/ep2-ba6-rank0.pt is damaged \(its tensor record data/\d+ holds [\d,]+ bytes where its "
        r"pickle declares [\d,]+: a truncated or altered file\); using ep1-ba3-rank0.pt, the newest checkpoint that "
        r"loads",
        notes[0],
    ), notes
