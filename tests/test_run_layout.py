"""The run directory's layout (dlrecipes.records.layout) and its making (dlrecipes.records.run_dir): fast, no
training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from dlrecipes.errors import UserError
from dlrecipes.recipe import RUN_RECIPE_END, RUN_RECIPE_HEADER
from dlrecipes.records.layout import (
    ExportDir,
    RunDir,
    is_periodic,
    latest_checkpoint_name,
    periodic_checkpoints_glob,
    periodic_progress,
)
from dlrecipes.records.run_dir import make_run_dir, record_recipe
from dlrecipes.records.run_files import read_recipe


def test_a_run_dir_names_every_file_a_run_writes(tmp_path):
    run = RunDir(tmp_path / "r")
    assert [
        p.relative_to(run.path).as_posix()
        for p in (
            run.recipe,
            run.summary,
            run.history,
            run.lock,
            run.log(1),
            run.checkpoints,
            run.latest,
            run.best,
            run.best_info,
            run.report,
            run.exports,
            run.eval_report("best"),
            run.profiler,
            run.tensorboard,
            run.plot("loss"),
            run.replaced_recipe("20250101-000000"),
        )
    ] == [
        "recipe.yaml",
        "summary.json",
        "history.csv",
        "run.lock",
        "train-rank1.log",
        "checkpoints",
        "checkpoints/latest-rank0.pt",
        "checkpoints/best.pt",
        "checkpoints/best.json",
        "report",
        "export",
        "eval/best",
        "profiler",
        "tensorboard",
        "loss.png",
        "recipe.before-20250101-000000.yaml",
    ]
    assert str(run.log("{rank}")).endswith("train-rank{rank}.log")  # Composer's FileLogger fills it in
    assert run.records == (run.recipe, run.summary, run.history)


def test_a_run_dir_is_a_view_of_its_path(tmp_path):
    run = RunDir(tmp_path / "r")
    assert os.fspath(run) == str(run) == str(tmp_path / "r") and Path(run) == run.path and run.name == "r"
    assert RunDir(run) == run and len({run, RunDir(str(run))}) == 1
    assert not run.path.exists() and not run.is_run()  # asking makes nothing


def test_an_export_dir_names_every_file_an_export_writes(tmp_path):
    export = ExportDir(RunDir(tmp_path / "r").exports)
    assert [
        p.relative_to(tmp_path / "r").as_posix()
        for p in (export.model("torchscript"), export.model("onnx"), export.report, export.preprocess, export.classes)
    ] == [
        "export/model.torchscript.pt",
        "export/model.onnx",
        "export/verify.json",
        "export/preprocess.json",
        "export/classes.json",
    ]
    assert export.files == (export.preprocess, export.classes, export.model("torchscript"), export.model("onnx"))
    assert os.fspath(export) == str(export) == str(tmp_path / "r" / "export") and not export.path.exists()


def test_the_run_holding_a_checkpoint(tmp_path):
    run = RunDir(tmp_path / "r")
    run.checkpoints.mkdir(parents=True)
    assert RunDir.holding(run.best) is None  # no recorded recipe: not a run
    run.recipe.write_text("name: x\n")
    assert RunDir.holding(run.best) == run
    assert RunDir.holding(tmp_path / "best.pt") is None


def test_periodic_checkpoint_names():
    assert periodic_checkpoints_glob(0) == "ep*-ba*-rank0.pt" and latest_checkpoint_name(2) == "latest-rank2.pt"
    assert periodic_progress(Path("ep3-ba9-rank0.pt")) == (3, 9) and is_periodic(Path("x/ep3-ba9-rank0.pt"))
    assert periodic_progress(Path("best.pt")) == (0, 0) and not is_periodic(Path("ep3-ba9-rank1.pt"))


def test_a_claimed_name_is_made_once(tmp_path):
    run = make_run_dir(tmp_path / "runs" / "a", claim=True)
    assert run.path.is_dir()
    with pytest.raises(FileExistsError):  # another process took the name
        make_run_dir(run.path, claim=True)
    assert make_run_dir(run.path) == run  # a named run's: made if needed


def test_a_run_dir_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"^runs_dir: cannot create run directory .*file/r: "):
        make_run_dir(tmp_path / "file" / "r")


def test_a_recipe_recorded_before_it_had_an_end_line_is_kept_on_resume(tmp_path):
    run = make_run_dir(tmp_path / "r")
    run.recipe.write_text("name: a\n")  # what an earlier dlrecipes wrote
    run.checkpoints.mkdir()
    record_recipe(run, {"name": "a"}, resume=True)
    assert run.recipe.read_text() == "name: a\n" and not list(run.path.glob("recipe.before-*.yaml"))
    assert read_recipe(run.path) == {"name": "a"}  # and it is not taken for one cut short


def test_the_recipe_recorded_and_a_replaced_one_kept(tmp_path):
    run = make_run_dir(tmp_path / "r")
    record_recipe(run, {"name": "a"}, resume=False)
    assert run.recipe.read_text() == f"{RUN_RECIPE_HEADER}name: a\n{RUN_RECIPE_END}"  # its end can be told
    record_recipe(run, {"name": "b"}, resume=True)
    assert [yaml.safe_load(p.read_text()) for p in run.path.glob("recipe.before-*.yaml")] == [{"name": "a"}]
    run.checkpoints.mkdir()
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        record_recipe(run, {"name": "b"}, resume=False)
