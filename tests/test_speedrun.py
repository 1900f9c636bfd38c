"""The airbench speedrun recipe, step for step against the `airbench` package's own train() (a test dependency,
never part of dlrecipes), and each speedrun component against its definition."""

from __future__ import annotations

import copy
import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrecipes.api import resolve
from tests.conftest import REPO, fit

# the `airbench` package (0.1.8, the dev extra's): the tests against its own code need it, the rest do not
needs_airbench = pytest.mark.skipif(importlib.util.find_spec("airbench") is None, reason="airbench is not installed")

TRAIN, EVAL, BATCH, STEPS, WIDTHS = 64, 16, 16, 10, (16, 32, 32)  # 4 batches an epoch: epochs 0, 1 and half of 2


def fake_cifar(root: Path) -> Path:
    """A CIFAR-10 folder of random uint8 images, in the archive's python format (64 training, 16 test images)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = {f"data_batch_{i}": n for i, n in zip(range(1, 6), (16, 12, 12, 12, 12))} | {"test_batch": EVAL}
    for name, n in sizes.items():
        batch = {
            "data": rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8),
            "labels": rng.integers(0, 10, n).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return root


def speedrun_config(tmp_path: Path, extra=(), recipe="cifar10_speedrun", lr=11.5):
    """recipes/cifar10_speedrun.yaml on the CPU in fp32, at the test's size: batch 16, 10 steps, narrow blocks; the
    decoupled weight decay converted for batch 16 as the recipe's comment converts it for 1024."""
    return resolve(
        REPO / "recipes" / f"{recipe}.yaml",
        [
            f"runs_dir={tmp_path / 'runs'}",
            "run_name=speedrun",
            "plots=false",
            f"dataset.root={fake_cifar(tmp_path)}",
            "dataset.download=false",
            "trainer.device=cpu",
            "trainer.precision=fp32",
            "trainer.compile=false",
            f"trainer.batch_size={BATCH}",
            f"trainer.max_duration={STEPS}ba",
            f"trainer.eval_interval={STEPS}ba",
            "trainer.progress_bar=false",
            f"model.widths=[{', '.join(map(str, WIDTHS))}]",
            f"optimizer.weight_decay={0.0153 * BATCH / lr!r}",
            f"callbacks.patch_whitening.images={TRAIN}",
            "callbacks.patch_whitening.bias_epochs=1",
            *extra,
        ],
    )


class Recorder:
    """What the dlrecipes run did: the network as built, the training batches in order, the training outputs."""

    def __init__(self, monkeypatch):
        import dlrecipes.models.architectures.airbench as arch
        from dlrecipes.data.device_loader import DeviceTensorLoader

        self.initial, self.net, self.batches, self.outputs, self.images = None, None, [], [], None
        build, iterate = arch.airbench_net, DeviceTensorLoader.__iter__

        def recorded_net(*args, **kwargs):
            self.net = build(*args, **kwargs)
            self.initial = copy.deepcopy(self.net.state_dict())
            self.net.register_forward_hook(
                lambda m, i, out: self.outputs.append(out.detach().clone()) if m.training else None
            )
            return self.net

        def recorded_iter(loader):
            if loader.train:
                self.images = loader.leading_images(TRAIN)
                epoch = []
                self.batches.append(epoch)
                for x, y in iterate(loader):
                    epoch.append((x.clone(), y.clone()))
                    yield x, y
            else:
                yield from iterate(loader)

        monkeypatch.setattr(arch, "airbench_net", recorded_net)
        monkeypatch.setattr(DeviceTensorLoader, "__iter__", recorded_iter)


class ReplayLoader:
    """airbench's CifarLoader as train() uses it, yielding the batches dlrecipes' run trained on, epoch by epoch."""

    def __init__(self, batches, images):
        self.batches, self.images, self.batch_size, self.epoch = batches, images, BATCH, 0

    def normalize(self, images):  # dlrecipes' leading images are normalised already
        return images

    def __len__(self):
        return TRAIN // BATCH

    def __iter__(self):
        self.epoch += 1
        return iter(self.batches[self.epoch - 1])


def airbench_on_cpu(monkeypatch):
    """airbench places its network on CUDA in fp16 and times with CUDA events: in this test only, on the CPU in fp32."""

    class NoEvent:
        def __init__(self, *args, **kwargs):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 0.0

    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.nn.Module, "half", lambda self: self)
    monkeypatch.setattr(torch.cuda, "Event", NoEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def airbench_run(monkeypatch, recorder, version="94"):
    """airbench's train() (lib_airbench9x's hyperparameters at batch 16) from the dlrecipes run's initial weights."""
    from airbench import utils

    lib = importlib.import_module(f"airbench.lib_airbench{version}")

    airbench_on_cpu(monkeypatch)
    monkeypatch.setattr(utils, "CifarLoader", lambda *a, **k: None)  # its test set: unused with verbose=False
    outputs = []

    def make_net():
        widths = dict(zip(("block1", "block2", "block3"), WIDTHS))
        net = getattr(lib, f"make_net{version}")(widths=widths, batchnorm_momentum=0.6)
        net.load_state_dict(recorder.initial)
        net.register_forward_hook(lambda m, i, out: outputs.append(out.detach().clone()) if m.training else None)
        return net

    hyp = lib.hyp["opt"]
    net = utils.train(
        ReplayLoader(recorder.batches, recorder.images),
        STEPS / (TRAIN // BATCH),
        hyp["label_smoothing"],
        hyp["lr"],
        hyp["bias_scaler"],
        hyp["momentum"],
        hyp["weight_decay"],
        1,
        0,
        make_net,
        0,
        False,
    )
    return net, outputs


def summed_losses(outputs, batches):
    labels = [y for epoch in batches for _, y in epoch]
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.2, reduction="sum")
    return torch.stack([loss(out, y) for out, y in zip(outputs, labels)])


# airbench96 without its cutout: Composer's cutout, the recipe's, places its square otherwise (the recipe says so)
@needs_airbench
@pytest.mark.parametrize(
    "recipe, version, lr, extra",
    [("cifar10_speedrun", "94", 11.5, []), ("cifar10_speedrun_96", "96", 9.0, ["~algorithms.cutout"])],
)
def test_the_recipe_trains_step_for_step_as_airbench_s_own_code(tmp_path, monkeypatch, recipe, version, lr, extra):
    """The same initial weights and batches (the ones the recipe's loader made: reflect-padded crops, alternating
    flips): per-step losses and final weights (and batch-norm statistics) within float tolerance, through the
    whitening, the bias frozen after epoch 0, the lookahead updates at steps 5 and 10 and the final sync."""
    recorder = Recorder(monkeypatch)
    fit(speedrun_config(tmp_path, extra, recipe, lr))
    ours = recorder.net.state_dict()
    assert len(recorder.outputs) == STEPS and [len(e) for e in recorder.batches][:2] == [4, 4]
    net, outputs = airbench_run(monkeypatch, recorder, version)
    assert len(outputs) == STEPS
    theirs = summed_losses(outputs, recorder.batches)
    torch.testing.assert_close(summed_losses(recorder.outputs, recorder.batches), theirs, rtol=1e-4, atol=1e-4)
    assert theirs[-1] < theirs[0]  # it learned something, so the comparison is not of two idle networks
    for name, value in net.state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert not torch.equal(ours["0.weight"], recorder.initial["0.weight"])  # whitened
    assert not torch.equal(ours["0.bias"], recorder.initial["0.bias"])  # trained in epoch 0, then frozen


def kilostep(momentum):
    return 1024 * (1 + 1 / (1 - momentum))


@needs_airbench
@pytest.mark.parametrize(
    "recipe, module", [("cifar10_speedrun", "lib_airbench94"), ("cifar10_speedrun_96", "lib_airbench96")]
)
def test_the_recipes_hold_airbench_s_hyperparameters(recipe, module):
    """Each key of the recipe against the package's own `hyp` (converted where the recipe's comments say so)."""
    import math

    hyp = importlib.import_module(f"airbench.{module}").hyp
    opt, aug, net = hyp["opt"], hyp["aug"], hyp["net"]
    config = resolve(REPO / "recipes" / f"{recipe}.yaml", check_device=False, check_data=False)
    optimizer, model, dataset = config.optimizer.params, config.model.params, config.dataset.params
    batches = 50_000 // opt["batch_size"]
    duration = config.trainer.max_duration
    steps = int(duration[:-2]) * (batches if duration.endswith("ep") else 1)
    assert steps == math.ceil(batches * opt["train_epochs"])
    assert config.trainer.batch_size == opt["batch_size"]
    assert math.isclose(optimizer["lr"], opt["lr"] / kilostep(opt["momentum"]), rel_tol=1e-12)
    assert math.isclose(optimizer["weight_decay"], opt["weight_decay"] * opt["batch_size"] / opt["lr"], rel_tol=1e-12)
    assert (optimizer["momentum"], optimizer["nesterov"], optimizer["norm_lr_scale"]) == (
        opt["momentum"],
        True,
        opt["bias_scaler"],
    )
    assert config.loss == {"name": "cross_entropy", "label_smoothing": opt["label_smoothing"], "reduction": "sum"}
    assert config.callbacks["patch_whitening"]["bias_epochs"] == opt["whiten_bias_epochs"]
    assert (dataset["crop_padding"], dataset["flip"], dataset["padding_mode"]) == (
        aug["translate"],
        "alternate" if aug["flip"] else None,
        "reflect",
    )
    assert list(model["widths"]) == list(net["widths"].values())
    assert math.isclose(model["batchnorm_momentum"], 1 - net["batchnorm_momentum"])
    assert math.isclose(model["scaling_factor"], net["scaling_factor"])
    assert config.algorithms["tta"]["level"] == net["tta_level"]  # at the one evaluation, the end, as train()'s
    assert config.trainer.eval_interval == config.trainer.max_duration
    if "cutout" in aug:
        assert config.algorithms["cutout"]["length"] * 32 == aug["cutout"]
    else:
        assert "cutout" not in config.algorithms
    # what train() itself fixes: the triangle's corners, lookahead's period and decay, the 5000 whitening images
    assert config.scheduler.params == {"start": 0.2, "peak": 0.23, "end": 0.07}
    assert config.callbacks["lookahead"] == {"interval": 5, "decay": 0.95**5, "power": 3.0, "final": True}
    assert config.callbacks["patch_whitening"]["images"] == 5000


# airbench94_muon.py's main() (github.com/KellerJordan/cifar10-airbench; not in the package, so written out here)
MUON_PUBLISHED = {
    "batch_size": 2000,
    "epochs": 8,
    "bias_lr": 0.053,
    "head_lr": 0.67,
    "wd": 2e-6 * 2000,
    "sgd_momentum": 0.85,
    "muon_lr": 0.24,
    "muon_momentum": 0.6,
    "ns_steps": 3,
    "label_smoothing": 0.2,
    "whiten_bias_epochs": 3,
    "whiten_images": 5000,
    "whiten_eps": 5e-4,
    "tta_level": 2,
    "head_scale": 256,
}


def test_the_muon_recipe_holds_airbench94_muon_s_settings():
    """Each setting of airbench94_muon's main() against recipes/cifar10_speedrun_muon.yaml (as its comments
    convert them: SGD's weight decay is wd / lr, the head's output divided by the feature width)."""
    import math

    published = MUON_PUBLISHED
    config = resolve(REPO / "recipes" / "cifar10_speedrun_muon.yaml", check_device=False, check_data=False)
    optimizer, other, model = config.optimizer.params, config.optimizer.params["other"], config.model.params
    assert (config.trainer.batch_size, config.trainer.max_duration) == (published["batch_size"], "8ep")
    assert config.trainer.eval_interval == config.trainer.max_duration
    assert (optimizer["lr"], optimizer["momentum"], optimizer["nesterov"], optimizer["weight_decay"]) == (
        published["muon_lr"],
        published["muon_momentum"],
        True,
        0.0,
    )
    assert (optimizer["ns_steps"], optimizer["normalize_weights"], optimizer["head"]) == (
        published["ns_steps"],
        True,
        "auto",
    )
    assert math.isclose(optimizer["head_lr"], published["head_lr"])
    assert math.isclose(optimizer["head_weight_decay"], published["wd"] / published["head_lr"], rel_tol=1e-12)
    assert (other["name"], other["lr"], other["momentum"], other["nesterov"]) == (
        "sgd",
        published["bias_lr"],
        published["sgd_momentum"],
        True,
    )
    assert math.isclose(other["weight_decay"], published["wd"] / published["bias_lr"], rel_tol=1e-12)
    assert config.loss == {"name": "cross_entropy", "label_smoothing": published["label_smoothing"], "reduction": "sum"}
    assert config.scheduler.name == "linear" and config.scheduler.params == {"alpha_i": 1.0, "alpha_f": 0.0}
    assert config.callbacks == {
        "patch_whitening": {
            "images": published["whiten_images"],
            "eps": published["whiten_eps"],
            "bias_epochs": published["whiten_bias_epochs"],
        }
    }  # no lookahead
    assert config.algorithms["tta"]["level"] == published["tta_level"]
    assert math.isclose(model["scaling_factor"], 1 / published["head_scale"])
    assert list(model["widths"]) == [64, 256, 256] and model["batchnorm_momentum"] == 1 - 0.6


@needs_airbench
@pytest.mark.parametrize("convs, module", [(2, "lib_airbench94"), (3, "lib_airbench96")])
def test_the_airbench_model_is_airbench_s_network(convs, module, monkeypatch):
    """The same state dict keys, and the same logits from the same weights (airbench's put on the CPU in fp32)."""
    from dlrecipes import registry

    airbench_on_cpu(monkeypatch)
    lib = importlib.import_module(f"airbench.{module}")
    widths = {"block1": 8, "block2": 16, "block3": 16}
    theirs = getattr(lib, f"make_net{module[-2:]}")(widths=widths, batchnorm_momentum=0.6)
    ours = registry.models.build("airbench", widths=list(widths.values()), convs_per_block=convs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert [(p.requires_grad, n) for n, p in ours.named_parameters()] == [
        (p.requires_grad, n) for n, p in theirs.named_parameters()
    ]
    for a, b in zip(ours.modules(), theirs.modules()):
        if isinstance(a, torch.nn.BatchNorm2d):
            assert (a.momentum, a.eps) == (b.momentum, b.eps)
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(ours(x), theirs(x))


def correlated_images(n=32, seed=0):
    """Images with correlated neighbouring pixels and channels, so the patch covariance is far from the identity."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 1, 16, 16, generator=g)
    smooth = torch.nn.functional.interpolate(base, size=(32, 32), mode="bilinear", align_corners=False)
    return smooth * torch.tensor([1.0, 0.8, 0.5]).view(1, 3, 1, 1) + 0.1 * torch.randn(n, 3, 32, 32, generator=g)


def test_patch_whitening_whitens_the_training_patches():
    """Definition: on the patches it was computed from, the first half of the layer's outputs has second moment
    d / (d + eps) (the identity when eps is small), and the second half is the first negated."""
    from dlrecipes.callbacks.speedrun import patch_whitening_weights

    images = correlated_images()
    filters = patch_whitening_weights(images, 2, 1e-9)
    assert filters.shape == (24, 3, 2, 2)
    out = torch.nn.functional.conv2d(images, filters).permute(0, 2, 3, 1).reshape(-1, 24).double()
    moment = out[:, :12].T @ out[:, :12] / len(out)
    torch.testing.assert_close(moment, torch.eye(12, dtype=torch.double), atol=2e-3, rtol=0)
    torch.testing.assert_close(out[:, 12:], -out[:, :12])
    patches = images.unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)
    assert not torch.allclose(patches.T @ patches / len(patches), torch.eye(12), atol=0.1)  # there was work to do


@needs_airbench
def test_patch_whitening_is_airbench_s_init_whitening_conv():
    from airbench.utils import init_whitening_conv

    from dlrecipes.callbacks.speedrun import patch_whitening_weights

    images = correlated_images(seed=1)
    layer = torch.nn.Conv2d(3, 24, 2)
    init_whitening_conv(layer, images, eps=5e-4)
    torch.testing.assert_close(patch_whitening_weights(images, 2, 5e-4), layer.weight.data)


def altflip_loader(seed=0, **kwargs):
    from dlrecipes.data.device_loader import BatchAugment, DeviceTensorLoader

    images = torch.randint(0, 256, (12, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    augment = BatchAugment((0.0,) * 3, (1.0,) * 3, hflip=True, alternate_flip=True)
    return images, DeviceTensorLoader(images, torch.arange(12), 4, augment, True, "cpu", seed, **kwargs)


def by_label(loader):
    """One epoch's images, indexed by their label (the sample's index)."""
    out = {}
    for x, y in loader:
        out.update({int(label): image for image, label in zip(x, y)})
    return torch.stack([out[i] for i in sorted(out)])


def test_alternating_flips_flip_each_image_on_every_other_epoch():
    images, loader = altflip_loader()
    raw = images.float() / 255.0
    epochs = [by_label(loader) for _ in range(4)]
    flipped = [
        torch.tensor([torch.equal(e[i], raw[i].flip(-1)) and not torch.equal(e[i], raw[i]) for i in range(12)])
        for e in epochs
    ]
    assert 0 < int(flipped[0].sum()) < 12  # a part of the images on even epochs...
    assert torch.equal(flipped[1], ~flipped[0])  # ...the others on odd ones
    assert torch.equal(flipped[2], flipped[0]) and torch.equal(flipped[3], flipped[1])
    assert torch.equal(by_label(altflip_loader()[1]), epochs[0])  # the same seed, the same flips
    resumed = altflip_loader()[1]
    resumed.epoch = 3  # a loader resumed at epoch 3 (the loaders resume by their epoch)
    assert torch.equal(by_label(resumed), epochs[3])


def test_reflect_padded_crops_are_windows_of_the_mirrored_image():
    from dlrecipes.data.device_loader import random_crop

    images = torch.rand(8, 3, 6, 6)
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2), mode="reflect")
    crops = random_crop(images, 2, torch.Generator().manual_seed(0), "reflect")
    for crop, source in zip(crops, padded):
        windows = source.unfold(1, 6, 1).unfold(2, 6, 1).permute(1, 2, 0, 3, 4).reshape(-1, 3, 6, 6)
        assert any(torch.equal(crop, w) for w in windows)


def test_lookahead_update_is_an_average_written_back():
    from dlrecipes.callbacks.speedrun import lookahead_update

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    slow = {k: torch.zeros_like(v) for k, v in model.state_dict().items() if v.is_floating_point()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lookahead_update(slow, model, 0.75)
    for name, value in model.state_dict().items():
        if value.is_floating_point():  # weights and batch-norm statistics: slow += 0.25 * (w - slow), w = slow
            torch.testing.assert_close(slow[name], 0.25 * before[name])
            torch.testing.assert_close(value, slow[name])
        else:
            assert torch.equal(value, before[name])  # num_batches_tracked
    lookahead_update(slow, model, 1.0)  # the final sync: the model becomes the slow copy, which stays
    torch.testing.assert_close(model[0].weight, 0.25 * before["0.weight"])


def test_lookahead_state_survives_a_checkpoint():
    from dlrecipes.callbacks.speedrun import Lookahead

    first = Lookahead()
    first.slow = {"w": torch.arange(3.0)}
    second = Lookahead()
    second.load_state_dict(first.state_dict())
    assert torch.equal(second.slow["w"], first.slow["w"]) and second.slow["w"] is not first.slow["w"]


def test_batchnorm_settings_reach_every_batch_norm():
    from dlrecipes.callbacks.speedrun import set_batchnorm

    model = torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
    assert set_batchnorm(model, 0.4, 1e-12, False) == 2
    for norm in (model[0], model[1][0]):
        assert (norm.momentum, norm.eps, norm.weight.requires_grad, norm.bias.requires_grad) == (
            0.4,
            1e-12,
            False,
            True,
        )
    set_batchnorm(model, None, None, None)  # null leaves each as it is
    assert (model[0].momentum, model[0].eps) == (0.4, 1e-12)


class Clock:
    """What a Composer scheduler reads of the state: the batch count, the run's length, the batch (None at init)."""

    def __init__(self, batch, total, after_a_batch=True):
        from composer.core import Time, Timestamp

        self.timestamp = Timestamp(batch=batch)
        self.max_duration = Time(total, "ba")
        self.batch = object() if after_a_batch else None
        self.dataloader_len = None


def test_the_triangle_schedule_and_its_corners():
    """start at batch 0, 1 at batch int(peak * T), end at T, straight lines between; the rate Composer sets after
    batch t is the triangle's at t + 1 (the batch it is for), at init its value at the count itself."""
    from dlrecipes import registry

    triangle = registry.schedulers.build("triangle", start=0.2, peak=0.23, end=0.07)
    total = 100
    at = [triangle(Clock(0, total, after_a_batch=False))] + [triangle(Clock(t - 1, total)) for t in range(1, total + 1)]
    assert at[0] == pytest.approx(0.2) and at[23] == pytest.approx(1.0) and at[100] == pytest.approx(0.07)
    assert at[10] == pytest.approx(0.2 + 0.8 * 10 / 23) and at[60] == pytest.approx(1 - 0.93 * 37 / 77)
    assert triangle(Clock(5, total, after_a_batch=False)) == pytest.approx(at[5])  # a resumed run's first rate


def test_norm_lr_scale_moves_batch_norm_parameters_to_a_faster_group():
    from dlrecipes import registry

    net = registry.models.build("airbench", widths=[4, 8, 8])
    optimizer = registry.optimizers.get("sgd").factory(net, lr=0.01, weight_decay=2.0, norm_lr_scale=64.0)
    fast, rest = optimizer.param_groups
    norms = {id(m.bias) for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)}
    assert {id(p) for p in fast["params"]} == norms  # the norms' biases (their scales are frozen)
    assert (fast["lr"], fast["weight_decay"], rest["lr"], rest["weight_decay"]) == (0.64, 2.0 / 64, 0.01, 2.0)
    assert not norms & {id(p) for p in rest["params"]}
    assert len(rest["params"]) == len([p for p in net.parameters() if p.requires_grad]) - len(norms)


def test_cross_entropy_sum_is_torch_s_summed_smoothed_loss():
    from dlrecipes import registry

    logits, labels = torch.randn(6, 10), torch.randint(0, 10, (6,))
    loss = registry.losses.build("cross_entropy", label_smoothing=0.2, reduction="sum")
    expected = torch.nn.CrossEntropyLoss(label_smoothing=0.2, reduction="sum")(logits, labels)
    torch.testing.assert_close(loss(logits, labels), expected)


def altflip_cifar(root: Path):
    """The CIFAR-10 stand-in (tests/stand_in_data.py: 20 training images) with alternating flips and no crops,
    normalised to [0, 1]: each training sample is its image or the image mirrored."""
    from dlrecipes.data.torchvision_sets import CIFAR10, build_cifar
    from tests.stand_in_data import cifar_batches

    cifar_batches(root / CIFAR10.folder, per_batch=4)
    return build_cifar(str(root), CIFAR10, False, True, (0.0,) * 3, (1.0,) * 3, crop=(0, "zeros", "alternate")).train


def flips_of(images, raw) -> dict[int, bool]:
    """{index: mirrored} of the training samples ``images``, each found among the ``raw`` images or their mirrors."""
    found = {}
    for image in images:
        kept = [i for i in range(len(raw)) if torch.allclose(image, raw[i])]
        mirrored = [i for i in range(len(raw)) if torch.allclose(image, raw[i].flip(-1))]
        assert len(kept + mirrored) == 1
        found[(kept + mirrored)[0]] = bool(mirrored)
    return found


def torch_loader_flips(train, seed: int, epoch: int, world=1, workers=0, resume=None) -> dict[int, bool]:
    """One epoch of the torch loader's training order (batches of 4; ``world`` processes, each with ``workers``
    DataLoader workers; ``resume``: (epoch, position) as a checkpoint records it): which images came mirrored."""
    from torch.utils.data import DataLoader

    from dlrecipes.data.order import ordered

    found = {}
    for rank in range(world):
        samples = ordered(train, 4, rank, world, seed)
        samples.sampler.set_epoch(epoch)
        if resume:
            samples.sampler.resume_at(*resume)
        loader = DataLoader(samples, batch_size=4 // world, sampler=samples.sampler, num_workers=workers)
        found.update(flips_of(torch.cat([x for x, _ in loader]), train.images.float() / 255))
    return found


def device_loader_flips(train, seed: int, epoch: int) -> dict[int, bool]:
    from dlrecipes.data.device_loader import DeviceTensorLoader

    loader = DeviceTensorLoader(train.images, train.labels, 4, train.batch_augment, True, "cpu", seed)
    loader.epoch = epoch
    return flips_of(torch.cat([x for x, _ in loader]), train.images.float() / 255)


def test_alternating_flips_of_the_torch_loader_are_the_device_loader_s(tmp_path):
    """dataset.flip: alternate with trainer.loader: torch: each image mirrored on every other epoch, the same images
    in the same epochs as the device loader for the same seed, on any number of processes and workers."""
    train = altflip_cifar(tmp_path)
    for seed in (0, 3):
        epochs = [torch_loader_flips(train, seed, epoch) for epoch in range(3)]
        assert all(len(flips) == 20 for flips in epochs)  # every image, once an epoch
        assert 0 < sum(epochs[0].values()) < 20  # a part of the images on even epochs...
        assert epochs[1] == {i: not f for i, f in epochs[0].items()} and epochs[2] == epochs[0]  # ...the rest on odd
        assert epochs == [device_loader_flips(train, seed, epoch) for epoch in range(3)]
    assert torch_loader_flips(train, 3, 1, world=2, workers=2) == epochs[1]
    assert torch_loader_flips(train, 0, 1) != epochs[1]  # another seed, other images


def test_alternating_flips_of_the_torch_loader_resume_mid_epoch(tmp_path):
    train = altflip_cifar(tmp_path)
    whole = torch_loader_flips(train, 5, 1)
    resumed = torch_loader_flips(train, 5, 1, world=2, resume=(1, 8))  # 2 of the epoch's 5 batches trained
    assert len(resumed) == 12 and resumed == {i: whole[i] for i in resumed}


def test_a_cifar_dataset_on_the_tensor_cache_loader_is_refused_in_one_line(tmp_path):
    """The tensor cache caches image folders; for CIFAR (and its alternating flips) the line names the loaders
    that read it."""
    from dlrecipes.errors import RecipeError

    with pytest.raises(
        RecipeError,
        match=r"trainer.loader: 'tensor_cache' caches image folders .*; for 'cifar10' "
        r"use trainer.loader=device \(in-memory data\) or torch$",
    ):
        fit(speedrun_config(tmp_path, ["trainer.loader=tensor_cache"]))


@pytest.mark.parametrize("loader, interval, stop", [("device", "1ep", "ep2-ba8"), ("torch", "2ba", "ep1-ba6")])
def test_a_run_resumed_mid_way_ends_with_the_uninterrupted_run_s_weights(tmp_path, monkeypatch, loader, interval, stop):
    """Lookahead's slow copy, the whitened layer, the frozen bias and the alternating flips all come back from a
    checkpoint: resumed after epoch 2 (batch 8, after the lookahead update at 5), or with the torch loader inside
    epoch 1 (batch 6: the bias frozen at epoch 1's start, which the resumed run does not see), the run ends where
    it would have."""
    from tests.conftest import build_trainer

    recorder = Recorder(monkeypatch)
    config = speedrun_config(
        tmp_path,
        [
            f"trainer.loader={loader}",
            "checkpoint.save=true",
            f"checkpoint.save_interval={interval}",
            "checkpoint.keep=-1",
        ],
    )
    fit(config)
    straight = copy.deepcopy(recorder.net.state_dict())
    folder = tmp_path / "runs" / "speedrun" / "checkpoints"
    checkpoint = next(folder.glob(f"{stop}*.pt"))
    for later in folder.glob("ep*-ba*.pt"):  # as if the run had stopped there
        if later != checkpoint:
            later.unlink()
    trainer = build_trainer(
        config, tmp_path / "runs" / "speedrun", resume=True, trust_checkpoint=True, resume_from=checkpoint
    )
    assert int(trainer.state.timestamp.batch) == int(stop.split("-ba")[1])
    trainer.fit()
    for name, value in recorder.net.state_dict().items():
        torch.testing.assert_close(value, straight[name], rtol=0, atol=0, msg=name)


def test_whitening_reads_the_same_leading_images_from_either_loader():
    """The device loader's first images and the torch loader's (its dataset read in the run's order) are the same
    normalised, un-augmented images."""
    from types import SimpleNamespace

    from dlrecipes.callbacks.speedrun import leading_images
    from dlrecipes.data.device_loader import BatchAugment, DeviceTensorLoader
    from dlrecipes.data.order import GlobalOrderSampler, OrderedSamples
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset

    images = torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    augment = BatchAugment((0.5, 0.4, 0.3), (0.2, 0.25, 0.3), crop_padding=2, hflip=True)
    device = DeviceTensorLoader(images, torch.arange(8), 4, augment, True)
    dataset = TransformedTensorDataset(images, torch.arange(8), None, augment)
    torch_loader = SimpleNamespace(dataset=OrderedSamples(dataset, GlobalOrderSampler(8, 4, 0, 1, 0)))
    expected = (images[:5].float() / 255 - torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1)) / torch.tensor(
        [0.2, 0.25, 0.3]
    ).view(1, 3, 1, 1)
    torch.testing.assert_close(leading_images(device, 5), expected)
    torch.testing.assert_close(leading_images(torch_loader, 5), expected)


def test_the_batchnorm_callback_sets_the_model_s_norms_at_init():
    from types import SimpleNamespace

    from dlrecipes import registry

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    registry.callbacks.build("batchnorm", momentum=0.4, eps=1e-12, train_weight=False).init(
        SimpleNamespace(model=model), None
    )
    assert (model[1].momentum, model[1].eps, model[1].weight.requires_grad) == (0.4, 1e-12, False)


def test_patch_whitening_of_a_network_without_a_whitening_layer_is_one_line():
    from types import SimpleNamespace

    from dlrecipes.callbacks.speedrun import PatchWhitening
    from dlrecipes.data.device_loader import DeviceTensorLoader
    from dlrecipes.errors import RecipeError

    loader = DeviceTensorLoader(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4), 2, None, True)
    state = SimpleNamespace(
        timestamp=SimpleNamespace(batch=0), model=torch.nn.Conv2d(3, 64, 3), train_dataloader=loader
    )
    with pytest.raises(
        RecipeError, match=r"callbacks.patch_whitening: .* is \(64, 3, 3, 3\); .* needs \(54, 3, 3, 3\)"
    ):
        PatchWhitening(images=4).fit_start(state, None)
