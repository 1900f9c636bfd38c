"""The torch loader's global order (dlrecipes/data/order.py): the same global batches on any number of processes,
each sample's augmentation seeded by the sample, and a resume at any batch, on the same number of processes or
another, that continues exactly where the checkpoint was (sample ids recorded batch by batch)."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, image_folders, run_cli, write
from tests.test_distributed import _forked_ranks

PLUGIN = '''
from dlrecipes.registry import callbacks, datasets


@datasets.register("numbered", in_memory=True)
def numbered(samples: int = 48):
    """Test data: every pixel of image i is i, its label i % 10, so a batch says which samples it holds."""
    import torch
    from torch.utils.data import TensorDataset
    from dlrecipes.data.splits import DatasetSplits

    x = torch.arange(samples, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, 8, 8).contiguous()
    y = torch.arange(samples) % 10
    return DatasetSplits(TensorDataset(x, y), TensorDataset(x[:12], y[:12]), 10, (1, 8, 8))


@callbacks.register("batch_log")
def batch_log(path: str, ids: str = "pixels"):
    """Test helper: one JSON line per trained batch and rank (appended and flushed, so a killed run's batches
    stay): the batch number, the sample ids (the first pixel, or the labels) and each image's pixel sum."""
    import json
    from composer.core import Callback
    from composer.utils import dist

    class Log(Callback):
        def after_dataloader(self, state, logger):
            x, y = state.batch[0], state.batch[1]
            seen = x.flatten(1)[:, 0] if ids == "pixels" else y
            row = {"batch": int(state.timestamp.batch) + 1, "epoch": int(state.timestamp.epoch),
                   "rank": dist.get_global_rank(), "world": dist.get_world_size(),
                   "ids": [round(float(v)) for v in seen], "sums": [float(v) for v in x.double().flatten(1).sum(1)]}
            with open(f"{path}.rank{dist.get_global_rank()}", "a") as f:
                f.write(json.dumps(row) + "\\n")

    return Log()
'''

RECIPE = """
    imports: [./order_plugin.py]
    model: {name: cnn_simple, width: 4, hidden: 8}
    dataset: {name: numbered}
    trainer: {max_duration: 2ep, batch_size: 12, num_workers: 0, progress_bar: false, device: cpu,
              deterministic: true, console_log_interval: 1000ep}
    optimizer: {name: sgd, lr: 0.05}
    checkpoint: {save_interval: 1ba, keep: -1, monitor: null}
    plots: false
"""


def batches(log: Path) -> dict[int, dict]:
    """Global batch number -> its ids and pixel sums, the ranks' parts joined in rank order; a batch trained twice
    (after the last checkpoint of a killed run, then again by the resumed one) as it was trained last."""
    parts: dict[int, dict[int, dict]] = defaultdict(dict)
    for file in sorted(log.parent.glob(log.name + ".rank*")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            parts[row["batch"]][row["rank"]] = row
    return {
        b: {
            "epoch": next(iter(ranks.values()))["epoch"],
            "ids": sum((ranks[r]["ids"] for r in sorted(ranks)), []),
            "sums": sum((ranks[r]["sums"] for r in sorted(ranks)), []),
        }
        for b, ranks in sorted(parts.items())
    }


# -- the order itself --------------------------------------------------------------------------------------------


def _global_batches(length, batch, world, epoch, resume=None, shard_sizes=None):
    from dlrecipes.data.order import GlobalOrderSampler

    per_rank = []
    for rank in range(world):
        sampler = GlobalOrderSampler(length, batch, rank, world, seed=5, shard_sizes=shard_sizes)
        sampler.set_epoch(epoch)
        if resume:
            sampler.resume_at(*resume)
        per_rank.append(list(sampler))
    part = batch // world
    return [sum((keys[k * part : (k + 1) * part] for keys in per_rank), []) for k in range(len(per_rank[0]) // part)]


def test_every_number_of_processes_trains_the_same_global_batches_each_sample_once_an_epoch():
    one = _global_batches(50, 12, 1, epoch=2)
    assert _global_batches(50, 12, 2, epoch=2) == _global_batches(50, 12, 3, epoch=2) == one
    indices = [i for b in one for i, *_ in b]
    assert len(indices) == len(set(indices)) == 48  # 4 full batches of 12; the 2 left over are dropped
    assert _global_batches(50, 12, 1, epoch=3) != one  # each epoch its own order


def test_a_resume_on_another_number_of_processes_continues_the_epoch_where_it_was():
    whole = _global_batches(48, 12, 2, epoch=1)
    assert _global_batches(48, 12, 3, epoch=1, resume=(1, 24)) == whole[2:]
    assert _global_batches(48, 12, 1, epoch=1, resume=(1, 24)) == whole[2:]
    assert _global_batches(48, 12, 1, epoch=2, resume=(1, 24)) == _global_batches(48, 12, 1, epoch=2)  # once


def test_each_samples_augmentation_seed_depends_on_the_sample_not_the_process():
    seeds = {}
    for world in (1, 2, 3):
        for b in _global_batches(48, 12, world, epoch=0):
            for index, seed, epoch in b:
                assert seeds.setdefault(index, seed) == seed and epoch == 0  # the key carries its epoch
    assert len(set(seeds.values())) == 48


def test_shards_are_read_a_few_at_a_time():
    from dlrecipes.data.order import SHARD_WINDOW, epoch_order

    sizes = [10] * 12
    order = epoch_order(120, seed=1, epoch=0, shard_sizes=sizes)
    assert sorted(order.tolist()) == list(range(120))
    window = SHARD_WINDOW * 10
    for first in range(0, 120, window):  # each stretch of the order reads only SHARD_WINDOW shards
        assert len({i // 10 for i in order[first : first + window].tolist()}) == SHARD_WINDOW


def test_a_sample_is_loaded_under_its_own_seed_and_the_training_random_state_is_left_as_it_was():
    from torchvision.datasets import VisionDataset

    from dlrecipes.data.order import ordered

    class Noisy(VisionDataset):
        def __init__(self):
            super().__init__("unused", transform=lambda value: value)

        def __len__(self):
            return 24

        def __getitem__(self, index):
            return self.transform(torch.rand(1).item()), index

    samples = ordered(Noisy(), 12, 0, 1, seed=3)
    assert isinstance(samples, VisionDataset)  # Composer's RandAugment and AugMix still find its transform
    samples.transform = lambda value: -value
    assert samples.samples_of.transform(1) == -1
    keys = list(samples.sampler)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = [samples[k] for k in keys]
    assert torch.equal(torch.get_rng_state(), before)
    assert [samples[k] for k in reversed(keys)] == list(reversed(first))  # the same sample, the same draw


# -- resumes, recorded batch by batch --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def order_recipe(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("order")
    write(root / "order_plugin.py", PLUGIN)
    path = write(root / "order.yaml", RECIPE)
    (root / "out").mkdir()
    return path


@pytest.fixture(scope="module")
def whole_on_two(order_recipe) -> dict:
    """2 epochs of 4 global batches on 2 processes, uninterrupted."""
    root = order_recipe.parent
    _forked_ranks(
        root, str(order_recipe), "run_name=whole2", f"callbacks.batch_log.path={root}/out/whole2", tag="whole2"
    )
    return batches(root / "out" / "whole2")


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_two_processes_stopped_inside_an_epoch_resume_on_another_number_exactly(order_recipe, whole_on_two, world):
    """Stopped after batch 6 (inside epoch 1) on 2 processes, resumed on 1 or 3: every global batch is the
    uninterrupted run's, the same samples in the same order; each epoch's samples once."""
    root, run = order_recipe.parent, f"on{world}"
    log = f"callbacks.batch_log.path={root}/out/{run}"
    _forked_ranks(root, str(order_recipe), f"run_name={run}", log, "trainer.max_duration=6ba", tag=f"{run}a")
    _forked_ranks(root, str(order_recipe), f"run_name={run}", log, "--resume", world=world, tag=f"{run}b")
    resumed = batches(root / "out" / run)
    assert list(resumed) == list(whole_on_two) == list(range(1, 9))
    assert resumed == whole_on_two
    for epoch in (0, 1):
        ids = [i for b in resumed.values() if b["epoch"] == epoch for i in b["ids"]]
        assert sorted(ids) == list(range(48))
    notes = (root / f"{run}b-out0.txt").read_text()
    assert "resumes on" not in notes  # the global order continues exactly: nothing to warn about


@pytest.mark.slow
def test_a_loader_that_orders_by_process_says_so_before_a_resume_on_another_number(order_recipe):
    root = order_recipe.parent
    device = ["trainer.loader=device", f"callbacks.batch_log.path={root}/out/dev"]
    _forked_ranks(root, str(order_recipe), "run_name=dev", *device, "trainer.max_duration=6ba", tag="deva")
    _forked_ranks(root, str(order_recipe), "run_name=dev", *device, "--resume", world=1, tag="devb")
    lines = [line for line in (root / "devb-out0.txt").read_text().splitlines() if "resumes on" in line]
    assert len(lines) == 1, (root / "devb-out0.txt").read_text()[-2000:]
    assert lines[0].startswith("note: this run trained on 2 processes and resumes on 1: trainer.loader=device")
    assert "resume on 2 processes to continue exactly" in lines[0]


IMAGE_RECIPE = """
    imports: [./order_plugin.py]
    model: {name: cnn_simple, width: 4, hidden: 8}
    dataset: {name: image_folder, train_path: data/train, val_path: data/val, crop_size: 16, resize_size: 16}
    trainer: {max_duration: 2ep, batch_size: 8, num_workers: 2, progress_bar: false, device: cpu,
              deterministic: true, console_log_interval: 1000ep, eval_subset_num_batches: 1}
    optimizer: {name: sgd, lr: 0.05}
    checkpoint: {save_interval: 1ba, keep: -1, monitor: null}
    callbacks: {fault_injection: {}}
    plots: false
"""

# Every loader of files, over the same 24 one-image classes (the label names the sample).
LOADERS = {
    "torch": [],
    # the batch decoded in the training process (on the CPU here), cropped at progressive resizing's size (8 px in
    # epoch 0, 12 in epoch 1: a resume inside epoch 1 sets 12 again, as the epoch's start did)
    "device_decode": [
        "dataset.decode=device",
        "algorithms.progressive_resizing={initial_scale: 0.5, "
        "delay_fraction: 0.0, finetune_fraction: 0.0, size_increment: 4}",
    ],
    "tensor_cache": ["trainer.loader=tensor_cache", "trainer.cache_dir=cache"],
    "ffcv": [
        "dataset={name: ffcv, train_path: ffcv/train.beton, val_path: ffcv/val.beton, crop_size: 16}",
        "trainer.num_workers=1",
    ],
    "hf": ["dataset={name: hf, path: hf, crop_size: 16, resize_size: 16}"],
}


def _hugging_face_copy(root: Path) -> None:
    """The image folders as a Hugging Face save_to_disk folder (train and validation, labels 0..23)."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    splits = {}
    for split, name in (("train", "train"), ("val", "validation")):
        files = sorted((root / "data" / split).glob("*/*.jpg"))
        splits[name] = datasets.Dataset.from_dict(
            {"image": [str(f) for f in files], "label": list(range(len(files)))}, features=features
        )
    datasets.DatasetDict(splits).save_to_disk(str(root / "hf"))


@pytest.fixture(scope="module")
def image_recipe(tmp_path_factory) -> Path:
    """24 one-image classes (the label names the sample), random-resized crops and flips, 2 workers; the same
    images as FFCV files and a Hugging Face folder."""
    root = tmp_path_factory.mktemp("images")
    image_folders(root / "data", [f"c{i:02d}" for i in range(24)], per_class=1)
    write(root / "order_plugin.py", PLUGIN)
    path = write(root / "images.yaml", IMAGE_RECIPE)
    path.write_text(path.read_text() + f"runs_dir: {root}/runs\n")
    return path


def _train(recipe: Path, run: str, *extra: str):
    root = recipe.parent
    return run_cli(
        "train",
        str(recipe),
        f"run_name={run}",
        f"callbacks.batch_log.path={root}/{run}",
        "callbacks.batch_log.ids=labels",
        "--plugin",
        str(REPO / "tests" / "fault_injection.py"),
        *extra,
        cwd=root,
    )


def _weights(recipe: Path, run: str) -> dict:
    latest = recipe.parent / "runs" / run / "checkpoints" / "latest-rank0.pt"
    return torch.load(latest, map_location="cpu", weights_only=False)["state"]["model"]


def _prepared(recipe: Path, loader: str) -> list[str]:
    """The loader's overrides, its files made once."""
    root = recipe.parent
    if loader == "ffcv" and not (root / "ffcv").exists():
        pytest.importorskip("ffcv")
        made = run_cli(
            "data",
            "convert",
            "image_folder",
            "train_path=data/train",
            "val_path=data/val",
            "--out",
            "ffcv",
            "--workers",
            "1",
            cwd=root,
        )
        assert made.returncode == 0, made.stderr[-2000:]
    if loader == "hf" and not (root / "hf").exists():
        _hugging_face_copy(root)
    return LOADERS[loader]


@pytest.mark.slow
@pytest.mark.parametrize(
    "loader, stop",
    [
        ("torch", "kill"),
        ("torch", "term"),
        ("device_decode", "kill"),
        ("tensor_cache", "kill"),
        ("ffcv", "kill"),
        ("hf", "kill"),
    ],
)
def test_a_run_stopped_inside_an_epoch_resumes_to_the_same_samples_crops_and_weights(image_recipe, loader, stop):
    """SIGKILL after batch 5 (inside epoch 1 of 3 batches), or SIGTERM after batch 4 (a checkpoint at once): the
    resumed run trains the uninterrupted run's batches, the same samples in the same order, each crop and flip
    the same, and ends with its weights; for every loader of files (FFCV: the same samples in the same order)."""
    extra = _prepared(image_recipe, loader)
    if not (image_recipe.parent / "runs" / f"{loader}-whole").exists():
        whole = _train(image_recipe, f"{loader}-whole", *extra)
        assert whole.returncode == 0, whole.stderr[-2000:]
    fault = "kill_at_batch=5" if stop == "kill" else "signal_at_batch=4"
    run = f"{loader}-{stop}"
    first = _train(image_recipe, run, *extra, f"callbacks.fault_injection.{fault}")
    assert first.returncode == (-signal.SIGKILL if stop == "kill" else 75), first.stderr[-2000:]
    resumed = _train(image_recipe, run, *extra, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected, got = batches(image_recipe.parent / f"{loader}-whole"), batches(image_recipe.parent / run)
    assert list(got) == list(expected) == list(range(1, 7))
    assert [b["ids"] for b in got.values()] == [b["ids"] for b in expected.values()]
    for epoch in (0, 1):
        assert sorted(i for b in got.values() if b["epoch"] == epoch for i in b["ids"]) == list(range(24))
    if loader == "ffcv":
        return  # FFCV draws its crops from numba's per-thread random state, which it does not seed: two fresh runs
        # already crop differently (BENCHMARKS.md and docs/recipes.md say so), so only the order is compared
    assert [b["sums"] for b in got.values()] == [b["sums"] for b in expected.values()]  # the same crops and flips
    reference, weights = _weights(image_recipe, f"{loader}-whole"), _weights(image_recipe, run)
    assert [k for k in reference if not torch.equal(reference[k], weights[k])] == []


@pytest.mark.slow
def test_a_checkpoint_inside_an_epoch_resumes_only_with_its_batch_size(tiny_recipe):
    first = run_cli("train", str(tiny_recipe), "run_name=b", "trainer.max_duration=2ba", "checkpoint.save_interval=1ba")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run_cli("train", str(tiny_recipe), "run_name=b", "trainer.batch_size=32", "--resume")
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr
    assert resumed.stderr.strip().splitlines()[-1] == (
        "error: trainer.batch_size: the checkpoint was saved inside epoch 0 with batches of 64; resume with "
        "trainer.batch_size=64 (the batch size can change at an epoch's end)"
    )
    checkpoints = tiny_recipe.parent / "runs" / "b" / "checkpoints"
    assert (checkpoints / "ep0-ba2-rank0.pt").exists()  # nothing finished is lost
