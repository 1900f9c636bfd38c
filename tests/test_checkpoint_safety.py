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

from dlrecipes.records.checkpoint_safety import (
    ALLOWED_GLOBALS, UntrustedCheckpoint, check_trusted, read_checkpoint, tensors_only, unsafe_globals,
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
    return {p.relative_to(folder).as_posix(): (f"-> {p.readlink()}" if p.is_symlink() else
                                               hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


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
    "eval-latest": (lambda run, recipe, image, tmp: ["eval", str(run), "--checkpoint", "latest"], "--checkpoint",
                    "ep2-ba6-rank0.pt"),
    "predict": (lambda run, recipe, image, tmp: ["predict", str(run), str(image)], "--checkpoint", "best.pt"),
    "export": (lambda run, recipe, image, tmp: ["export", str(run)], "--checkpoint", "best.pt"),
    "resume": (lambda run, recipe, image, tmp: ["train", str(recipe), f"runs_dir={run.parent}", "run_name=tiny",
                                                "plots=true", "--resume"], "--resume", "ep2-ba6-rank0.pt"),
    "load_path": (lambda run, recipe, image, tmp: ["train", str(recipe), f"runs_dir={tmp / 'other'}", "run_name=new",
                                                   f"checkpoint.load_path={run / 'checkpoints' / 'best.pt'}"],
                  "checkpoint.load_path", "best.pt"),
    "load_path-full-state": (lambda run, recipe, image, tmp: [
        "train", str(recipe), f"runs_dir={tmp / 'other'}", "run_name=new",
        f"checkpoint.load_path={run / 'checkpoints' / 'best.pt'}", "checkpoint.load_weights_only=false"],
        "checkpoint.load_path", "best.pt"),
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
    assert re.fullmatch(rf"error: {re.escape(key)}: {re.escape(str(path))} holds Python objects beyond tensors "
                        rf"\({re.escape(PAYLOAD)}\); .*pass --trust-checkpoint", refused.stderr.strip()), refused.stderr
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
    args = ["train", str(tiny_recipe), "optimizer={name: lamb, lr: 0.01}", "algorithms.ema={}",
            "callbacks.early_stopping={patience: 5}", "callbacks.speed_monitor={}"]
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
    ours, reference = (read_checkpoint(tmp_path / "runs" / name / "checkpoints" / "ep2-ba6-rank0.pt", key="--resume")
                       ["state"] for name in ("kept", "straight"))
    assert [name for name, _ in ours["algorithms"]] == ["EMA"] and ours["optimizers"]
    mine, theirs = (_tensors({k: state[k] for k in ("model", "algorithms", "optimizers")})
                    for state in (ours, reference))
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
