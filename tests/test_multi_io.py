"""Multi-input / multi-output models: the task: section, its checks, the per-output losses and metrics."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import torch.nn.functional as F

from dlrecipes import registry
from dlrecipes.api import resolve
from dlrecipes.builders import build_datasets, build_model
from dlrecipes.config import OutputConfig, TaskConfig, validate
from dlrecipes.config.tasks import declared_io
from dlrecipes.core.outputs import metric_names
from dlrecipes.data.splits import DataIO, OutputSpec
from dlrecipes.errors import RecipeError
from dlrecipes.models.task_model import MultiIOModel, multi_io_model_params
from dlrecipes.recipe import load_recipe

from .conftest import RECIPES, run_cli, write

TASK_RECIPE = """
    model: {name: fusion_cnn, width: 8, hidden: 32}
    dataset:
      name: synthetic_multi_io
      classes: {label: 4, parity: 2}
      regression: [value]
      train_samples: 256
      eval_samples: 128
    task:
      inputs: [left, right]
      outputs:
        label: {loss: cross_entropy, weight: 1.0}
        parity: {loss: binary_cross_entropy, weight: 0.5}
        value: {loss: mse, weight: 2.0}
    trainer:
      max_duration: 4ep
      batch_size: 32
      num_workers: 0
      progress_bar: false
      device: cpu
    optimizer: {name: adamw, lr: 0.003}
    checkpoint: {monitor: label/top1, keep: 1}
"""


@pytest.fixture
def task_recipe(tmp_path):
    path = write(tmp_path / "mio.yaml", TASK_RECIPE)
    path.write_text(path.read_text() + f"runs_dir: {tmp_path / 'runs'}\n")
    return path


def check(recipe, *overrides):
    return validate(load_recipe(recipe, overrides))


def _model_and_batch(config, batch_size=16):
    torch.manual_seed(0)
    data = build_datasets(config.dataset)
    model = build_model(config.model, data, task=config.task)
    batch = [
        torch.stack([torch.as_tensor(s[i]) for s in (data.train[j] for j in range(batch_size))])
        for i in range(len(data.train[0]))
    ]
    return model, batch, data


# --- models -----------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", [e for e in registry.models if e.metadata.get("multi_io")], ids=lambda e: e.name)
def test_multi_io_models_return_one_output_per_head(entry):
    io = DataIO({"a": (1, 28, 14), "b": (3, 20, 20)}, {"x": OutputSpec("class", 7), "y": OutputSpec("regression", 3)})
    params = multi_io_model_params(entry.name, {}, io, ["a", "b"], ["x", "y"])
    model = registry.models.build(entry.name, **params).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 1, 28, 14), torch.randn(2, 3, 20, 20))
    assert {k: tuple(v.shape) for k, v in out.items()} == {"x": (2, 7), "y": (2, 3)}


def test_model_parameters_come_from_the_task_and_a_mismatch_is_refused():
    io = DataIO({"l": (1, 8, 8), "r": (2, 8, 8)}, {"c": OutputSpec("class", 5)})
    params = multi_io_model_params("fusion_cnn", {"width": 4}, io, ["r", "l"], ["c"])
    assert params == {"width": 4, "input_channels": [2, 1], "output_sizes": {"c": 5}}
    with pytest.raises(RecipeError, match=r"model.output_sizes: .* does not match the task"):
        multi_io_model_params("fusion_cnn", {"output_sizes": {"c": 4}}, io, ["l", "r"], ["c"])


# --- losses and metrics ----------------------------------------------------------------------


def test_per_output_losses_and_their_weighted_total(task_recipe):
    model, batch, _ = _model_and_batch(check(task_recipe))
    left, right, label, parity, value = batch
    outputs = model(batch)
    assert {k: tuple(v.shape) for k, v in outputs.items()} == {"label": (16, 4), "parity": (16, 2), "value": (16, 1)}
    losses = model.loss(outputs, batch)
    assert set(losses) == {"label", "parity", "value", "total"}
    expected = {
        "label": F.cross_entropy(outputs["label"], label),
        "parity": F.binary_cross_entropy_with_logits(outputs["parity"], F.one_hot(parity, 2).float(), reduction="sum")
        / 16,
        "value": F.mse_loss(outputs["value"].squeeze(1), value),
    }
    for name, loss in expected.items():
        torch.testing.assert_close(losses[name], loss)
    torch.testing.assert_close(losses["total"], expected["label"] + 0.5 * expected["parity"] + 2.0 * expected["value"])
    losses["total"].backward()  # the total trains every head
    assert all(head.weight.grad is not None for head in model.module.heads.values())


def test_eval_metrics_are_named_per_output_and_the_total_is_the_weighted_sum(task_recipe):
    model, batch, _ = _model_and_batch(check(task_recipe), batch_size=32)
    model.eval()
    metrics = model.get_metrics(is_train=False)
    assert list(metrics) == [
        "label/top1",
        "label/loss",
        "parity/top1",
        "parity/loss",
        "value/mse",
        "value/mae",
        "value/loss",
        "loss",
    ]
    assert list(model.get_metrics(is_train=True)) == ["label/top1", "parity/top1", "value/mse", "value/mae"]
    seen = []  # (batch, outputs) for the independent counts below
    with torch.no_grad():
        for half in (batch[:], [t[:16] for t in batch]):  # two batches of different sizes
            outputs = model.eval_forward(half)
            seen.append((half, outputs))
            for metric in metrics.values():
                model.update_metric(half, outputs, metric)
    values = {name: float(m.compute()) for name, m in metrics.items()}
    assert values["loss"] == pytest.approx(
        values["label/loss"] + 0.5 * values["parity/loss"] + 2.0 * values["value/loss"]
    )
    assert values["value/mse"] == pytest.approx(values["value/loss"], rel=1e-5)  # mse loss, mse metric
    # each metric over the 48 samples of both batches, counted here from the outputs
    joined = {name: torch.cat([out[name] for _, out in seen]) for name in ("label", "parity", "value")}
    label, parity, value = (torch.cat([half[i] for half, _ in seen]) for i in (2, 3, 4))
    assert values["label/top1"] == pytest.approx((joined["label"].argmax(1) == label).float().mean().item())
    assert values["parity/top1"] == pytest.approx((joined["parity"].argmax(1) == parity).float().mean().item())
    assert values["value/mae"] == pytest.approx((joined["value"].squeeze(1) - value).abs().mean().item(), rel=1e-5)
    assert values["value/mse"] == pytest.approx(((joined["value"].squeeze(1) - value) ** 2).mean().item(), rel=1e-5)
    names = metric_names(model.specs)
    assert set(names) == set(values)  # what validation accepts as a monitor is what the model logs


def test_model_outputs_may_be_a_tuple_in_the_task_order():
    io = DataIO({"a": (2,), "b": (2,)}, {"y": OutputSpec("class", 3), "z": OutputSpec("regression", 1)})

    class Sum(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls, self.reg = torch.nn.Linear(2, 3), torch.nn.Linear(2, 1)

        def forward(self, a, b):
            return self.cls(a + b), self.reg(a - b)

    # the task lists the inputs in another order than the dataset: forward(b, a)
    model = MultiIOModel(Sum(), io, ["b", "a"], {"y": ("cross_entropy", 1.0), "z": ("l1", 0.0)})
    a, b = torch.randn(4, 2), torch.randn(4, 2)
    batch = [a, b, torch.tensor([0, 1, 2, 0]), torch.randn(4)]
    out = model(batch)
    torch.testing.assert_close(out["z"], model.module.reg(b - a))
    losses = model.loss(out, batch)
    torch.testing.assert_close(losses["total"], losses["y"])  # weight 0: logged, not trained
    bad = MultiIOModel(Sum(), io, ["a", "b"], {"y": ("cross_entropy", 1.0)})
    with pytest.raises(ValueError, match="the model returned 2 outputs; the task has 1"):
        bad(batch)


# --- data ------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", [e for e in registry.datasets if e.metadata.get("io")], ids=lambda e: e.name)
def test_datasets_yield_what_they_declare(entry):
    params = {"image_size": 12} if entry.name == "digits_two_view" else {}
    data = registry.datasets.build(entry.name, **params)
    assert data.io == declared_io(entry.name, params)
    sample = data.train[0]
    assert len(sample) == len(data.io.inputs) + len(data.io.outputs)
    for x, shape in zip(sample, data.io.inputs.values()):
        assert tuple(x.shape) == shape and x.dtype == torch.float32
    for y, spec in zip(sample[len(data.io.inputs) :], data.io.outputs.values()):
        assert (0 <= int(y) < spec.size) if spec.kind == "class" else torch.as_tensor(y).dtype == torch.float32


def test_two_view_digits_are_the_halves_of_the_digits_dataset():
    single = registry.datasets.build("digits", image_size=12, augment=False)
    two = registry.datasets.build("digits_two_view", image_size=12, augment=False)
    image, digit = single.eval[7]
    left, right, digit2, parity = two.eval[7]
    assert torch.equal(torch.cat([left, right], dim=-1), image)
    assert (digit2, parity) == (digit, digit % 2) and len(two.train) == len(single.train)


# --- validation ------------------------------------------------------------------------------


def test_a_task_recipe_validates_and_recipes_without_one_resolve_as_before(task_recipe):
    config = check(task_recipe)
    assert isinstance(config.task, TaskConfig) and config.task.inputs == ["left", "right"]
    assert config.task.outputs["parity"] == OutputConfig("binary_cross_entropy", 0.5, None)
    assert list(config.task.outputs) == ["label", "parity", "value"]
    resolved = config.to_dict()
    assert "loss" not in resolved and resolved["task"]["outputs"]["value"]["loss"] == "mse"
    plain = resolve(RECIPES / "quickstart.yaml").to_dict()
    assert "task" not in plain and plain["loss"] == "cross_entropy"


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "task.inputs=[left]",
            "task.inputs: dataset 'synthetic_multi_io' yields 2 inputs (left, right) and the task names 1; add right",
        ),
        (
            "task.inputs=[left, rihgt]",
            "task.inputs: 'rihgt' is not one of the inputs of dataset 'synthetic_multi_io' (did you mean 'right'?)",
        ),
        ("task.inputs=[left, left]", "task.inputs: left named more than once"),
        (
            "dataset.classes={label: 4}",
            "task.outputs: 'parity' is not one of the outputs of dataset 'synthetic_multi_io'",
        ),
        (
            "~task.outputs.value",
            "task.outputs: dataset 'synthetic_multi_io' yields 3 outputs (label, parity, value) and the task names 2; "
            "add value",
        ),
        (
            "task.outputs.label.loss=crossentropy",
            "task.outputs.label.loss: unknown loss 'crossentropy' (did you mean 'cross_entropy'?)",
        ),
        (
            "task.outputs.label.loss=mse",
            "task.outputs.label.loss: 'mse' does not fit output 'label' of dataset 'synthetic_multi_io', which is a "
            "class label; use binary_cross_entropy, cross_entropy, focal",
        ),
        (
            "task.outputs.value.loss=cross_entropy",
            "task.outputs.value.loss: 'cross_entropy' does not fit output 'value'",
        ),
        ("task.outputs.label.weight=-1", "task.outputs.label.weight: must be 0 or more, got -1.0"),
        ("task.outputs.label.wieght=1", "task.outputs.label.wieght: unknown key (did you mean 'weight'?)"),
        (
            "task.outputs.label.num_classes=5",
            "task.outputs.label.num_classes: 5 does not match dataset 'synthetic_multi_io', "
            "whose output 'label' has 4 classes",
        ),
        ("task.outputs.value.num_classes=2", "task.outputs.value.num_classes: output 'value' is a regression target"),
        (
            "task.outputs={label: {weight: 0}, parity: {weight: 0, loss: cross_entropy}, "
            "value: {weight: 0, loss: mse}}",
            "task.outputs: every weight is 0",
        ),
        (
            "~task",
            "task: dataset 'synthetic_multi_io' yields inputs (left, right) and outputs (label, parity, value); "
            "declare them under task:",
        ),
        (
            "dataset={name: digits, image_size: 8}",
            "task: dataset 'digits' yields (image, label) pairs; a task needs a dataset that declares its inputs and "
            "outputs (digits_two_view, synthetic_multi_io)",
        ),
        (
            "model={name: cnn_simple}",
            "model.name: 'cnn_simple' takes one image and returns one set of logits; with task: use a multi-input "
            "model (fusion_cnn)",
        ),
        ("loss=binary_cross_entropy", "loss: with task:, each output names its own loss (task.outputs.<name>.loss)"),
        (
            "trainer.loader=device",
            "trainer.loader: 'device' batches single (image, label) samples; with task: use trainer.loader=torch",
        ),
        (
            "algorithms.mixup={}",
            "algorithms.mixup: mixes batch[0] as the images and batch[1] as the labels, and a task's batch is "
            "(inputs..., targets...)",
        ),
        ("algorithms.label_smoothing={}", "algorithms.label_smoothing: smooths batch[1] as the class labels"),
        (
            "algorithms.tta={}",
            "algorithms.tta: averages the logits over mirrored and shifted views of batch[0] as the images",
        ),
        (
            "checkpoint.monitor=top1",
            "checkpoint.monitor: 'top1' is not an eval metric of this task; it logs loss, label/top1, label/loss, "
            "parity/top1",
        ),
        ("callbacks.early_stopping={}", "callbacks.early_stopping.monitor: 'top1' is not an eval metric of this task"),
        (
            "callbacks.early_stopping={monitor: label/loss, split: train}",
            "callbacks.early_stopping.monitor: 'label/loss' is not a train metric of this task",
        ),
        ("task.inputs=[left, total]", "task.inputs: 'total' is not a usable name"),
        ("dataset.classes={label: 1, parity: 2}", "dataset.classes.label: needs at least 2 classes, got 1"),
    ],
)
def test_task_mistakes_name_the_key_path(task_recipe, override, message):
    with pytest.raises(RecipeError) as info:
        check(task_recipe, override)
    assert message in str(info.value)


def test_model_level_algorithms_and_monitors_are_accepted(task_recipe):
    config = check(
        task_recipe,
        "algorithms={ema: {half_life: 10ba}, gradient_clipping: {}}",
        "callbacks.early_stopping={monitor: loss, mode: min}",
        "checkpoint.monitor=value/mae",
        "checkpoint.mode=min",
    )
    assert set(config.algorithms) == {"ema", "gradient_clipping"}


def test_a_multi_io_dataset_or_model_without_a_task_is_refused(tmp_path):
    recipe = write(tmp_path / "r.yaml", "model: {name: cnn_simple}\ndataset: {name: digits}\n")
    with pytest.raises(RecipeError, match=r"^model.name: 'fusion_cnn' takes several inputs .* needs a task: section"):
        check(recipe, "model={name: fusion_cnn}")


def test_profile_and_bench_refuse_task_recipes_in_one_line(task_recipe):
    from dlrecipes.tools.bench import run_bench
    from dlrecipes.tools.model_cost import model_from_recipe

    config = check(task_recipe)
    with pytest.raises(RecipeError, match="^task: profile feeds the model one image tensor"):
        model_from_recipe(config.model, build_datasets(config.dataset))
    with pytest.raises(RecipeError, match=r"^task: bench compares with a plain \(image, label\) loop"):
        run_bench(config)


def _assert_user_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_task_mistakes_exit_2_naming_the_key(task_recipe):
    _assert_user_error(
        run_cli("validate", str(task_recipe), "task.outputs.parity.loss=bce"),
        "error: task.outputs.parity.loss: unknown loss 'bce'",
        "Valid losses:",
    )
    _assert_user_error(
        run_cli("train", str(task_recipe), "task.inputs=[left, middle]"),
        "task.inputs: 'middle' is not one of the inputs of dataset 'synthetic_multi_io'",
    )


# --- training --------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_training_logs_per_output_metrics_in_history_summary_and_best_checkpoint(task_recipe, tmp_path):
    result = run_cli("train", str(task_recipe), "run_name=mio")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "mio"
    with open(run / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for column in (
        "train_label/loss",
        "train_parity/loss",
        "train_value/loss",
        "eval_label/top1",
        "eval_parity/top1",
        "eval_value/mse",
        "eval_value/mae",
        "eval_label/loss",
    ):
        assert column in rows[0], column
    last = {k: float(v) for k, v in rows[-1].items()}
    # the totals are the weighted sums of the per-output losses
    assert last["eval_loss"] == pytest.approx(
        last["eval_label/loss"] + 0.5 * last["eval_parity/loss"] + 2.0 * last["eval_value/loss"], rel=1e-4
    )
    assert last["train_loss"] == pytest.approx(
        last["train_label/loss"] + 0.5 * last["train_parity/loss"] + 2.0 * last["train_value/loss"], rel=1e-4
    )
    # it learns: 4 classes and a regression target in [-1, 1] (variance 1/3), from noisy inputs
    first = {k: float(v) for k, v in rows[0].items()}
    assert last["eval_label/top1"] > 0.8 and last["eval_parity/top1"] > 0.85
    assert last["eval_value/mse"] < 0.1 and last["eval_loss"] < first["eval_loss"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_top1"] is None
    assert summary["final_metrics"]["label/top1"] == pytest.approx(last["eval_label/top1"])
    assert summary["best_metrics"]["value/mse"] == min(float(r["eval_value/mse"]) for r in rows)
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert best["monitor"] == "label/top1" and best["value"] == max(float(r["eval_label/top1"]) for r in rows)
    log = (run / "train-rank0.log").read_text()
    for name in (
        "metrics/eval/label/top1",
        "metrics/eval/value/mae",
        "metrics/train/parity/top1",
        "loss/train/label",
        "loss/train/value",
        "loss/train/total",
    ):
        assert name in log, name


# What an algorithm needs beyond the task recipe (as in test_algorithms.py)
ALGORITHM_SETUP = {
    "ghost_batchnorm": ["algorithms.ghost_batchnorm={ghost_batch_size: 4}"],
    "swa": [
        "trainer.max_duration=2ep",
        "algorithms.swa={swa_start: 0ep, swa_end: 2ep, update_interval: 1ep}",
        "trainer.train_subset_num_batches=1",
    ],
    "gradient_checkpointing": ["algorithms.gradient_checkpointing={targets: [Sequential]}"],  # no residual blocks here
}


REFUSED_FOR_THIS_TASK = {
    "qat": "algorithms.qat: quantizes single-output classifiers; remove the task section",
    "stochastic_depth": "algorithms.stochastic_depth: drops torchvision ResNet Bottleneck blocks",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [n for n in registry.algorithms.names() if not registry.algorithms.get(n).metadata.get("image_label_batch")]
)
def test_every_algorithm_a_task_accepts_trains_two_batches(name, task_recipe):
    """Algorithms not refused for reading (images, labels) batches work on (inputs..., targets...) ones."""
    from tests.conftest import fit

    overrides = [
        f"algorithms.{name}=true",
        "trainer.max_duration=2ba",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
        "trainer.console_log_interval=100ep",
        *ALGORITHM_SETUP.get(name, []),
    ]
    if name in REFUSED_FOR_THIS_TASK:  # a prerequisite this model or a task cannot meet: refused by name
        with pytest.raises(RecipeError, match=REFUSED_FOR_THIS_TASK[name]):
            resolve(task_recipe, overrides)
        return
    result = fit(resolve(task_recipe, overrides))
    assert result.batches == 2
    assert all(torch.isfinite(torch.tensor(v)) for v in result.eval_metrics.values())


@pytest.mark.slow
def test_the_digits_recipe_learns_both_outputs(tmp_path):
    from tests.conftest import fit

    config = resolve(
        RECIPES / "digits_multi_io.yaml",
        [
            "trainer.max_duration=4ep",
            "trainer.progress_bar=false",
            "trainer.device=cpu",
            "checkpoint.save=false",
            "checkpoint.monitor=null",
            f"runs_dir={tmp_path}",
            "run_name=digits",
        ],
    )
    result = fit(config)
    assert result.eval_metrics["digit/top1"] > 0.85 and result.eval_metrics["parity/top1"] > 0.85
