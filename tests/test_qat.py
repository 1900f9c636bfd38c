"""Quantization-aware training: the functions alone, a short run through the trainer, the int8 export."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from torch import nn

from dlrecipes import registry
from dlrecipes.algorithms.qat import (
    EXPORT_FILE,
    REPORT_FILE,
    check_traceable,
    convert_to_int8,
    freeze_batchnorm_stats,
    freeze_observers,
    is_qat_prepared,
    pause_observers,
    prepare_qat,
    rebind_optimizer,
    restore_observers,
)
from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from tests.conftest import fit

from .conftest import build_trainer, prepare_run_dir, write

# int8 top-1 on the digits eval split may trail the fp32 network's by at most this much.
INT8_MARGIN = 0.02

# mnist_cnn (conv-bn-relu blocks: BN folding) on 8x8 digits, QAT from the second epoch.
QAT_RECIPE = """
    model: {name: mnist_cnn, width: 4, dropout: 0.0}
    dataset: {name: digits, image_size: 8, augment: false}
    trainer:
      max_duration: 3ep
      batch_size: 64
      num_workers: 0
      progress_bar: false
      console_log_interval: 100ep
      device: cpu
      train_subset_num_batches: 3
      eval_subset_num_batches: 2
    optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
    checkpoint: {save: false}
    algorithms:
      qat: {start: 1ep, freeze_bn: 2ep, freeze_observers: 2ep}
    plots: false  # most of a short run's time; test_loggers.py plots each shape of history
"""


@pytest.fixture
def qat_recipe(tmp_path):
    path = write(tmp_path / "qat.yaml", QAT_RECIPE)
    path.write_text(path.read_text() + f"runs_dir: {tmp_path / 'runs'}\n")
    return path


def _net():
    torch.manual_seed(0)
    return registry.models.build("mnist_cnn", num_classes=10, width=4, dropout=0.0)


# --- the functions -----------------------------------------------------------------------


def test_prepare_fuses_conv_bn_relu_inserts_fake_quant_and_keeps_the_parameter_objects():
    net = _net()
    before = [id(p) for p in net.parameters()]
    prepared = prepare_qat(net, (torch.randn(2, 1, 8, 8),))
    assert not is_qat_prepared(net) and is_qat_prepared(prepared)
    fused = [m for m in prepared.modules() if type(m).__name__ == "ConvBnReLU2d"]
    norms = [name for name, m in prepared.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(fused) == 7 and len(norms) == 7 and all(n.endswith(".bn") for n in norms)  # each BN inside its conv
    assert [id(p) for p in prepared.parameters()] == before  # so the optimizer still holds them


def test_rebind_optimizer_moves_state_to_replaced_parameters_and_they_train():
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    nn.functional.cross_entropy(net(x), y).backward()
    optimizer.step()
    replaced = copy.deepcopy(net)  # new parameter objects, equal values (what a rebuilt module would hold)
    report = rebind_optimizer(optimizer, replaced)
    assert (report.kept, report.dropped, report.added) == (0, 0, 0)
    assert report.moved == len(list(net.parameters()))
    new_params = list(replaced.parameters())
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in new_params]
    assert all("momentum_buffer" in optimizer.state[p] for p in new_params)
    snapshot = [p.detach().clone() for p in new_params]
    optimizer.zero_grad()
    nn.functional.cross_entropy(replaced(x), y).backward()
    optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(snapshot, new_params))


def test_observers_pause_for_evaluation_and_resume():
    prepared = prepare_qat(_net(), (torch.randn(2, 1, 8, 8),))
    prepared(torch.randn(4, 1, 8, 8))
    ranges = {k: v.clone() for k, v in prepared.state_dict().items() if k.endswith(("min_val", "max_val"))}
    saved = pause_observers(prepared)
    prepared(10 * torch.randn(4, 1, 8, 8))
    assert all(torch.equal(prepared.state_dict()[k], v) for k, v in ranges.items())
    restore_observers(saved)
    prepared(10 * torch.randn(4, 1, 8, 8))
    assert any(not torch.equal(prepared.state_dict()[k], v) for k, v in ranges.items())


def test_frozen_batchnorm_stays_frozen_through_train_mode():
    prepared = prepare_qat(_net(), (torch.randn(2, 1, 8, 8),))
    freeze_batchnorm_stats(prepared)
    prepared.eval().train()  # what Composer does around every evaluation
    fused = [m for m in prepared.modules() if type(m).__name__ == "ConvBnReLU2d"]
    assert fused and all(m.freeze_bn and not m.bn.training for m in fused)


def test_residual_network_converts_to_int8_close_to_its_fake_quant_outputs():
    torch.manual_seed(0)
    net = registry.models.build("cifar_resnet18", num_classes=10)
    x = torch.randn(4, 3, 16, 16)
    prepared = prepare_qat(net, (x,))
    prepared(torch.randn(8, 3, 16, 16))  # one training step's worth of observed ranges
    freeze_observers(prepared.eval())  # (observers would otherwise keep observing in eval mode too)
    int8 = convert_to_int8(prepared)
    assert "quantized.add" in int8.code  # the residual additions run in int8 too
    with torch.no_grad():
        reference, quantized = prepared(x), int8(x)
    (output,) = [n for n in prepared.graph.nodes if n.op == "output"]
    step = float(prepared.get_submodule(output.args[0].target).scale)  # the logits' quantization step
    assert (quantized - reference).abs().max() <= 3 * step  # rounding may differ by a step or two, no more


def test_untraceable_network_is_named():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x) if x.sum() > 0 else -self.fc(x)

    with pytest.raises(ValueError, match="Branchy cannot be traced by torch.fx"):
        check_traceable(Branchy())


# --- through the trainer -----------------------------------------------------------------


class _Watch:
    """A callback recording, after every batch, whether the network is prepared and its weights."""

    def __init__(self):
        self.prepared, self.weights, self.frozen, self.observing_in_eval = [], [], [], []

    def run_event(self, event, state, logger):
        from composer.core import Event

        if event == Event.EVAL_BATCH_START:
            enabled = [int(m.observer_enabled) for m in state.model.module.modules() if hasattr(m, "observer_enabled")]
            self.observing_in_eval.append(any(enabled))
        if event == Event.BATCH_END:
            net = state.model.module
            self.prepared.append(is_qat_prepared(net))
            self.weights.append(torch.cat([p.detach().flatten().clone() for p in net.parameters()]))
            fused = [m for m in net.modules() if hasattr(m, "freeze_bn")]
            self.frozen.append(bool(fused) and all(m.freeze_bn for m in fused))


@pytest.mark.slow
def test_qat_switches_at_start_keeps_training_freezes_and_exports(qat_recipe):
    from composer import Callback

    config = resolve(qat_recipe)
    run_dir = prepare_run_dir(config, "qat", resume=False)
    trainer = build_trainer(config, run_dir)
    watch = _Watch()
    trainer.state.callbacks.append(type("Watch", (Callback,), {"run_event": watch.run_event})())
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert watch.prepared == [False] * 3 + [True] * 6  # 3 batches an epoch, QAT from epoch 1
    steps = [not torch.equal(a, b) for a, b in zip(watch.weights, watch.weights[1:])]
    assert all(steps[3:]), "the optimizer must update the fused network's parameters"
    assert watch.frozen == [False] * 6 + [True] * 3  # freeze_bn: 2ep
    assert watch.observing_in_eval == [False] * 6  # 2 eval batches an epoch: eval data never moves the ranges
    net = trainer.state.model.module
    assert all(int(m.observer_enabled) == 0 for m in net.modules() if hasattr(m, "observer_enabled"))
    report = json.loads((run_dir / "export" / REPORT_FILE).read_text())
    assert report["qat_started_at"] == {"epoch": 1, "batch": 3}
    assert (run_dir / "export" / EXPORT_FILE).stat().st_size == report["bytes"]["int8_torchscript"]


def _observer_ranges(net):
    """Every observer's range (activations: per tensor; weights: per channel), by state-dict key."""
    return {k: v.clone() for k, v in net.state_dict().items() if k.endswith(("min_val", "max_val"))}


def _all_or_none(flags):
    return None if not flags else "all" if all(flags) else "none" if not any(flags) else "some"


@pytest.mark.slow
def test_freezing_at_start_waits_for_one_observed_batch(qat_recipe):
    """Observers that never saw a batch have no range to convert with; a freeze at start comes one batch later."""
    from composer import Callback
    from composer.core import Event

    config = resolve(
        qat_recipe, ["trainer.max_duration=2ep", "algorithms.qat={start: 1ep, freeze_bn: 1ep, freeze_observers: 1ep}"]
    )
    run_dir = prepare_run_dir(config, "qat", resume=False)
    trainer = build_trainer(config, run_dir)
    observing, bn_frozen, ranges = [], [], []  # after every batch; None before the switch

    def run_event(self, event, state, logger):
        if event != Event.BATCH_END:
            return
        net = state.model.module
        quantizers = [m for m in net.modules() if hasattr(m, "observer_enabled")]
        fused = [m for m in net.modules() if hasattr(m, "freeze_bn")]
        observing.append(_all_or_none([bool(m.observer_enabled) for m in quantizers]))
        bn_frozen.append(_all_or_none([bool(m.freeze_bn) for m in fused]))
        ranges.append(_observer_ranges(net) if quantizers else None)

    trainer.state.callbacks.append(type("Watch", (Callback,), {"run_event": run_event})())
    try:
        trainer.fit()
    finally:
        trainer.close()
    # 3 batches an epoch, QAT from batch 3: that batch trains with every observer on, the freezes come at batch 4
    assert observing == [None] * 3 + ["all", "none", "none"]
    assert bn_frozen == [None] * 3 + ["none", "all", "all"]
    first = ranges[3]
    assert first and all(torch.isfinite(v).all() and v.numel() for v in first.values()), (
        "every observer has a range from the one batch it saw before the freeze"
    )
    assert all(torch.equal(later[k], v) for later in ranges[4:] for k, v in first.items()), (
        "frozen after that one batch: the ranges never move again"
    )
    assert (run_dir / "export" / EXPORT_FILE).exists()


@pytest.mark.slow
def test_int8_export_matches_the_fp32_accuracy_on_the_digits(qat_recipe):
    """Full digits, 8 epochs (QAT from the 4th): the int8 file is within INT8_MARGIN of fp32."""
    config = resolve(
        qat_recipe,
        [
            "trainer.max_duration=8ep",
            "trainer.train_subset_num_batches=-1",
            "trainer.eval_subset_num_batches=-1",
            "model.width=8",
            "optimizer={name: adamw, lr: 0.003}",
            "scheduler={name: onecycle, warmup: 0.25dur}",
            "algorithms.qat={start: 4ep, freeze_bn: 6ep, freeze_observers: 7ep}",
        ],
    )
    result = fit(config)
    report = json.loads((result.run_dir / "export" / REPORT_FILE).read_text())
    top1 = report["top1"]
    assert top1["fake_quant"] == pytest.approx(result.eval_metrics["top1"], abs=1e-6)
    assert top1["fp32_no_fake_quant"] > 0.9, top1  # a trained network, not chance
    assert top1["int8"] >= top1["fake_quant"] - INT8_MARGIN, top1
    assert top1["int8"] >= top1["fp32_no_fake_quant"] - INT8_MARGIN, top1
    assert report["bytes"]["int8_state_dict"] < 0.5 * report["bytes"]["fp32_state_dict"]
    # the file runs alone, on images of any batch size
    torch.backends.quantized.engine = report["backend"]
    model = torch.jit.load(str(result.run_dir / "export" / EXPORT_FILE))
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)


@pytest.mark.slow
def test_checkpoint_written_after_the_switch_resumes_into_the_prepared_network(qat_recipe, tmp_path):
    common = [
        "checkpoint={save: true, save_interval: 1ep, keep: -1}",
        "run_name=resumable",
        "~algorithms.qat.freeze_bn",
        "~algorithms.qat.freeze_observers",
    ]
    first = fit(resolve(qat_recipe, [*common, "trainer.max_duration=2ep"]))
    saved = torch.load(first.run_dir / "checkpoints" / "latest-rank0.pt", weights_only=False)["state"]["model"]
    assert any("weight_fake_quant" in k for k in saved)
    (first.run_dir / "export" / REPORT_FILE).unlink()  # the resumed run writes its own
    trainer = build_trainer(resolve(qat_recipe, [*common, "trainer.max_duration=3ep"]), first.run_dir, resume=True)
    try:
        loaded = trainer.state.model.state_dict()
        assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
        trainer.fit()
        assert int(trainer.state.timestamp.batch) == 9
    finally:
        trainer.close()
    assert json.loads((first.run_dir / "export" / REPORT_FILE).read_text())["qat_started_at"] == {
        "epoch": 1,
        "batch": 3,
    }


# --- the recipe's mistakes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithms.qat={start: 3}"], "algorithms.qat.start: expected duration"),
        (["algorithms.qat={backend: arm}"], "algorithms.qat.backend: expected one of 'x86', 'fbgemm', 'qnnpack'"),
        (["algorithms.qat={start: 2ep, freeze_bn: 1ep}"], "algorithms.qat.freeze_bn: '1ep' comes before start '2ep'"),
        (["algorithms.qat={start: 3ep}"], "algorithms.qat.start: '3ep' is not before the end of training"),
        (["algorithms.qat={start: 1.0dur}"], "algorithms.qat.start: '1.0dur' is not before the end of training"),
        (["algorithms.qat={freeze_observers: 5ep}"], "algorithms.qat.freeze_observers: '5ep' is not before"),
        (
            ["algorithms.qat={strat: 1ep}"],
            "algorithms.qat.strat: unknown parameter of algorithm 'qat' (did you mean 'start'?)",
        ),
        (["algorithms.ema=true"], "algorithms: qat and ema cannot be used together"),
        (["trainer.compile=true"], "algorithms.qat: swaps the network's modules mid-training"),
        (["trainer.precision=amp_bf16"], "algorithms.qat: fake quantization needs fp32 activations"),
    ],
)
def test_bad_parameters_name_the_key(qat_recipe, overrides, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        resolve(qat_recipe, overrides, check_device=False)


def test_more_than_one_process_is_refused(qat_recipe, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RecipeError, match=re.escape("algorithms.qat: runs in a single process")):
        resolve(qat_recipe)
