"""optimizer: muon: Muon on the filters (flattened to matrices, Newton-Schulz orthogonalized), a second optimizer
on the rest, one optimizer for Composer; held to its definition (airbench94_muon's Muon and torch's SGD written
out by hand here), to checkpoint round trips, and to one-line validation errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dlrecipes.builders import build_optimizer
from dlrecipes.config import Component

from .conftest import run_cli


def tiny_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 6, 3), torch.nn.BatchNorm2d(6), torch.nn.Flatten(), torch.nn.Linear(6, 3)
    )


def grads(net, seed):
    torch.manual_seed(seed)
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(torch.randn(5, 2, 3, 3)), torch.randint(0, 3, (5,))).backward()


def newton_schulz(g, steps=3, eps=1e-7):
    """Keller Jordan's quintic iteration (airbench94_muon), in float32 (airbench runs it in bfloat16)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + eps)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def test_the_update_is_near_orthogonal():
    """Momentum 0, no lr scale: the step of a conv filter (8, 4, 3, 3), flattened to (8, 36), is -lr times the
    orthogonalized gradient: its singular values lie near 1 (within [0.5, 1.5] for 'original' 3 steps, as
    airbench94_muon says; within 0.3 of 1 for the 5 'quintic' ones) and it points along the gradient's polar
    factor U V^T."""
    for coefficients, steps, spread in (("original", 3, 0.5), ("quintic", 5, 0.3)):
        net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
        opt = build_optimizer(
            Component(
                "muon",
                {
                    "lr": 0.1,
                    "momentum": 0.0,
                    "nesterov": False,
                    "adjust_lr_fn": None,
                    "ns_steps": steps,
                    "ns_coefficients": coefficients,
                },
            ),
            net,
        )
        torch.manual_seed(1)
        for p in net.parameters():
            p.grad = torch.randn_like(p)
        g = net[0].weight.grad.reshape(8, -1).clone()
        before = net[0].weight.detach().clone()
        opt.step()
        update = ((before - net[0].weight.detach()) / 0.1).reshape(8, -1)
        singular = torch.linalg.svdvals(update)
        assert singular.min() > 1 - spread and singular.max() < 1 + spread, (coefficients, singular)
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        assert torch.nn.functional.cosine_similarity(update.flatten(), (u @ vh).flatten(), dim=0) > 0.95


def test_two_steps_equal_airbenchs_muon_and_sgd_by_hand():
    """airbench94_muon's settings on a tiny network: the conv filter follows Muon (sum momentum, Nesterov, the filter
    rescaled to norm sqrt(out), 3 'original' Newton-Schulz steps, no lr scale); the conv bias and the norm's scale
    and bias follow SGD (Nesterov, L2 decay), the head (the last Linear) SGD at its own lr and decay."""
    net = tiny_net()
    ref = copy.deepcopy(net)
    lr, m, sgd_lr, sgd_m, wd, head_lr, head_wd = 0.2, 0.6, 0.05, 0.85, 0.01, 0.5, 0.002
    opt = build_optimizer(
        Component(
            "muon",
            {
                "lr": lr,
                "momentum": m,
                "nesterov": True,
                "ns_steps": 3,
                "ns_coefficients": "original",
                "adjust_lr_fn": None,
                "normalize_weights": True,
                "head_lr": head_lr,
                "head_weight_decay": head_wd,
                "other": {"name": "sgd", "lr": sgd_lr, "momentum": sgd_m, "nesterov": True, "weight_decay": wd},
            },
        ),
        net,
    )
    buffers = {}
    for seed in (1, 2):
        grads(net, seed)
        opt.step()
        grads(ref, seed)
        with torch.no_grad():
            for name, p in ref.named_parameters():
                buf = buffers.setdefault(name, torch.zeros_like(p))
                if name == "0.weight":  # Muon, as airbench94_muon writes it
                    buf.mul_(m).add_(p.grad)
                    g = p.grad + m * buf
                    p.mul_(math.sqrt(len(p)) / p.norm())
                    p.sub_(lr * newton_schulz(g.reshape(len(g), -1)).view(g.shape))
                else:  # torch's SGD with Nesterov momentum and L2 decay
                    rate, decay = (head_lr, head_wd) if name.startswith("3.") else (sgd_lr, wd)
                    d = p.grad + decay * p
                    buf.mul_(sgd_m).add_(d) if seed > 1 else buf.copy_(d)
                    p.sub_(rate * (d + sgd_m * buf))
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            # timm's Newton-Schulz runs in bfloat16, within 0.03 of float32's (the test below)
            tol = 0.03 * lr if name == "0.weight" else 1e-6
            assert (p - q).abs().max() < tol, (name, seed, (p - q).abs().max())
        ref.load_state_dict(net.state_dict())  # the next step from the same weights (the buffers go on by hand)


def test_the_orthogonalization_is_airbenchs_iteration():
    """The Newton-Schulz iteration Muon runs ('original', 3 steps) is airbench94_muon's: equal in float32; in
    bfloat16 (what Muon steps with) within 0.03 of it."""
    from timm.optim.muon import zeropower_via_newtonschulz

    torch.manual_seed(0)
    g = torch.randn(6, 18)
    coefficients = [(3.4445, -4.7750, 2.0315)]
    exact = newton_schulz(g)
    assert torch.allclose(zeropower_via_newtonschulz(g, 3, coefficients, dtype=torch.float32), exact, atol=1e-5)
    assert (zeropower_via_newtonschulz(g, 3, coefficients).float() - exact).abs().max() < 0.03


def test_schedules_reach_both_optimizers_and_the_state_round_trips():
    """The one optimizer's groups are the two's: a rate set on them (as Composer's LambdaLR does) is the rate each
    steps with; its state, saved and loaded as Composer does (torch's distributed state dict, by parameter name),
    makes a copy take the same next step."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    net = tiny_net()
    spec = Component("muon", {"lr": 0.1, "other": {"name": "sgd", "lr": 0.05, "momentum": 0.9}})
    opt = build_optimizer(spec, net)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    assert [g["lr"] for g in opt.muon.param_groups + opt.other.param_groups] == [0.05, 0.025]
    for seed in (1, 2):
        grads(net, seed)
        opt.step()
        scheduler.step()
    saved = copy.deepcopy(get_optimizer_state_dict(net, opt))
    assert {"momentum_buffer"} <= set(saved["state"]["0.weight"]) and "momentum_buffer" in saved["state"]["1.bias"]

    copy_net = copy.deepcopy(net)
    copy_opt = build_optimizer(spec, copy_net)
    before = copy_net[0].weight.detach().clone()
    set_optimizer_state_dict(copy_net, copy_opt, saved)
    assert torch.equal(copy_net[0].weight, before)  # loading (torch steps an empty optimizer at lr 0) moved nothing
    assert copy_opt.muon.state is copy_opt.state and copy_opt.other.param_groups[0] is copy_opt.param_groups[1]
    for model, optimizer in ((net, opt), (copy_net, copy_opt)):
        grads(model, 3)
        optimizer.step()
    for p, q in zip(net.parameters(), copy_net.parameters()):
        assert torch.equal(p, q)


def test_the_head_is_the_last_linear_a_named_module_or_none():
    from dlrecipes.optim.muon import split_parameters

    net = tiny_net()
    muon, other, _ = split_parameters(net, "auto")
    assert [p.shape for p in muon] == [torch.Size([6, 2, 3, 3])]
    assert [name for name, _ in other] == ["0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]
    assert len(split_parameters(net, None)[0]) == 2
    assert [p.shape for p in split_parameters(net, "0")[0]] == [torch.Size([3, 6])]  # the conv as the head


@pytest.mark.parametrize(
    "override, message, hint",
    [
        (
            "optimizer={name: muon, other: {name: sgd, momentom: 0.9}}",
            "optimizer.other.momentom: unknown parameter",
            "",
        ),
        ("optimizer={name: muon, other: {name: sgdd}}", "optimizer.other.name: unknown optimizer 'sgdd'", ""),
        (
            "optimizer={name: muon, other: {name: muon}}",
            "optimizer.other.name: the second optimizer cannot be muon",
            "",
        ),
        (
            "optimizer={name: muon, other: {name: sgd, lr: -1}}",
            "optimizer.other.lr: expected float > 0",
            "optimizer.other.lr: base learning rate",
        ),  # sgd's lr, explained
        (
            "optimizer={name: muon, other: {name: sgd, nesterov: 3}}",
            "optimizer.other.nesterov: expected bool",
            "optimizer.other.nesterov: Nesterov momentum",
        ),
        ("optimizer={name: muon, other: {lr: 0.1}}", "optimizer.other.name: missing required key", ""),
        ("optimizer={name: muon, ns_coefficients: cubic}", "optimizer.ns_coefficients", "Newton-Schulz"),
    ],
)
def test_bad_sub_keys_are_one_line_exit_2(tiny_recipe, override, message, hint):
    result = run_cli("validate", str(tiny_recipe), override, "--skip-device-check")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert message in lines[0] and "Traceback" not in result.stderr
    assert len(lines) == 1 or (len(lines) == 2 and hint in lines[1])  # the error, and the key's meaning


@pytest.mark.slow
def test_a_run_with_muon_resumes_both_optimizers_states(tiny_recipe):
    """The tiny recipe with Muon and SGD, stopped after its first epoch's checkpoint and resumed: the resumed
    optimizer holds the momentum of both (Muon's of the filters, SGD's of the rest) as they were, and the
    schedule's rate in every group; then trains on."""
    from composer.core import Callback

    from dlrecipes.api import resolve
    from dlrecipes.optim.muon import MuonWithOther
    from dlrecipes.records.checkpoints import resume_point

    from .conftest import build_trainer, prepare_run_dir

    kept = {}

    class StopInSecondEpoch(Callback):
        def batch_start(self, state, logger):
            if int(state.timestamp.batch) == 3:  # the first epoch's checkpoint is written
                optimizer = state.optimizers[0]
                kept["state"] = {
                    name: optimizer.state[p]["momentum_buffer"].clone() for name, p in state.model.named_parameters()
                }
                kept["lrs"] = [g["lr"] for g in optimizer.param_groups]
                raise KeyboardInterrupt

    config = resolve(
        tiny_recipe,
        [
            "optimizer={name: muon, lr: 0.05, normalize_weights: true, other: {name: sgd, lr: 0.02, momentum: 0.8}}",
            "scheduler={name: linear}",
            "~checkpoint.monitor",
        ],
    )
    for resume in (False, True):
        run_dir = prepare_run_dir(config, "muon", resume=resume)
        point = resume_point(run_dir / "checkpoints", repair=False) if resume else None
        trainer = build_trainer(config, run_dir, resume=resume, resume_from=point)
        try:
            optimizer = trainer.state.optimizers[0]
            assert isinstance(optimizer, MuonWithOther)
            if resume:
                for name, p in trainer.state.model.named_parameters():
                    assert torch.equal(optimizer.state[p]["momentum_buffer"], kept["state"][name]), name
                assert optimizer.muon.state is optimizer.state and optimizer.other.state is optimizer.state
                assert [g["lr"] for g in optimizer.param_groups] == pytest.approx(kept["lrs"])
            else:
                trainer.state.callbacks.append(StopInSecondEpoch())
            trainer.fit()
            assert resume and int(trainer.state.timestamp.batch) == 6
        except KeyboardInterrupt:
            assert not resume
        finally:
            trainer.close()


def test_the_second_optimizer_keeps_its_own_no_decay_groups_and_the_head_its_own():
    net = tiny_net()
    opt = build_optimizer(
        Component(
            "muon",
            {
                "weight_decay": 0.1,
                "head_lr": 0.3,
                "other": {"name": "sgd", "lr": 0.05, "weight_decay": 0.01, "no_decay_norm_and_bias": True},
            },
        ),
        net,
    )
    groups = [({id(p) for p in g["params"]}, g["lr"], g["weight_decay"]) for g in opt.param_groups]
    assert groups == [
        ({id(net[0].weight)}, 0.02, 0.1),  # the decay group held only the head: gone
        ({id(net[0].bias), id(net[1].weight), id(net[1].bias)}, 0.05, 0.0),
        ({id(net[3].bias)}, 0.3, 0.0),
        ({id(net[3].weight)}, 0.3, 0.01),
    ]  # the head: its lr
