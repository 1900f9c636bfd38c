"""algorithms: tta: test-time augmentation held to airbench's infer() (levels 0, 1, 2), applied to every
evaluation of a Trainer holding it, and rebuilt by dlrecipes eval from the run's recipe."""

from __future__ import annotations

import csv
import json
import types

import pytest
import torch

from dlrecipes.algorithms.tta import tta_logits

from .conftest import run_cli


def tiny_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(5),
    )


@pytest.mark.parametrize("level", [0, 1, 2])
def test_logits_are_airbenchs_infer(level):
    """airbench's infer() (the installed airbench package, 32x32 images) and tta_logits agree at every level."""
    from airbench.utils import infer

    net = tiny_net()
    images = torch.randn(6, 3, 32, 32)
    net(images)  # the lazy layer's size
    loader = types.SimpleNamespace(images=images, normalize=lambda x: x)
    expected = infer(net, loader, tta_level=level)
    with torch.no_grad():
        assert torch.allclose(tta_logits(net, images, level), expected, atol=1e-6)


def test_level_two_is_the_definition_written_out():
    """0.5 * mirror-mean(x) + 0.25 * mirror-mean of each 1-pixel translation (reflect padding), with pad 2 too."""
    net = tiny_net()
    x = torch.randn(2, 3, 9, 9)
    net(x)

    def mean_mirror(v):
        return (net(v) + net(v.flip(-1))) / 2

    with torch.no_grad():
        for pad in (1, 2):
            padded = torch.nn.functional.pad(x, (pad,) * 4, mode="reflect")
            up_left, down_right = padded[..., :9, :9], padded[..., 2 * pad :, 2 * pad :]
            want = 0.5 * mean_mirror(x) + 0.25 * mean_mirror(up_left) + 0.25 * mean_mirror(down_right)
            assert torch.allclose(tta_logits(net, x, 2, pad=pad), want, atol=1e-6)
            assert not torch.allclose(tta_logits(net, x, 2, pad=pad), net(x), atol=1e-3)


@pytest.mark.slow
def test_eval_scores_the_run_s_own_augmented_evaluation(tiny_recipe):
    """A run with tta level 2 for one epoch: dlrecipes eval of its checkpoint gives the metrics its training's
    evaluation logged, says so in its report, and differs without it (algorithms.tta.level=0)."""
    run = run_cli("train", str(tiny_recipe), "run_name=tta", "trainer.max_duration=1ep", "algorithms={tta: {level: 2}}")
    assert run.returncode == 0, run.stderr[-3000:]
    run_dir = tiny_recipe.parent / "runs" / "tta"
    with open(run_dir / "history.csv") as f:
        last = list(csv.DictReader(f))[-1]
    result = run_cli("eval", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["tta"] == "flip_translate"
    assert report["metrics"]["loss"] == pytest.approx(float(last["eval_loss"]), rel=1e-5)
    plain = json.loads(run_cli("eval", str(run_dir), "algorithms.tta.level=0", "--json").stdout)
    assert plain["tta"] is None and plain["metrics"]["loss"] != pytest.approx(report["metrics"]["loss"], rel=1e-5)
