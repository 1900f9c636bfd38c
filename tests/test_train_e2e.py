"""End to end: train through the CLI, save and resume, Composer's launcher, the quickstart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dlrecipes.api import resolve
from dlrecipes.recipe import RUN_RECIPE_END, RUN_RECIPE_HEADER
from tests.conftest import fit

from .conftest import REPO, build_trainer, prepare_run_dir, run_cli

pytestmark = pytest.mark.slow


def test_cli_train_writes_a_run_directory(tiny_recipe, tmp_path):
    result = run_cli("train", str(tiny_recipe), "run_name=cli-run")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "cli-run"
    assert "done: 2 epochs, 6 batches" in result.stderr
    recorded = (run / "recipe.yaml").read_text()
    assert recorded.startswith(f"{RUN_RECIPE_HEADER}name: tiny\n") and recorded.endswith(
        f"plots: false\n{RUN_RECIPE_END}"
    )
    assert (run / "checkpoints" / "latest-rank0.pt").exists()
    assert (run / "checkpoints" / "best.pt").exists() and (run / "checkpoints" / "best.json").exists()
    assert "metrics/eval/top1" in (run / "train-rank0.log").read_text()


def test_cli_reports_a_missing_dataset_folder_without_traceback(tiny_recipe, tmp_path):
    result = run_cli(
        "train",
        str(tiny_recipe),
        f"dataset={{name: image_folder, train_path: {tmp_path}/nope, val_path: {tmp_path}/nope}}",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "dataset.train_path: " in result.stderr and "nope does not exist" in result.stderr


def _model_weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.state.model.state_dict().items()}


def test_resume_continues_from_the_saved_batch_with_the_saved_weights(tiny_recipe):
    first = fit(resolve(tiny_recipe, ["run_name=resumable"]))
    assert (first.epochs, first.batches) == (2, 6)
    saved = torch.load(first.run_dir / "checkpoints" / "latest-rank0.pt", weights_only=False)["state"]["model"]

    config = resolve(tiny_recipe, ["run_name=resumable", "trainer.max_duration=3ep"])
    run_dir = prepare_run_dir(config, "resumable", resume=True)
    trainer = build_trainer(config, run_dir, resume=True)
    try:
        assert int(trainer.state.timestamp.batch) == 6 and int(trainer.state.timestamp.epoch) == 2
        restored = _model_weights(trainer)
        assert restored.keys() == saved.keys()
        assert all(torch.equal(restored[k], saved[k]) for k in saved)
        trainer.fit()
        assert int(trainer.state.timestamp.epoch) == 3 and int(trainer.state.timestamp.batch) == 9
    finally:
        trainer.close()
    assert (run_dir / "checkpoints" / "ep3-ba9-rank0.pt").exists()


def test_cli_resume_finds_the_latest_run_of_the_recipe(tiny_recipe, tmp_path):
    assert run_cli("train", str(tiny_recipe), "trainer.max_duration=1ep").returncode == 0
    (run,) = (tmp_path / "runs").iterdir()
    result = run_cli("train", str(tiny_recipe), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 2 epochs, 6 batches" in result.stderr and str(run.name) in result.stderr
    assert len(list((tmp_path / "runs").iterdir())) == 1
    missing = run_cli("train", str(tiny_recipe), "--resume", "runs_dir=" + str(tmp_path / "empty"))
    assert missing.returncode == 2 and "no run of recipe 'tiny' with a checkpoint" in missing.stderr


def test_runs_under_composers_launcher(tiny_recipe, tmp_path):
    composer = Path(sys.executable).parent / "composer"  # installed with mosaicml, next to this python
    assert composer.exists(), composer
    result = run_cli(
        str(composer),
        "-n",
        "1",
        "--stdout",
        str(tmp_path / "out{rank}.txt"),
        "--stderr",
        str(tmp_path / "err{rank}.txt"),
        str(REPO / "cli.py"),
        "train",
        str(tiny_recipe),
        "run_name=launched",
        "trainer.max_duration=1ep",
        module=False,
    )
    assert result.returncode == 0, (tmp_path / "err0.txt").read_text()[-3000:]
    assert (tmp_path / "runs" / "launched" / "checkpoints" / "ep1-ba3-rank0.pt").exists()


def test_quickstart_learns_the_embedded_digits(tmp_path):
    """The shipped recipe's training, as shipped (its PNGs and checkpoints, which change nothing it learns, left out:
    other tests write both)."""
    result = fit(
        resolve(
            REPO / "recipes" / "quickstart.yaml",
            [f"runs_dir={tmp_path}", "trainer.progress_bar=false", "plots=false", "checkpoint.save=false"],
        )
    )
    assert result.eval_metrics["top1"] >= 0.95


def test_load_path_starts_a_new_run_from_saved_weights(tiny_recipe):
    first = fit(resolve(tiny_recipe, ["run_name=source"]))
    best = first.run_dir / "checkpoints" / "best.pt"
    saved = torch.load(best, weights_only=False)["state"]["model"]
    config = resolve(tiny_recipe, ["run_name=finetune", f"checkpoint.load_path={best}"])
    run_dir = prepare_run_dir(config, "finetune", resume=False)
    trainer = build_trainer(config, run_dir)
    try:
        assert int(trainer.state.timestamp.batch) == 0  # weights only: a fresh schedule
        weights = _model_weights(trainer)
        assert all(torch.equal(weights[k], saved[k]) for k in saved)
    finally:
        trainer.close()


def test_gradient_accumulation_and_best_only_checkpoints(tiny_recipe):
    result = fit(
        resolve(
            tiny_recipe,
            [
                "run_name=accum",
                "trainer.device_train_microbatch_size=16",
                "checkpoint.best_only=true",
                "trainer.max_duration=1ep",
            ],
        )
    )
    assert result.batches == 3  # 64-sample batches, each as four microbatches of 16
    files = sorted(p.name for p in (result.run_dir / "checkpoints").iterdir())
    assert files == ["best.json", "best.pt"]


def test_resume_falls_back_from_a_truncated_checkpoint_with_a_warning(tiny_recipe, capsys):
    first = fit(resolve(tiny_recipe, ["run_name=damaged"]))
    checkpoints = first.run_dir / "checkpoints"
    newest = checkpoints / "ep2-ba6-rank0.pt"
    assert (checkpoints / "latest-rank0.pt").resolve() == newest.resolve()
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])  # a crash mid-write

    config = resolve(tiny_recipe, ["run_name=damaged", "trainer.max_duration=3ep"])
    run_dir = prepare_run_dir(config, "damaged", resume=True)
    trainer = build_trainer(config, run_dir, resume=True)
    try:
        assert "checkpoint" in capsys.readouterr().err and int(trainer.state.timestamp.batch) == 3
        trainer.fit()
        assert int(trainer.state.timestamp.batch) == 9
    finally:
        trainer.close()


def test_no_good_checkpoint_left_is_a_named_error(tiny_recipe):
    from dlrecipes.errors import DataError

    first = fit(resolve(tiny_recipe, ["run_name=ruined", "trainer.max_duration=1ep"]))
    only = first.run_dir / "checkpoints" / "ep1-ba3-rank0.pt"
    only.write_bytes(b"not a checkpoint")
    config = resolve(tiny_recipe, ["run_name=ruined", "trainer.max_duration=2ep"])
    with pytest.raises(
        DataError,
        match=r"no checkpoint in .* loads \(ep1-ba3-rank0.pt is not a dlrecipes/Composer checkpoint "
        r"\(text, 16 bytes\)\); nothing was changed",
    ):
        build_trainer(config, prepare_run_dir(config, "ruined", resume=True), resume=True)
    assert only.read_bytes() == b"not a checkpoint"  # left where it was: a refusal changes nothing


def test_a_full_disk_is_refused_before_training(tiny_recipe, monkeypatch):
    import shutil
    from collections import namedtuple

    from dlrecipes.errors import UserError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    config = resolve(tiny_recipe, ["run_name=full"])
    with pytest.raises(UserError, match=r"runs_dir: only 0 MiB free at .*checkpoints of this model need about"):
        build_trainer(config, prepare_run_dir(config, "full", resume=False))
