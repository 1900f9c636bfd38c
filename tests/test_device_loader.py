"""The on-device batch loader: crops, flips, order, shards and a training run."""

from __future__ import annotations

import pytest
import torch

from dlrecipes.api import resolve
from dlrecipes.data.device_loader import BatchAugment, DeviceTensorLoader, random_crop, random_hflip
from dlrecipes.errors import RecipeError
from tests.conftest import fit


def test_random_crop_takes_each_image_at_its_own_offset():
    images = torch.arange(2 * 1 * 4 * 4, dtype=torch.uint8).view(2, 1, 4, 4)
    g = torch.Generator().manual_seed(3)
    offsets = torch.randint(0, 5, (2, 2), generator=torch.Generator().manual_seed(3))
    out = random_crop(images, 2, g)
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    for b in range(2):
        oy, ox = offsets[0, b].item(), offsets[1, b].item()
        assert torch.equal(out[b], padded[b, :, oy : oy + 4, ox : ox + 4])


def test_random_hflip_flips_about_half_and_only_whole_images():
    images = torch.arange(64 * 3 * 2 * 5, dtype=torch.float32).view(64, 3, 2, 5)
    out = random_hflip(images, torch.Generator().manual_seed(0))
    flipped = [torch.equal(o, i.flip(2)) for o, i in zip(out, images)]
    kept = [torch.equal(o, i) for o, i in zip(out, images)]
    assert all(f or k for f, k in zip(flipped, kept)) and 16 < sum(flipped) < 48


def _loader(train, rank=0, world=1, n=50, batch=8, seed=1):
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    augment = BatchAugment(mean=(0.0,), std=(1 / 255,))  # undoes the /255: values are the sample ids
    return DeviceTensorLoader(images, torch.arange(n), batch, augment, train, seed=seed, rank=rank, world_size=world)


def test_train_epochs_see_each_sample_at_most_once_in_a_new_seeded_order():
    loader = _loader(train=True)
    epoch1 = torch.cat([y for _, y in loader])
    epoch2 = torch.cat([y for _, y in loader])
    assert len(epoch1) == 48 == loader.num_samples and len(set(epoch1.tolist())) == 48
    assert not torch.equal(epoch1, epoch2)
    assert torch.equal(epoch1, torch.cat([y for _, y in _loader(train=True)]))  # same seed, same order
    for x, y in _loader(train=True):
        assert torch.equal(x[:, 0, 0, 0].round().long(), y)  # images travel with their labels


def test_ranks_split_train_and_eval_without_overlap():
    shards = [torch.cat([y for _, y in _loader(True, rank=r, world=2, batch=5)]).tolist() for r in (0, 1)]
    assert not set(shards[0]) & set(shards[1]) and len(shards[0]) == len(shards[1]) == 25
    evals = [torch.cat([y for _, y in _loader(False, rank=r, world=2, n=51)]).tolist() for r in (0, 1)]
    assert sorted(evals[0] + evals[1]) == list(range(51))


@pytest.mark.slow
def test_training_with_the_device_loader(tiny_recipe, monkeypatch):
    """The run's batches, training and evaluation, come from the device loader: a spy on it sees each one."""
    passes: list[tuple[bool, list[int]]] = []  # per pass over a device loader: (train, each batch's samples)
    original = DeviceTensorLoader.__iter__

    def spy(self):
        passes.append((self.train, []))
        for x, y in original(self):
            passes[-1][1].append(len(y))
            yield x, y

    monkeypatch.setattr(DeviceTensorLoader, "__iter__", spy)
    result = fit(resolve(tiny_recipe, ["trainer.loader=device", "run_name=dev", "trainer.max_duration=1ep"]))
    assert result.batches == 3
    assert [sizes for is_train, sizes in passes if is_train] == [[64, 64, 64]]  # the epoch's 3 batches of 64
    # Composer takes one eval batch at the start (it spins its loaders to the epoch), then the evaluation's 2
    assert [sizes for is_train, sizes in passes if not is_train][-1] == [64, 64], passes
    correct = result.eval_metrics["top1"] * 128  # top-1 over exactly the 128 samples the loader gave
    assert abs(correct - round(correct)) < 1e-3, result.eval_metrics


def test_device_loader_needs_in_memory_data(tiny_recipe):
    with pytest.raises(RecipeError, match="trainer.loader: 'device' needs a dataset held in memory as tensors"):
        resolve(tiny_recipe, ["trainer.loader=device", "dataset={name: image_folder, train_path: a, val_path: b}"])


def test_a_batch_is_made_on_the_device_without_host_copies_or_read_backs():
    """The per-batch work (gather, crop, flip, resize, normalise) on a meta-device dataset: every op
    stays on that device, so on a GPU no batch waits for a copy from the host or a read-back."""
    from .stays_on_device import StaysOnDevice

    images = torch.zeros(64, 3, 32, 32, dtype=torch.uint8, device="meta")
    labels = torch.zeros(64, dtype=torch.long, device="meta")
    augment = BatchAugment(mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2), crop_padding=4, hflip=True, size=40)
    loader = DeviceTensorLoader(images, labels, batch_size=8, augment=augment, train=True, device="meta")
    batches = iter(loader)
    next(batches)  # the epoch's order arrives once, at its start
    with StaysOnDevice() as audit:
        x, y = next(batches)
        next(batches)
    assert x.shape == (8, 3, 40, 40) and x.device.type == "meta" and y.device.type == "meta"
    assert len(audit.ops) > 10 and audit.left == []


def test_the_old_host_drawn_crop_would_be_caught():
    """The check above notices what it is for: offsets drawn on the host and copied over."""
    from .stays_on_device import StaysOnDevice

    images = torch.zeros(8, 3, 32, 32, device="meta")
    with StaysOnDevice() as audit:
        offsets = torch.randint(0, 9, (2, 8), generator=torch.Generator().manual_seed(0)).to(images.device)
        images + offsets[0].view(8, 1, 1, 1)
    assert [op for op, _ in audit.left] == ["aten.randint.low_generator", "aten._to_copy.default"]
