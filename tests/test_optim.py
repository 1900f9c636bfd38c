"""Optimizers (parameter groups) and schedules (multipliers over training)."""

from __future__ import annotations

import math

import pytest
import torch

from dlrecipes import registry
from dlrecipes.builders import build_optimizer
from dlrecipes.config import Component


@pytest.fixture
def net():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4, 2))


@pytest.mark.parametrize("name", registry.optimizers.names())
def test_every_optimizer_builds_and_steps(name, net):
    opt = build_optimizer(Component(name, {"lr": 0.01}), net)
    before = net[0].weight.detach().clone()
    net(torch.randn(2, 1, 3, 3)).sum().backward()
    opt.step()
    assert not torch.equal(before, net[0].weight)


@pytest.mark.parametrize("name", registry.optimizers.names())
def test_norm_and_bias_can_be_excluded_from_weight_decay(name, net):
    opt = build_optimizer(Component(name, {"lr": 0.01, "weight_decay": 0.1, "no_decay_norm_and_bias": True}), net)
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in opt.param_groups}
    assert by_decay[0.0] == {id(net[0].bias), id(net[1].weight), id(net[1].bias), id(net[3].bias)}
    assert by_decay[0.1] == {id(net[0].weight), id(net[3].weight)}
    plain = build_optimizer(Component(name, {"lr": 0.01, "weight_decay": 0.1}), net)
    assert len(plain.param_groups) == 1 and plain.param_groups[0]["weight_decay"] == 0.1


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_amp_fp16_gets_a_fused_optimizer_whose_scaler_step_reads_nothing_back(name, net):
    """A fused optimizer takes GradScaler's inf/NaN flag on the device; any other optimizer makes
    GradScaler.step read it back (.item(), a wait for the GPU) every step.  Shown with the CPU's
    GradScaler, which follows the same code."""
    def scaler_step_reads(optimizer) -> int:
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(net(torch.randn(2, 1, 3, 3)).sum()).backward()
        scaler.unscale_(optimizer)  # as Composer does before AFTER_TRAIN_BATCH
        reads, item = [], torch.Tensor.item
        torch.Tensor.item = lambda t: (reads.append(1), item(t))[1]
        try:
            scaler.step(optimizer)
        finally:
            torch.Tensor.item = item
        scaler.update()
        optimizer.zero_grad()
        return len(reads)

    fused = build_optimizer(Component(name, {"lr": 0.01}), net, fused=True)
    assert fused.defaults["fused"] is True
    assert build_optimizer(Component(name, {"lr": 0.01, "fused": False}), net, fused=True).defaults["fused"] is False
    plain = build_optimizer(Component(name, {"lr": 0.01}), net)
    assert not plain.defaults["fused"]
    assert scaler_step_reads(fused) == 0 and scaler_step_reads(plain) >= 1


@pytest.fixture
def state():
    """A Composer State at 100 batches of training (10 epochs of 10 batches)."""
    from composer.core import State, Time, Timestamp
    from composer.devices import DeviceCPU

    s = State(model=torch.nn.Linear(1, 1), rank_zero_seed=0, run_name="t", device=DeviceCPU(), max_duration="10ep")
    s.set_dataloader(list(range(10)), "train", dataloader_len=Time.from_batch(10))

    def at(batch: int):
        s.timestamp = Timestamp(epoch=batch // 10, batch=batch)
        return s

    return at


def schedule(name, **params):
    return registry.schedulers.build(name, **params)


def test_warmup_in_epochs_then_cosine(state):
    sched = schedule("cosine", warmup="2ep", alpha_f=0.1)
    assert sched(state(0)) == pytest.approx(0.0)
    assert sched(state(10)) == pytest.approx(0.5)
    assert sched(state(20)) == pytest.approx(1.0)
    assert sched(state(60)) == pytest.approx(0.1 + 0.9 * 0.5)
    assert sched(state(100)) == pytest.approx(0.1)


def test_warmup_in_batches_then_linear_and_constant(state):
    assert schedule("linear", warmup="20ba", alpha_f=0.0)(state(60)) == pytest.approx(0.5)
    assert schedule("constant", warmup="200ba")(state(50)) == pytest.approx(0.25)
    assert schedule("constant")(state(50)) == pytest.approx(1.0)


def test_step_and_multistep(state):
    step = schedule("step", step_size="3ep", gamma=0.5)
    assert [step(state(b)) for b in (0, 29, 30, 65)] == pytest.approx([1, 1, 0.5, 0.25])
    warm_step = schedule("step", step_size="3ep", gamma=0.5, warmup="1ep")
    assert warm_step(state(5)) == pytest.approx(0.5)  # halfway through warmup
    assert [warm_step(state(b)) for b in (10, 39, 40)] == pytest.approx([1, 1, 0.5])
    multi = schedule("multistep", milestones=["2ep", "5ep"], gamma=0.1, warmup="10ba")
    assert [multi(state(b)) for b in (5, 15, 30, 60)] == pytest.approx([0.5, 1, 0.1, 0.01])


def test_onecycle_rises_peaks_and_anneals(state):
    sched = schedule("onecycle", warmup="0.3dur", div_factor=10, final_div_factor=100)
    assert sched(state(0)) == pytest.approx(0.1)
    assert sched(state(30)) == pytest.approx(1.0)
    assert sched(state(15)) == pytest.approx(0.1 + 0.9 * (1 - math.cos(math.pi / 2)) / 2)
    assert sched(state(100)) == pytest.approx(0.001)
    values = [sched(state(b)) for b in range(30, 101)]
    assert all(a >= b for a, b in zip(values, values[1:]))
