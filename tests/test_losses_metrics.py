"""Losses and metrics by name: the registries, their numbers, validation, and the end-of-run report."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dlrecipes import registry
from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from dlrecipes.losses import build_loss
from tests.conftest import fit

from .conftest import run_cli

LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0], [1.0, 1.0, 1.0], [-2.0, 4.0, 0.0]])
LABELS = torch.tensor([0, 2, 1, 0])


@pytest.mark.parametrize("entry", list(registry.losses), ids=lambda e: e.name)
def test_every_loss_says_what_it_trains_and_returns_a_scalar_with_gradients(entry):
    assert entry.metadata.get("targets") in ("class", "regression")
    fn = registry.losses.build(entry.name)
    logits = LOGITS.clone().requires_grad_()
    targets = LABELS if entry.metadata["targets"] == "class" else torch.randn(4, 3)
    loss = fn(logits, targets)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert logits.grad is not None and bool(logits.grad.abs().sum() > 0)


def test_cross_entropy_with_label_smoothing_is_torch_s():
    ours = build_loss({"name": "cross_entropy", "label_smoothing": 0.1})(LOGITS, LABELS)
    assert torch.allclose(ours, F.cross_entropy(LOGITS, LABELS, label_smoothing=0.1))
    assert torch.allclose(build_loss("cross_entropy")(LOGITS, LABELS), F.cross_entropy(LOGITS, LABELS))


def test_smoothing_also_applies_to_dense_targets_as_mixup_makes_them():
    dense = F.one_hot(LABELS, 3).float()
    smoothed = build_loss({"name": "cross_entropy", "label_smoothing": 0.1})
    assert torch.allclose(smoothed(LOGITS, dense), smoothed(LOGITS, LABELS))


def test_focal_loss_down_weights_easy_samples_and_is_cross_entropy_at_gamma_0():
    assert torch.allclose(build_loss({"name": "focal", "gamma": 0.0})(LOGITS, LABELS), F.cross_entropy(LOGITS, LABELS))
    p = F.softmax(LOGITS, dim=1)[torch.arange(4), LABELS]
    expected = (-((1 - p) ** 2) * p.log()).mean()
    assert torch.allclose(build_loss("focal")(LOGITS, LABELS), expected)


def test_binary_cross_entropy_is_per_class_sigmoid():
    ours = build_loss("binary_cross_entropy")(LOGITS, LABELS)
    expected = F.binary_cross_entropy_with_logits(LOGITS, F.one_hot(LABELS, 3).float(), reduction="sum") / 4
    assert torch.allclose(ours, expected)


def _metric(name, **params):
    from dlrecipes.registry import build_component

    return build_component(registry.metrics, name, params, f"metrics.{name}", num_classes=3)


def test_metrics_compute_what_their_names_say():
    # predictions (argmax): [0, 2, 0, 1] against the labels [0, 2, 1, 0]
    values = {}
    for name, params in [
        ("top1", {}),
        ("macro_f1", {}),
        ("micro_f1", {}),
        ("precision", {}),
        ("recall", {}),
        ("accuracy", {"top_k": 2}),
        ("accuracy", {"average": "macro"}),
    ]:
        metric = _metric(name, **params)
        metric.update(LOGITS, LABELS)
        values[(name, *params.values())] = float(metric.compute())
    assert values[("top1",)] == pytest.approx(0.5) == values[("micro_f1",)]
    # class 0: precision 1/2, recall 1/2; class 1: 0, 0; class 2: 1, 1
    assert values[("precision",)] == pytest.approx((0.5 + 0 + 1) / 3)
    assert values[("recall",)] == pytest.approx((0.5 + 0 + 1) / 3) == values[("accuracy", "macro")]
    assert values[("macro_f1",)] == pytest.approx((0.5 + 0 + 1) / 3)
    assert values[("accuracy", 2)] == pytest.approx(0.75)  # sample 3 (all equal scores) counts either way


@pytest.mark.parametrize(
    "override, message",
    [
        ("loss=crossentropy", "loss: unknown loss 'crossentropy' (did you mean 'cross_entropy'?)"),
        ("loss={name: focal, gama: 2}", "loss.gama: unknown parameter of loss 'focal' (did you mean 'gamma'?)"),
        ("loss={name: cross_entropy, label_smoothing: 1.5}", "loss.label_smoothing: expected float in [0, 1), got 1.5"),
        ("metrics=[top1, macro_f2]", "metrics.macro_f2: unknown metric 'macro_f2' (did you mean 'macro_f1'?)"),
        ("metrics={f1: {average: median}}", "metrics.f1.average: expected one of 'macro', 'micro', 'weighted'"),
        ("train_metrics=[confusion_matrix]", "train_metrics.confusion_matrix: a table written for the best evaluation"),
        ("checkpoint.monitor=macro_f1", "checkpoint.monitor: 'macro_f1' is not an eval metric of this run"),
        (
            "callbacks.early_stopping={monitor: recall, split: train}",
            "callbacks.early_stopping.monitor: 'recall' is not a train metric of this run",
        ),
    ],
)
def test_loss_and_metric_mistakes_name_the_key_path(tiny_recipe, override, message):
    with pytest.raises(RecipeError) as info:
        resolve(tiny_recipe, [override])
    assert message in str(info.value)


def test_a_monitored_metric_must_be_one_the_run_computes(tiny_recipe):
    config = resolve(tiny_recipe, ["metrics=[top1, macro_f1]", "checkpoint.monitor=macro_f1"])
    assert list(config.metrics) == ["top1", "macro_f1"] and config.checkpoint.monitor == "macro_f1"
    assert resolve(tiny_recipe, ["checkpoint.monitor=loss", "checkpoint.mode=min"]).checkpoint.monitor == "loss"


@pytest.mark.slow
def test_a_run_logs_the_named_metrics_and_writes_the_best_evaluation_s_tables(tiny_recipe, tmp_path):
    result = fit(
        resolve(
            tiny_recipe,
            [
                "loss={name: focal, gamma: 1.5, label_smoothing: 0.05}",
                "metrics=[top1, macro_f1, confusion_matrix, per_class_accuracy]",
                "train_metrics=[top1, recall]",
                "checkpoint.monitor=macro_f1",
                "trainer.max_duration=3ep",
                "run_name=named",
                "plots=true",
            ],
        )
    )
    assert {"top1", "macro_f1", "loss"} == set(result.eval_metrics)
    report = result.run_dir / "report"
    with open(report / "confusion_matrix.csv") as f:
        rows = list(csv.reader(f))
    names = [str(d) for d in range(10)]
    assert rows[0] == ["true \\ predicted", *names] and [r[0] for r in rows[1:]] == names
    counts = [[int(c) for c in r[1:]] for r in rows[1:]]
    with open(report / "per_class_accuracy.csv") as f:
        per_class = list(csv.DictReader(f))
    assert [int(r["correct"]) for r in per_class] == [counts[i][i] for i in range(10)]
    assert [int(r["total"]) for r in per_class] == [sum(r) for r in counts]
    import json

    info = json.loads((report / "report.json").read_text())
    best = json.loads((result.run_dir / "checkpoints" / "best.json").read_text())
    assert (info["epoch"], info["batch"], info["monitor"]) == (best["epoch"], best["batch"], "macro_f1")
    assert math.isclose(info["value"], best["value"])
    # the best evaluation's top-1 is the matrix's diagonal over its total
    history = list(csv.DictReader(open(result.run_dir / "history.csv")))
    top1_at_best = float(next(r for r in history if int(r["epoch"]) == best["epoch"])["eval_top1"])
    assert sum(counts[i][i] for i in range(10)) / sum(map(sum, counts)) == pytest.approx(top1_at_best, abs=1e-6)
    assert (report / "confusion_matrix.png").stat().st_size > 0 and (
        report / "per_class_accuracy.png"
    ).stat().st_size > 0


def test_list_shows_the_losses_and_metrics(tmp_path):
    out = run_cli("list", "losses")
    assert out.returncode == 0 and "focal" in out.stdout and "label_smoothing" in out.stdout
    out = run_cli("list", "metrics")
    assert out.returncode == 0 and "macro_f1" in out.stdout and "confusion_matrix" in out.stdout


def test_a_plugin_can_add_a_loss(tmp_path, tiny_recipe):
    plugin = tmp_path / "my_loss.py"
    plugin.write_text(
        "from dlrecipes.registry import losses\n\n"
        "@losses.register('squared_hinge_test', targets='class')\n"
        "def squared_hinge_test(margin: float = 1.0):\n"
        "    '''Multi-class squared hinge.'''\n"
        "    import torch\n"
        "    def fn(logits, targets):\n"
        "        true = logits.gather(1, targets.view(-1, 1))\n"
        "        return torch.clamp(margin - true + logits, min=0).pow(2).mean()\n"
        "    return fn\n"
    )
    config = resolve(tiny_recipe, [f"imports=[{plugin}]", "loss={name: squared_hinge_test, margin: 0.5}"])
    assert config.loss == {"name": "squared_hinge_test", "margin": 0.5}
    assert build_loss(config.loss)(LOGITS, LABELS) > 0


def test_a_loss_is_recorded_one_way_so_a_resume_compares_equal(tiny_recipe):
    """`loss: bce`, `loss: {name: bce}` and `loss: {name: bce, label_smoothing: 0.0}` are one recipe."""
    same = [
        resolve(tiny_recipe, [override]).loss
        for override in (
            "loss=binary_cross_entropy",
            "loss={name: binary_cross_entropy}",
            "loss={name: binary_cross_entropy, label_smoothing: 0.0}",
        )
    ]
    assert same == ["binary_cross_entropy"] * 3
    assert resolve(tiny_recipe, ["loss={name: focal, label_smoothing: 0.1}"]).loss == {
        "name": "focal",
        "label_smoothing": 0.1,
    }


@pytest.mark.slow
def test_the_report_counts_every_eval_microbatch_once(tiny_recipe):
    """With evaluation in microbatches, each one's outputs are counted (not only a batch's last)."""
    from dlrecipes.metrics.report import ClassReport

    from .conftest import build_trainer, prepare_run_dir

    config = resolve(tiny_recipe, ["trainer.max_duration=1ep", "run_name=micro", "metrics=[top1, confusion_matrix]"])
    trainer = build_trainer(config, prepare_run_dir(config, "micro", resume=False))
    try:
        report = next(c for c in trainer.state.callbacks if isinstance(c, ClassReport))
        trainer.state.evaluators[0].device_eval_microbatch_size = 5  # 64-image batches in 13 microbatches
        trainer.fit()
        top1 = trainer.state.eval_metrics["eval"]["top1"]
        counted = int(report.matrix.confmat.sum())
        assert counted == 2 * 64  # eval_subset_num_batches=2 of 64 images each
        assert int(report.matrix.confmat.diagonal().sum()) == round(float(top1.compute()) * counted)
    finally:
        trainer.close()


def test_a_distributed_sampler_s_lone_padding_sample_is_left_out(monkeypatch):
    """Composer skips a last microbatch that holds only padding; the report skips it too."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader, DistributedSampler

    from dlrecipes.metrics.report import ClassReport

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = list(range(5))  # 2 ranks: 3 samples each, rank 1 gets one padding sample
    loader = DataLoader(dataset, batch_size=2, sampler=DistributedSampler(dataset, num_replicas=2, rank=1))
    report = ClassReport(Path("unused"), 3, None, ["confusion_matrix"])
    state = SimpleNamespace(dataloader=loader)
    report._batches, report._left_in_batch = 2, 0  # the last batch of rank 1: its padding sample alone
    assert report._padding_only(state, size=1)
    report._batches = 1  # an earlier batch
    assert not report._padding_only(state, size=1)
    monkeypatch.setenv("RANK", "0")  # rank 0 holds no padding
    report._batches = 2
    assert not report._padding_only(state, size=1)
