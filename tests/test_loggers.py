"""Loggers read back with each tool's reader; history.csv, summary.json, plots, compare."""

from __future__ import annotations

import csv
import glob
import json
import math
import os
from pathlib import Path

import pytest

from dlrecipes.api import resolve
from dlrecipes.errors import UserError
from tests.conftest import fit

from . import wandb_log
from .conftest import run_cli

pytestmark = pytest.mark.slow


def _history_csv(run_dir):
    with open(run_dir / "history.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """One tiny 2-epoch run logging to TensorBoard, wandb (offline) and MLflow at once."""
    from .conftest import TINY_RECIPE, write

    tmp = tmp_path_factory.mktemp("loggers")
    recipe = write(tmp / "tiny.yaml", TINY_RECIPE)
    os.environ["WANDB_SILENT"] = "true"
    result = fit(
        resolve(
            recipe,
            [
                f"runs_dir={tmp}/runs",
                "run_name=logged",
                "trainer.console_log_interval=1ep",
                "trainer.log_interval=2",
                "plots=true",
                "loggers={tensorboard: {}, wandb: {offline: true, project: dlrecipes-test, tags: [ci]}, mlflow: {}}",
            ],
        )
    )
    return result.run_dir, _history_csv(result.run_dir)


def test_history_csv_has_a_row_per_epoch_with_every_column(logged_run, tmp_path):
    from dlrecipes.api import evaluate

    run_dir, rows = logged_run
    assert list(rows[0]) == [
        "epoch",
        "step",
        "lr",
        "train_loss",
        "eval_loss",
        "eval_top1",
        "eval_top5",
        "images_per_sec",
        "elapsed_sec",
    ]
    assert [int(r["epoch"]) for r in rows] == [1, 2] and [int(r["step"]) for r in rows] == [3, 6]
    for r in rows:
        assert all(math.isfinite(float(v)) for v in r.values())
        assert float(r["images_per_sec"]) > 0
        # each epoch's evaluation columns are that epoch's checkpoint evaluated again, apart from the run
        again = evaluate(
            run_dir,
            checkpoint=str(run_dir / "checkpoints" / f"ep{r['epoch']}-ba{r['step']}-rank0.pt"),
            out=tmp_path / f"ep{r['epoch']}",
        )
        assert again.images == 128  # eval_subset_num_batches: 2 of 64
        for column, metric in (("eval_loss", "loss"), ("eval_top1", "top1"), ("eval_top5", "top5")):
            assert float(r[column]) == pytest.approx(again.metrics[metric], abs=1e-5), (r, again.metrics)
    assert float(rows[1]["elapsed_sec"]) > float(rows[0]["elapsed_sec"])


def test_tensorboard_events_hold_the_logged_metrics(logged_run):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    run_dir, rows = logged_run
    values = {}
    for path in sorted(glob.glob(str(run_dir / "tensorboard" / "**" / "events.out.tfevents.*"), recursive=True)):
        for event in EventFileLoader(path).Load():
            for v in event.summary.value:
                if v.HasField("tensor") and v.tensor.tensor_shape.dim:
                    continue  # histograms and images; the metrics are scalars
                value = tensor_util.make_ndarray(v.tensor).item() if v.HasField("tensor") else v.simple_value
                values.setdefault(v.tag, []).append((event.step, value))
    top1 = [v for _, v in values["metrics/eval/top1"]]
    assert top1[-1] == pytest.approx(float(rows[-1]["eval_top1"]), abs=1e-6)
    # every batch's loss, at its own step (read back every log_interval (2) batches and at each epoch's end)
    assert [step for step, _ in values["loss/train/total"]] == [0, 1, 2, 3, 4, 5]


def test_wandb_offline_run_holds_the_logged_metrics(logged_run):
    run_dir, rows = logged_run
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    history = wandb_log.history(offline)
    top1 = [h["metrics/eval/top1"] for h in history if "metrics/eval/top1" in h]
    assert top1[-1] == pytest.approx(float(rows[-1]["eval_top1"]), abs=1e-6)
    losses = [h["loss/train/total"] for h in history if "loss/train/total" in h]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)  # every batch (see above)


def test_mlflow_run_holds_the_logged_metrics(logged_run):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    run_dir, rows = logged_run
    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("dlrecipes")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "logged"
    top1 = client.get_metric_history(run.info.run_id, "metrics/eval/top1")
    assert sorted(top1, key=lambda m: m.step)[-1].value == pytest.approx(float(rows[-1]["eval_top1"]), abs=1e-6)


def test_summary_and_plots_are_written(logged_run):
    run_dir, rows = logged_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["batches"] == 6 and summary["precision"] == "fp32"
    assert summary["best_top1"] == pytest.approx(max(float(r["eval_top1"]) for r in rows))
    assert summary["peak_memory_mb"] > 10
    assert all(_is_png(run_dir / name) for name in ("loss.png", "accuracy.png", "lr.png"))


def test_plots_false_writes_the_csvs_and_no_png_and_plot_draws_them_later(tiny_recipe):
    run_dir = fit(resolve(tiny_recipe, ["run_name=quiet", "plots=false", "trainer.max_duration=1ep"])).run_dir
    assert (run_dir / "history.csv").is_file() and (run_dir / "summary.json").is_file()
    assert {p.name for p in (run_dir / "report").iterdir()} == {
        "confusion_matrix.csv",
        "per_class_accuracy.csv",
        "report.json",
    }
    assert not list(run_dir.rglob("*.png"))
    assert run_cli("plot", str(run_dir)).returncode == 0
    assert sorted(p.name for p in run_dir.glob("*.png")) == ["accuracy.png", "loss.png", "lr.png"]


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_plots_on_each_history_shape(logged_run, tmp_path):
    """What the runs of other tests plotted on the way (they run with plots=false): an epoch without an evaluation
    (empty eval cells), a diverged last epoch (nan and inf losses), the eval columns of a multi-output model, a
    run of one row; and a report in which a class had no samples."""
    from dlrecipes.metrics.report import write_report
    from dlrecipes.records.plots import plot_history

    source, rows = logged_run
    extra = ["eval_digit/top1", "eval_digit/top5"]
    shaped = [dict(row, **{k: row["eval_top1"] for k in extra}) for row in rows]
    shaped[0].update(eval_loss="", eval_top1="", eval_top5="", **{k: "" for k in extra})
    shaped.append(dict(shaped[-1], epoch=str(int(shaped[-1]["epoch"]) + 1), train_loss="nan", eval_loss="inf"))
    for name, history in (("shaped", shaped), ("one_row", rows[:1])):
        run_dir = tmp_path / name
        run_dir.mkdir()
        with open(run_dir / "history.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(history[0]))
            writer.writeheader()
            writer.writerows(history)
        assert [p.name for p in plot_history(run_dir)] == ["loss.png", "accuracy.png", "lr.png"]
        assert all(_is_png(run_dir / p) for p in ("loss.png", "accuracy.png", "lr.png")), name
    matrix = [[3, 1, 0], [0, 0, 0], [1, 0, 2]]  # class 1 never came up
    written = write_report(
        tmp_path / "report",
        {"matrix": matrix, "epoch": 1, "batch": 3},
        ["a", "b", "c"],
        ["confusion_matrix", "per_class_accuracy"],
    )
    assert sorted(p.name for p in written) == [
        "confusion_matrix.csv",
        "confusion_matrix.png",
        "per_class_accuracy.csv",
        "per_class_accuracy.png",
    ]
    assert all(p.stat().st_size > 0 for p in written)
    accuracy = list(csv.DictReader(open(tmp_path / "report" / "per_class_accuracy.csv")))
    assert [r["accuracy"] for r in accuracy] == ["0.750000", "", "0.666667"]


def test_plot_and_compare_commands(logged_run, tiny_recipe, tmp_path):
    run_dir, _ = logged_run
    (run_dir / "loss.png").unlink()
    redraw = run_cli("plot", str(run_dir))
    assert redraw.returncode == 0 and (run_dir / "loss.png").exists()
    other = fit(resolve(tiny_recipe, ["run_name=other", "trainer.device_train_microbatch_size=16"])).run_dir
    out = tmp_path / "cmp.png"
    result = run_cli("compare", str(run_dir), str(other), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "logged" in result.stdout and "other" in result.stdout and "best top-1" in result.stdout
    assert out.read_bytes()[:4] == b"\x89PNG"
    as_json = json.loads(run_cli("compare", str(run_dir), str(other), "--json", "--out", str(out)).stdout)
    assert [s["microbatch"] for s in as_json] == [None, 16]
    unfinished = tmp_path / "runs" / "failed-early"
    unfinished.mkdir(parents=True)
    table = run_cli("compare", str(run_dir), str(unfinished))
    assert table.returncode == 0 and "no summary" in table.stdout and "logged" in table.stdout
    assert not Path("compare.png").exists()  # the plot is written only when asked for with --out
    missing = run_cli("compare", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "nope: not a run directory" in missing.stderr
    unwritable = run_cli("compare", str(run_dir), "--out", "/proc/x.png")
    assert unwritable.returncode == 2 and "--out: cannot write /proc/x.png" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def test_missing_optional_logger_names_the_extra(monkeypatch):
    import importlib.util

    from dlrecipes.loggers import registered as loggers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(UserError, match=r"loggers.mlflow: the 'mlflow' package is not installed.*dlrecipes\[mlflow\]"):
        loggers.mlflow("/tmp")


def test_the_terminal_and_history_show_one_learning_rate_the_recipes():
    """With several parameter groups (batch norms at 64 times the rate, airbench's bias_scaler), the terminal showed
    group 0's rate (the norms') and history.csv the last group's: both now show the rate of the parameters trained
    at the recipe's optimizer.lr, as scheduled."""
    from types import SimpleNamespace

    import torch

    from dlrecipes.loggers.terminal import TerminalReport
    from dlrecipes.optim.registered import sgd
    from dlrecipes.records.history import group_lrs, run_lr

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    optimizer = sgd(model, lr=0.1, norm_lr_scale=64.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)  # sets each group's initial_lr
    assert [group["lr"] for group in optimizer.param_groups] == [3.2, 0.05]  # the norms' group first
    state = SimpleNamespace(optimizers=[optimizer])
    assert run_lr(state) == 0.05 and TerminalReport._lr(None, state) == 0.05
    assert group_lrs(state) == {"lr/norms": 3.2}  # history.csv's column for the group at another rate
    del schedule
    assert run_lr(SimpleNamespace(optimizers=[])) is None
