"""Optimizers (parameter groups) and schedules (multipliers over training)."""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch

from dlrecipes import registry
from dlrecipes.builders import build_optimizer
from dlrecipes.config import Component


@pytest.fixture
def net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(), torch.nn.Linear(4, 2)
    )


@pytest.mark.parametrize("name", registry.optimizers.names())
def test_every_optimizer_builds_and_steps(name, net):
    """Every entry, timm's included, with its default settings but lr.  Two steps: ADOPT's first only sets its
    second moment; a squared output: the sum of a BatchNorm's outputs gives the layers below it no gradient."""
    opt = build_optimizer(Component(name, {"lr": 0.01}), net)
    before = net[0].weight.detach().clone()
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(4, 1, 3, 3)).square().sum().backward()
        opt.step()
    assert not torch.equal(before, net[0].weight)


# muon gives norms and biases to its second optimizer, which has its own no_decay_norm_and_bias (tests/test_muon.py)
@pytest.mark.parametrize("name", [n for n in registry.optimizers.names() if n != "muon"])
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


# --- timm's optimizers and schedules ------------------------------------------------------------------------------

TIMM_ASKED_FOR = ("lamb", "lars", "lion", "rmsproptf", "rmsprop_tf", "adabelief", "adopt")


def test_timms_optimizers_are_registered_by_name_beside_ours():
    names = set(registry.optimizers.names())
    assert set(TIMM_ASKED_FOR) <= names and {"sgd", "adamw", "decoupled_sgdw", "decoupled_adamw"} <= names
    assert registry.optimizers.get("sgd").factory.__module__ == "dlrecipes.optim.registered"  # ours, not timm's
    assert not names & {"momentum", "nesterov", "adahessian", "kron", "bnbadam", "fusedlamb"}
    lamb = registry.optimizers.get("lamb").parameters
    assert list(lamb)[:6] == ["lr", "bias_correction", "betas", "eps", "weight_decay", "grad_averaging"]
    assert lamb["betas"].default == (0.9, 0.999) and lamb["weight_decay"].default == 0.01
    assert "no_decay_norm_and_bias" in lamb and "foreach" not in lamb
    assert registry.optimizers.get("lars").parameters["momentum"].default == 0.9  # as timm's factory gives it
    assert registry.optimizers.get("lambw").parameters["decoupled_decay"].default is True  # timm's setting for it
    assert registry.optimizers.get("sgdp").parameters["lr"].default is inspect.Parameter.empty  # required


def test_the_shipped_timm_table_is_the_installed_timm():
    """validate reads this table; rewrite it with `python -m dlrecipes.optim.timm_optim`."""
    from dlrecipes.optim import timm_optim

    installed = timm_optim.installed()
    if installed["timm"] != timm_optim.shipped()["timm"]:
        pytest.skip(f"timm {installed['timm']} is installed, the table is from {timm_optim.shipped()['timm']}")
    assert json.loads(json.dumps(installed)) == timm_optim.shipped()


def test_a_timm_optimizer_is_timms_class_with_the_recipes_settings(net):
    from timm.optim import Lamb, Lion, RMSpropTF

    lamb = build_optimizer(Component("lamb", {"lr": 8e-3, "weight_decay": 0.02, "betas": [0.9, 0.98]}), net)
    assert type(lamb) is Lamb
    assert (lamb.defaults["lr"], lamb.defaults["weight_decay"], lamb.defaults["betas"]) == (8e-3, 0.02, (0.9, 0.98))
    assert lamb.defaults["eps"] == 1e-6 and lamb.defaults["trust_clip"] is False  # the table's defaults, as timm's
    assert type(build_optimizer(Component("rmsprop_tf", {"lr": 0.01}), net)) is RMSpropTF
    assert type(build_optimizer(Component("lion", {}), net)).__name__ == Lion.__name__


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "optimizer={name: lamb, momentum: 0.9}",
            r"optimizer.momentum: unknown parameter of optimizer 'lamb'\. Valid parameters: lr, bias_correction, "
            r"betas, eps, weight_decay, .*trust_clip.*, no_decay_norm_and_bias",
        ),
        (
            "optimizer={name: lars, trust_cof: 0.01}",
            r"optimizer.trust_cof: unknown parameter of optimizer 'lars' \(did you mean 'trust_coeff'\?\)",
        ),
        ("optimizer={name: lion, betas: [0.9]}", r"optimizer.betas: expected a list of 2 values, got \[0.9\]"),
        ("optimizer={name: adopt, betas: [0.9, 1.5]}", r"optimizer.betas\[1\]: expected float in \[0, 1\), got 1.5"),
        ("optimizer={name: rmsproptf, weight_decay: -1}", r"optimizer.weight_decay: expected float >= 0, got -1"),
        ("optimizer={name: sgdp}", r"optimizer.lr: missing required parameter of optimizer 'sgdp' \(float > 0\)"),
        ("optimizer={name: lamp}", r"optimizer.name: unknown optimizer 'lamp' \(did you mean 'lamb'"),
    ],
)
def test_timm_optimizer_keys_are_validated_like_any_entry(tiny_recipe, override, message):
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    with pytest.raises(RecipeError, match=message):
        resolve(tiny_recipe, [override])


def test_layerwise_decay_splits_a_timm_optimizers_groups_and_keeps_no_decay(net):
    """finetune.layer_decay (the layerwise_lr_decay algorithm) regroups whatever optimizer it is given."""
    from dlrecipes.algorithms.layerwise_lr_decay import apply_layerwise_lr_decay

    opt = build_optimizer(Component("lamb", {"lr": 0.1, "weight_decay": 0.05, "no_decay_norm_and_bias": True}), net)
    scales = apply_layerwise_lr_decay(net, opt, decay=0.5, block_depth=1)
    names = {id(p): n for n, p in net.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            assert group["weight_decay"] == (0.0 if p.ndim <= 1 else 0.05), names[id(p)]
            assert group["lr"] == pytest.approx(0.1 * scales[group["layerwise_block"]])
    assert sorted({round(g["lr"], 6) for g in opt.param_groups}) == [0.025, 0.05, 0.1]
    net(torch.randn(4, 1, 3, 3)).square().sum().backward()
    opt.step()  # Lamb steps over the split groups


def test_finetune_layer_decay_and_head_lr_with_a_timm_optimizer(tiny_recipe):
    """The Trainer as dlrecipes builds it: finetune's head group and layer-wise decay split LAMB's groups, norms
    and biases stay undecayed."""
    from dlrecipes.api import resolve

    from .conftest import build_trainer, prepare_run_dir

    config = resolve(
        tiny_recipe,
        [
            "model={name: mnist_cnn, width: 4}",
            "dataset.image_size=28",
            "checkpoint.save=false",
            "~checkpoint.monitor",
            "finetune={head_lr: 0.5, layer_decay: 0.5}",
            "optimizer={name: lamb, lr: 0.1, weight_decay: 0.05, no_decay_norm_and_bias: true}",
        ],
    )
    trainer = build_trainer(config, prepare_run_dir(config, "decay", resume=False))
    try:
        groups = trainer.state.optimizers[0].param_groups
        net = trainer.state.model.module
        assert type(trainer.state.optimizers[0]).__name__ == "Lamb"
        assert max(g["lr"] for g in groups) == 0.5 and len({g["lr"] for g in groups}) >= 3
        ndim = {id(p): p.ndim for p in net.parameters()}
        assert all(g["weight_decay"] == (0.0 if ndim[id(p)] <= 1 else 0.05) for g in groups for p in g["params"])
    finally:
        trainer.close()


def _composer_lrs(sched, groups, batches: int, per_epoch_len: int = 10, ssr: float = 1.0):
    """Each group's lr at every batch, as Composer's Trainer sets them: the schedule compiled before any batch
    is loaded, then stepped after each batch, before the batch is counted (Trainer._train_loop's order)."""
    from composer.core import State, Time, Timestamp
    from composer.devices import DeviceCPU
    from composer.optim.scheduler import compile_composer_scheduler

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in groups]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, groups)], lr=groups[0])
    state = State(
        model=torch.nn.Linear(1, 1),
        rank_zero_seed=0,
        run_name="t",
        device=DeviceCPU(),
        max_duration=f"{batches // per_epoch_len}ep",
        optimizers=opt,
    )
    state.set_dataloader(list(range(per_epoch_len)), "train", dataloader_len=Time.from_batch(per_epoch_len))
    state.timestamp = Timestamp()
    lambda_lr = compile_composer_scheduler(sched, state, ssr)
    lrs = []
    for batch in range(batches):
        state.batch = torch.zeros(1)
        lrs.append([g["lr"] for g in opt.param_groups])  # the rate this batch trains with
        opt.step()
        lambda_lr.step()
        state.timestamp = Timestamp(epoch=(batch + 1) // per_epoch_len, batch=batch + 1)
    return lrs


def flat(lrs: list[list[float]]) -> list[float]:
    return [lr for group_lrs in lrs for lr in group_lrs]


def _timm_lrs(cls, groups, batches: int, per_epoch_len: int = 0, **kwargs):
    """The same from timm's own scheduler stepped by hand as timm's train.py does: step_update(n) after the n-th
    update, or step(epoch + 1) after each epoch; a group's lower rate given as its lr_scale (timm's layer decay)."""
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in groups]
    opt = torch.optim.SGD(
        [{"params": [p], "lr": groups[0], "lr_scale": lr / groups[0]} for p, lr in zip(params, groups)], lr=groups[0]
    )
    sched = cls(opt, t_in_epochs=bool(per_epoch_len), **kwargs)
    if not per_epoch_len:  # timm's train.py applies lr_scale from the first step on
        sched.step_update(0)
    else:
        sched.step(0)
    lrs = []
    for batch in range(batches):
        lrs.append([g["lr"] for g in opt.param_groups])
        if per_epoch_len and (batch + 1) % per_epoch_len == 0:
            sched.step((batch + 1) // per_epoch_len)
        elif not per_epoch_len:
            sched.step_update(batch + 1)
    return lrs


@pytest.mark.parametrize(
    "params, timm_kwargs",
    [
        (
            {"warmup": "2ep", "warmup_lr_init": 1e-3, "lr_min": 1e-4},
            {"t_initial": 100, "warmup_t": 20, "warmup_lr_init": 1e-3, "lr_min": 1e-4},
        ),
        (
            {
                "warmup": "15ba",
                "warmup_prefix": True,
                "cycle": "0.3dur",
                "cycle_limit": 3,
                "cycle_decay": 0.5,
                "k_decay": 2.0,
            },
            {
                "t_initial": 30,
                "warmup_t": 15,
                "warmup_prefix": True,
                "cycle_limit": 3,
                "cycle_decay": 0.5,
                "k_decay": 2.0,
            },
        ),
        (
            {"cycle": "2ep", "cycle_mul": 2.0, "cycle_limit": 3, "lr_min": 0.01},
            {"t_initial": 20, "cycle_mul": 2.0, "cycle_limit": 3, "lr_min": 0.01},
        ),
    ],
)
def test_timm_cosine_sets_the_rates_timms_own_scheduler_sets(params, timm_kwargs):
    from timm.scheduler import CosineLRScheduler

    groups = [0.1, 0.05]  # the second as layer-wise decay or head_lr leaves it
    ours = _composer_lrs(schedule("timm_cosine", **params), groups, 100)
    theirs = _timm_lrs(CosineLRScheduler, groups, 100, **timm_kwargs)
    assert flat(ours) == pytest.approx(flat(theirs), rel=1e-9, abs=1e-12)
    assert len({round(lr[0], 9) for lr in ours}) > 50  # a curve, not a constant


def test_timm_step_per_batch_and_per_epoch_set_the_rates_timms_own_scheduler_sets():
    from timm.scheduler import StepLRScheduler

    groups = [0.2, 0.1]
    ours = _composer_lrs(
        schedule("timm_step", decay="3ep", decay_rate=0.5, warmup="1ep", warmup_lr_init=0.01, warmup_prefix=False),
        groups,
        100,
    )
    theirs = _timm_lrs(
        StepLRScheduler, groups, 100, decay_t=30, decay_rate=0.5, warmup_t=10, warmup_lr_init=0.01, warmup_prefix=False
    )
    assert flat(ours) == pytest.approx(flat(theirs), rel=1e-9)
    per_epoch = _composer_lrs(
        schedule("timm_step", decay="3ep", decay_rate=0.5, warmup="2ep", warmup_lr_init=0.01, per_epoch=True),
        groups,
        100,
    )
    by_epoch = _timm_lrs(
        StepLRScheduler, groups, 100, per_epoch_len=10, decay_t=3, decay_rate=0.5, warmup_t=2, warmup_lr_init=0.01
    )
    assert flat(per_epoch) == pytest.approx(flat(by_epoch), rel=1e-9)
    assert len({lr[0] for lr in per_epoch[10:20]}) == 1  # held for the epoch, as timm's train.py holds it


def test_timm_cosine_per_epoch_and_with_scale_schedule_ratio():
    from timm.scheduler import CosineLRScheduler

    ours = _composer_lrs(schedule("timm_cosine", warmup="2ep", warmup_lr_init=1e-4, per_epoch=True), [0.1], 100)
    theirs = _timm_lrs(CosineLRScheduler, [0.1], 100, per_epoch_len=10, t_initial=10, warmup_t=2, warmup_lr_init=1e-4)
    assert flat(ours) == pytest.approx(flat(theirs), rel=1e-9)
    halved = _composer_lrs(schedule("timm_cosine", warmup="10ba", cycle="4ep"), [0.1], 50, ssr=0.5)  # warmup kept
    assert flat(halved) == pytest.approx(
        flat(_timm_lrs(CosineLRScheduler, [0.1], 50, t_initial=20, warmup_t=10)), rel=1e-9
    )


@pytest.mark.slow
def test_a_run_with_lamb_and_timms_cosine_trains_each_batch_at_timms_rate_and_resumes_so(tiny_recipe):
    """The tiny recipe (2 epochs of 3 batches) trained with LAMB, norms and biases undecayed, under timm's cosine,
    stopped after its first epoch's checkpoint and resumed: the rate of every batch, read as it starts, is the
    rate timm's scheduler stepped by hand gives it."""
    from composer.core import Callback
    from timm.optim import Lamb
    from timm.scheduler import CosineLRScheduler

    from dlrecipes.api import resolve
    from dlrecipes.records.checkpoints import resume_point

    from .conftest import build_trainer, prepare_run_dir

    seen = []

    class Rates(Callback):
        def before_forward(self, state, logger):
            seen.append(state.optimizers[0].param_groups[0]["lr"])

    class StopInSecondEpoch(Callback):
        def batch_start(self, state, logger):
            if int(state.timestamp.batch) == 3:  # the first epoch's checkpoint is written
                raise KeyboardInterrupt

    config = resolve(
        tiny_recipe,
        [
            "optimizer={name: lamb, lr: 0.01, weight_decay: 0.02, no_decay_norm_and_bias: true}",
            "scheduler={name: timm_cosine, warmup: 2ba, warmup_lr_init: 0.001, lr_min: 0.0001}",
            "~checkpoint.monitor",
        ],
    )
    for resume in (False, True):
        run_dir = prepare_run_dir(config, "lamb", resume=resume)
        point = resume_point(run_dir / "checkpoints", repair=False) if resume else None
        trainer = build_trainer(config, run_dir, resume=resume, resume_from=point)
        try:
            optimizer = trainer.state.optimizers[0]
            assert type(optimizer) is Lamb and {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 0.02}
            trainer.state.callbacks += [Rates()] if resume else [Rates(), StopInSecondEpoch()]
            trainer.fit()
        except KeyboardInterrupt:
            assert not resume and len(seen) == 3
        finally:
            trainer.close()
    expected = _timm_lrs(CosineLRScheduler, [0.01], 6, t_initial=6, warmup_t=2, warmup_lr_init=0.001, lr_min=0.0001)
    assert seen == pytest.approx(flat(expected), rel=1e-9)
