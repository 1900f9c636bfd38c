"""Callbacks: NaN monitor (stop / skip), profiler traces, early stopping and thresholds on scripted metrics."""

from __future__ import annotations

import json

import pytest
import torch
from torchmetrics import Metric

from dlrecipes.api import resolve
from tests.conftest import fit

from .conftest import run_cli, write

pytestmark = pytest.mark.slow

NAN_INJECTOR = '''
import math
from dlrecipes.registry import algorithms


@algorithms.register("nan_at_batch")
def nan_at_batch(batch: int = 5):
    """Test helper: make the loss NaN while training the given (1-based) batch."""
    from composer.core import Algorithm, Event

    class NaNAt(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_LOSS and int(state.timestamp.batch) + 1 == batch

        def apply(self, event, state, logger):
            state.loss = state.loss * math.nan

    return NaNAt()
'''


@pytest.fixture
def nan_recipe(tiny_recipe, tmp_path):
    write(tmp_path / "nan_plugin.py", NAN_INJECTOR)
    return tiny_recipe


def test_nan_monitor_stops_naming_the_batch_and_keeps_the_last_good_checkpoint(nan_recipe, tmp_path):
    result = run_cli(
        "train",
        str(nan_recipe),
        "imports=[./nan_plugin.py]",
        "algorithms.nan_at_batch={batch: 5}",
        "callbacks.nan_monitor=true",
        "run_name=nan",
        "trainer.max_duration=3ep",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "nan_monitor: the loss is not finite at batch 5 (epoch 2)" in result.stderr
    latest = tmp_path / "runs" / "nan" / "checkpoints" / "latest-rank0.pt"
    assert str(latest) in result.stderr
    state = torch.load(latest, weights_only=False)["state"]
    assert state["timestamp"]["Timestamp"]["batch"] == 3  # end of epoch 1, before the bad batch
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_nan_monitor_skip_drops_the_bad_step_and_finishes(nan_recipe, tmp_path):
    result = fit(
        resolve(
            nan_recipe,
            [
                "imports=[./nan_plugin.py]",
                "algorithms.nan_at_batch={batch: 2}",
                "callbacks.nan_monitor={action: skip}",
                "run_name=skip",
                "trainer.max_duration=1ep",
                "trainer.console_log_interval=1ba",
            ],
        )
    )
    assert result.batches == 3
    log = (result.run_dir / "train-rank0.log").read_text()
    assert "nan_monitor/skipped_steps: 1" in log
    weights = torch.load(result.run_dir / "checkpoints" / "latest-rank0.pt", weights_only=False)["state"]["model"]
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())


def test_torch_profiler_writes_a_trace_for_the_window(tiny_recipe):
    result = fit(
        resolve(
            tiny_recipe,
            ["callbacks.torch_profiler={wait: 0, warmup: 1, active: 1}", "run_name=prof", "trainer.max_duration=1ep"],
        )
    )
    (trace,) = (result.run_dir / "profiler").glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::conv2d" for e in events)


class ScriptedAccuracy(Metric):
    """Reports the next value of a script at each evaluation (an evaluation starts with reset)."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)
        self.evaluations = -1
        self.add_state("seen", default=torch.tensor(0), dist_reduce_fx="sum")

    def reset(self):
        super().reset()
        self.evaluations += 1

    def update(self, preds, target):
        self.seen += target.numel()

    def compute(self):
        return torch.tensor(self.values[min(self.evaluations, len(self.values) - 1)])


@pytest.fixture
def scripted_top1(monkeypatch):
    from torchmetrics import MetricCollection

    from dlrecipes.models import classifier

    def script(values):
        real = classifier.classification_metrics

        def metrics(num_classes, names=None, train=False):
            collection = real(num_classes, names, train=train)
            if train:
                return collection
            return MetricCollection({"top1": ScriptedAccuracy(values), "loss": collection["loss"]})

        monkeypatch.setattr(classifier, "classification_metrics", metrics)

    return script


def test_early_stopping_stops_at_the_expected_epoch(tiny_recipe, scripted_top1):
    # best at epoch 2; epochs 3 and 4 do not improve by more than min_delta 0.01 -> patience 2 ends the run at epoch 4
    scripted_top1([0.50, 0.60, 0.605, 0.59, 0.70, 0.80, 0.90])
    result = fit(
        resolve(
            tiny_recipe,
            [
                "callbacks.early_stopping={monitor: top1, patience: 2, min_delta: 0.01}",
                "run_name=early",
                "trainer.max_duration=7ep",
                "checkpoint.monitor=null",
            ],
        )
    )
    assert result.epochs == 4


def test_threshold_stopper_stops_when_the_metric_gets_there(tiny_recipe, scripted_top1):
    scripted_top1([0.2, 0.4, 0.95, 0.96, 0.97])
    result = fit(
        resolve(
            tiny_recipe,
            [
                "callbacks.threshold_stopper={threshold: 0.9}",
                "run_name=threshold",
                "trainer.max_duration=5ep",
                "checkpoint.monitor=null",
            ],
        )
    )
    assert result.epochs == 3
