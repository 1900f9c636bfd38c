"""Checkpoint files: atomic writes, tensors-only loading, --trust-checkpoint, clear shape errors."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from dlrecipes.api import resolve
from dlrecipes.errors import DataError, UserError
from dlrecipes.records.checkpoints import (
    atomic_write,
    check_trusted,
    load_model_weights,
    model_weights,
    read_checkpoint,
    relink,
    resume_point,
)
from tests.conftest import build_trainer, fit, prepare_run_dir, run_cli


class Smuggled:
    """Stands for any Python object a pickle can carry (and run code while loading)."""

    def __init__(self, value=0):
        self.value = value


class Net(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.fc = nn.Linear(8, classes)


class Wrapped(nn.Module):  # Composer names the network "module"
    def __init__(self, classes: int):
        super().__init__()
        self.module = Net(classes)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "best.json"
    atomic_write(target, lambda f: f.write(b"old"))

    def broken(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json"]


def test_relink_replaces_the_latest_link_in_place(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"a")
    (tmp_path / "b.pt").write_bytes(b"b")
    link = tmp_path / "latest-rank0.pt"
    relink(link, tmp_path / "a.pt")
    relink(link, tmp_path / "b.pt")
    assert os.readlink(link) == "b.pt" and link.read_bytes() == b"b"


@pytest.mark.slow
def test_resume_point_prefers_the_newest_complete_checkpoint_over_a_stale_link(tiny_recipe):
    first = fit(resolve(tiny_recipe, ["run_name=stale", "checkpoint.save_interval=1ba"]))
    checkpoints = first.run_dir / "checkpoints"
    relink(checkpoints / "latest-rank0.pt", checkpoints / "ep0-ba2-rank0.pt")  # as if killed before relinking
    (checkpoints / "ep1-ba7-rank0.pt-partial").write_bytes(b"half a checkpoint")
    point = resume_point(checkpoints)
    assert point.name == "ep1-ba6-rank0.pt"
    assert os.readlink(checkpoints / "latest-rank0.pt") == "ep1-ba6-rank0.pt"
    assert not list(checkpoints.glob("*-partial"))


@pytest.mark.slow
def test_composer_checkpoints_load_tensors_only(tiny_recipe):
    first = fit(resolve(tiny_recipe, ["run_name=source"]))
    best = first.run_dir / "checkpoints" / "best.pt"
    loaded = read_checkpoint(best)  # outside any trusted folder, yet no full unpickle is needed
    weights = model_weights(loaded, best)
    assert weights and all(k.startswith("module.") for k in weights)
    assert all(isinstance(v, torch.Tensor) for v in weights.values())


def test_a_checkpoint_with_python_objects_needs_trust(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"state_dict": Net(3).state_dict(), "extra": Smuggled(1)}, path)
    with pytest.raises(
        UserError,
        match=r"checkpoint.load_path: .*foreign.pt holds Python objects beyond tensors "
        r"\(tests.test_checkpoints.Smuggled\).*--trust-checkpoint",
    ):
        read_checkpoint(path)
    with pytest.raises(UserError, match=r"foreign.pt holds Python objects beyond tensors"):
        check_trusted(path)  # wherever it lies: a run's own folder is no reason to trust a file
    assert read_checkpoint(path, trust=True)["extra"].value == 1
    with pytest.raises(DataError, match=r"no checkpoint file at .*missing.pt"):
        read_checkpoint(tmp_path / "missing.pt")


def test_a_new_head_needs_an_ignore_rule_and_the_error_says_so(tmp_path):
    path = tmp_path / "ten.pt"
    torch.save(Net(10).state_dict(), path)  # a bare network's state dict, as timm/torchvision write
    model = Wrapped(3)
    weights = model_weights(read_checkpoint(path), path)
    with pytest.raises(
        UserError,
        match=r"module.fc.weight \(10, 8\) vs the model's \(3, 8\).*"
        r"load_ignore_keys \(e.g. \['module.fc.\*'\]\)",
    ):
        load_model_weights(model, weights, path)
    report = load_model_weights(model, weights, path, ignore=["state/model/module.fc.*"])
    assert report["ignored"] == ["module.fc.bias", "module.fc.weight"]
    source = torch.load(path)
    assert torch.equal(model.module.body.weight, source["body.weight"])
    assert not torch.equal(model.module.fc.weight[:3], source["fc.weight"][:3])


def test_strict_loading_names_missing_and_unexpected_keys(tmp_path):
    path = tmp_path / "partial.pt"
    torch.save({"body.weight": torch.zeros(8, 4), "other.weight": torch.zeros(1)}, path)
    weights = model_weights(read_checkpoint(path), path)
    with pytest.raises(
        UserError, match=r"missing from the file: module.body.bias.*not in the model: module.other.weight"
    ):
        load_model_weights(Wrapped(3), weights, path)
    report = load_model_weights(Wrapped(3), weights, path, strict=False)
    assert "module.fc.weight" in report["missing"]


@pytest.mark.slow
def test_cli_refuses_an_untrusted_full_state_and_accepts_it_with_the_flag(tiny_recipe, tmp_path):
    source = fit(resolve(tiny_recipe, ["run_name=origin", "trainer.max_duration=1ep"]))
    foreign = tmp_path / "foreign.pt"
    state = torch.load(source.run_dir / "checkpoints" / "best.pt", weights_only=False)
    state["smuggled"] = Smuggled(2)
    torch.save(state, foreign)
    args = [
        "train",
        str(tiny_recipe),
        "run_name=continued",
        f"checkpoint.load_path={foreign}",
        "checkpoint.load_weights_only=false",
    ]
    refused = run_cli(*args)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--trust-checkpoint" in refused.stderr.strip().splitlines()[-1]
    config = resolve(
        tiny_recipe, ["run_name=continued2", f"checkpoint.load_path={foreign}", "checkpoint.load_weights_only=false"]
    )
    trainer = build_trainer(config, prepare_run_dir(config, "continued2", resume=False), trust_checkpoint=True)
    try:
        assert int(trainer.state.timestamp.batch) == 3  # the full state: time and optimizer too
    finally:
        trainer.close()


def test_a_truncated_load_path_is_named(tmp_path):
    path = tmp_path / "cut.pt"
    torch.save(Net(3).state_dict(), path)
    path.write_bytes(path.read_bytes()[:200])
    said = r"^checkpoint.load_path: .*cut.pt is truncated or damaged \(an incomplete zip archive of 200 bytes\)$"
    with pytest.raises(DataError, match=said):
        read_checkpoint(path)
    with pytest.raises(DataError, match=said):  # trusting its code does not make a cut file whole
        read_checkpoint(path, trust=True)


@pytest.mark.parametrize(
    "cause, raised",
    [
        ("[gloo/transport/tcp/pair.cc:525] Read error [192.0.2.2]:46213: Connection reset by peer", RuntimeError),
        ("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/0", "save_error"),
    ],
)
def test_a_save_that_loses_another_process_is_a_lost_peer_not_a_disk_error(tmp_path, monkeypatch, cause, raised):
    """A checkpoint's collective that finds another host gone must end the run as stopped (resumable), not as a
    failed write that asks to free disk space."""
    from composer.utils import checkpoint as composer_checkpoint

    from dlrecipes.records.checkpoints import CheckpointSaveError, save_atomically

    def save(state, filename, **kwargs):
        raise RuntimeError(cause)

    monkeypatch.setattr(composer_checkpoint, "save_checkpoint", save)
    expected = CheckpointSaveError if raised == "save_error" else raised
    with pytest.raises(expected) as caught:
        save_atomically(None, tmp_path / "best.pt")
    assert type(caught.value) is expected and not list(tmp_path.iterdir())
