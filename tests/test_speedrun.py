"""The airbench speedrun recipe, step for step against the `airbench` package's own train() (a test dependency,
never part of dlrecipes), and each speedrun component against its definition."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrecipes.api import resolve
from tests.conftest import REPO, fit

airbench = pytest.importorskip("airbench")

TRAIN, EVAL, BATCH, STEPS, WIDTHS = 64, 16, 16, 10, (16, 32, 32)  # 4 batches an epoch: epochs 0, 1 and half of 2


def fake_cifar(root: Path) -> Path:
    """A CIFAR-10 folder of random uint8 images, in the archive's python format (64 training, 16 test images)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = {f"data_batch_{i}": n for i, n in zip(range(1, 6), (16, 12, 12, 12, 12))} | {"test_batch": EVAL}
    for name, n in sizes.items():
        batch = {"data": rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8),
                 "labels": rng.integers(0, 10, n).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    return root


def speedrun_config(tmp_path: Path, extra=()):
    """recipes/cifar10_speedrun.yaml on the CPU in fp32, at the test's size: batch 16, 10 steps, narrow blocks; the
    decoupled weight decay converted for batch 16 as the recipe's comment converts it for 1024."""
    return resolve(REPO / "recipes" / "cifar10_speedrun.yaml", [
        f"runs_dir={tmp_path / 'runs'}", "run_name=speedrun", "plots=false", f"dataset.root={fake_cifar(tmp_path)}",
        "dataset.download=false", "trainer.device=cpu", "trainer.precision=fp32", "trainer.compile=false",
        f"trainer.batch_size={BATCH}", f"trainer.max_duration={STEPS}ba", f"trainer.eval_interval={STEPS}ba",
        "trainer.progress_bar=false", f"model.widths=[{', '.join(map(str, WIDTHS))}]",
        f"optimizer.weight_decay={0.0153 * BATCH / 11.5!r}", f"callbacks.patch_whitening.images={TRAIN}",
        "callbacks.patch_whitening.bias_epochs=1", *extra])


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
            self.net.register_forward_hook(lambda m, i, out: self.outputs.append(out.detach().clone())
                                           if m.training else None)
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


def airbench_run(monkeypatch, recorder):
    """airbench's train() (lib_airbench94's hyperparameters at batch 16) from the dlrecipes run's initial weights."""
    from airbench import lib_airbench94, utils

    airbench_on_cpu(monkeypatch)
    monkeypatch.setattr(utils, "CifarLoader", lambda *a, **k: None)  # its test set: unused with verbose=False
    outputs = []

    def make_net():
        widths = dict(zip(("block1", "block2", "block3"), WIDTHS))
        net = lib_airbench94.make_net94(widths=widths, batchnorm_momentum=0.6)
        net.load_state_dict(recorder.initial)
        net.register_forward_hook(lambda m, i, out: outputs.append(out.detach().clone()) if m.training else None)
        return net

    hyp = lib_airbench94.hyp["opt"]
    net = utils.train(ReplayLoader(recorder.batches, recorder.images), STEPS / (TRAIN // BATCH),
                      hyp["label_smoothing"], hyp["lr"], hyp["bias_scaler"], hyp["momentum"], hyp["weight_decay"],
                      1, 0, make_net, 0, False)
    return net, outputs


def summed_losses(outputs, batches):
    labels = [y for epoch in batches for _, y in epoch]
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.2, reduction="sum")
    return torch.stack([loss(out, y) for out, y in zip(outputs, labels)])


def test_the_recipe_trains_step_for_step_as_airbench94s_own_code(tmp_path, monkeypatch):
    recorder = Recorder(monkeypatch)
    fit(speedrun_config(tmp_path))
    ours = recorder.net.state_dict()
    assert len(recorder.outputs) == STEPS and [len(e) for e in recorder.batches][:2] == [4, 4]
    net, outputs = airbench_run(monkeypatch, recorder)
    assert len(outputs) == STEPS
    theirs = summed_losses(outputs, recorder.batches)
    torch.testing.assert_close(summed_losses(recorder.outputs, recorder.batches), theirs, rtol=1e-4, atol=1e-4)
    assert theirs[-1] < theirs[0]  # it learned something, so the comparison is not of two idle networks
    for name, value in net.state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert not torch.equal(ours["0.weight"], recorder.initial["0.weight"])  # whitened
    assert not torch.equal(ours["0.bias"], recorder.initial["0.bias"])  # trained in epoch 0, then frozen
