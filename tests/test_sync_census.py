"""Every shipped recipe, and every algorithm, trains without making a GPU wait (issue: the engine where users
train): a census on the CPU (tests/sync_census.py) of steps 4-20 finds no read-back, no mode switch and no
blocking copy.

Each recipe runs as shipped (its model, algorithms, loader kind, callbacks and loggers) on a generated
stand-in of its dataset in the same format, at CPU sizes: small batches and images, fp32 (amp needs a GPU,
where what amp_fp16's gradient scaler reads back is listed in docs/performance.md), and the 22 batches the
window needs. What an algorithm must read back is declared where it is registered (``reads_back=``), listed
in docs/performance.md and said by ``validate`` on a GPU; the census checks that declaration both ways.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrecipes import api
from dlrecipes.data.image_folder import imagenet100_classes
from dlrecipes.registry import algorithms

from .conftest import REPO, build_trainer, image_folders
from .stand_in_data import cifar_batches, ffcv_files, mnist_files, shard_files
from .sync_census import SyncCensus

RECIPES = sorted(
    p.relative_to(REPO / "recipes").as_posix() for p in (REPO / "recipes").rglob("*.yaml") if p.parent.name != "base"
)
WINDOW = [
    "trainer.max_duration=22ba",
    "trainer.eval_subset_num_batches=1",
    "checkpoint.save=false",
    "trainer.device=cpu",
    "trainer.precision=fp32",
    "trainer.progress_bar=false",
]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> Path:
    """Each format the shipped recipes read, with enough samples for 22 batches of 4."""
    root = tmp_path_factory.mktemp("stand_ins")
    mnist_files(root / "mnist", train=100, test=8)
    cifar_batches(root / "cifar10" / "cifar-10-batches-py", per_batch=20)
    image_folders(root / "imagenet", [f"n{i:08d}" for i in range(4)], per_class=24, size=(44, 40))
    image_folders(root / "imagenet100", imagenet100_classes(), per_class=1, size=(44, 40))
    ffcv_files(root / "imagenet", root / "ffcv", max_resolution=40)
    shard_files(root / "imagenet", root / "shards")
    return root


def _stand_in(recipe: str, data: Path) -> list[str]:
    """The recipe's dataset replaced by its stand-in, its images and model at CPU sizes."""
    config = api.resolve(REPO / "recipes" / recipe, check_device=False, check_data=False)
    name, model = config.dataset.name, config.to_dict()["model"]
    small = ["model.min_input_size=16"] if model["name"] in ("timm", "torchvision") else []
    if model.get("pretrained"):
        small.append("model.pretrained=false")
    if name in ("mnist", "cifar10"):
        return [f"dataset.root={data / name}", *small]
    if name in ("imagenet", "imagenet100"):
        return [
            f"dataset.root={data / name}",
            "dataset.crop_size=16",
            "dataset.resize_size=18",
            "dataset.eval_crop_size=16",
            *small,
        ]
    if name == "image_folder":
        return [
            f"dataset.train_path={data / 'imagenet' / 'train'}",
            f"dataset.val_path={data / 'imagenet' / 'val'}",
            "dataset.crop_size=16",
            "dataset.resize_size=18",
            *small,
        ]
    if name == "ffcv":
        return [
            f"dataset.train_path={data / 'ffcv' / 'train.beton'}",
            f"dataset.val_path={data / 'ffcv' / 'val.beton'}",
            "dataset.crop_size=16",
            "dataset.eval_crop_size=16",
            *small,
        ]
    if name == "shards":  # progressive resizing in the device decoder: at 16 px, in steps of 4 (32: a 0 px size)
        return [
            f"dataset.remote={data / 'shards'}",
            "dataset.crop_size=16",
            "dataset.resize_size=18",
            "dataset.eval_crop_size=16",
            "algorithms.progressive_resizing.size_increment=4",
            *small,
        ]
    assert name in ("digits", "digits_two_view"), f"{recipe}: no stand-in for dataset {name!r}"
    return small


def census(recipe: Path, overrides: list[str], run_dir: Path, start: int = 3, stop: int = 20) -> SyncCensus:
    """Train ``recipe`` with ``overrides`` under a census of steps ``start+1`` to ``stop``."""
    counted = SyncCensus(start=start, stop=stop)
    trainer = build_trainer(api.resolve(recipe, overrides), run_dir)
    trainer.state.callbacks.append(counted)
    try:
        trainer.fit()
    finally:
        counted.uninstall()
        trainer.close()
    assert counted.complete(), f"the run ended after batches {counted.batches_seen}"
    return counted


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_shipped_recipe_trains_steps_4_to_20_without_a_read_back(recipe, stand_ins, tmp_path):
    config = api.resolve(REPO / "recipes" / recipe, check_device=False, check_data=False)
    workers = min(config.trainer.num_workers, 1)  # the same kind of loader, in one worker process at most
    declared = [f"~algorithms.{name}" for name in config.algorithms if _declared(name)]  # their census is below
    overrides = [
        *_stand_in(recipe, stand_ins),
        *WINDOW,
        "trainer.batch_size=4",
        f"trainer.num_workers={workers}",
        "trainer.device_train_microbatch_size=null",
        f"runs_dir={tmp_path / 'runs'}",
        *declared,
    ]
    counted = census(REPO / "recipes" / recipe, overrides, tmp_path / "runs" / "census")
    assert not counted.found, f"{recipe}:\n{counted.summary()}"


def _declared(name: str) -> str | None:
    """What the algorithm says it reads back (registry metadata ``reads_back``), or None."""
    return algorithms.get(name).metadata.get("reads_back")


# what an algorithm needs of the tiny recipe to run (the rest run on it as they are, with their defaults)
ALGORITHM_SETUP = {
    "augmix": [
        "dataset={name: image_folder, train_path: IMAGES/train, val_path: IMAGES/val, crop_size: 32, resize_size: 36}",
        "trainer.loader=torch",
        "trainer.batch_size=4",
    ],
    "randaugment": [
        "dataset={name: image_folder, train_path: IMAGES/train, val_path: IMAGES/val, crop_size: 32, resize_size: 36}",
        "trainer.loader=torch",
        "trainer.batch_size=4",
    ],
    "distillation": ["algorithms.distillation.teacher=TEACHER"],
    "ghost_batchnorm": ["algorithms.ghost_batchnorm.ghost_batch_size=8"],
    "gradient_checkpointing": ["algorithms.gradient_checkpointing.targets=[Conv2d]"],  # the tiny CNN has no blocks
    "stochastic_depth": [
        "model={name: torchvision, arch: resnet50, min_input_size: 16}",
        "dataset={name: cifar10, root: CIFAR, image_size: 16}",
        "trainer.batch_size=4",
        "algorithms.stochastic_depth.stochastic_method=sample",
    ],
    "qat": ["algorithms.qat.start=2ba"],  # the switch to fake quantization (once) before the window
}


@pytest.mark.slow
@pytest.mark.parametrize("name", algorithms.names())
def test_each_algorithm_reads_back_only_what_it_declares(name, tiny_recipe, trained_tiny, stand_ins, tmp_path):
    """Every registered algorithm on the tiny recipe (on the device loader, where it takes tensors): steps 4-20
    read nothing back, unless the algorithm declares what it reads (``reads_back=``), and then they do."""
    setup = [
        o.replace("IMAGES", str(stand_ins / "imagenet"))
        .replace("TEACHER", str(trained_tiny))
        .replace("CIFAR", str(stand_ins / "cifar10"))
        for o in ALGORITHM_SETUP.get(name, [])
    ]
    declared = _declared(name)
    overrides = [
        f"trainer.max_duration={4 if declared else 22}ba",
        "trainer.train_subset_num_batches=-1",
        "trainer.batch_size=16",
        "trainer.loader=device",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
        f"algorithms={{{name}: {{}}}}",
        *setup,
    ]
    # what is declared has only to be seen once: steps 2-3
    counted = census(tiny_recipe, overrides, tmp_path / "runs" / "census", *((1, 3) if declared else (3, 20)))
    if declared:
        assert counted.found, f"{name} declares reads_back but read nothing back: {_declared(name)}"
    else:
        assert not counted.found, f"{name}:\n{counted.summary()}"


def test_validate_names_what_a_gpu_recipe_reads_back():
    """On a GPU recipe, validate adds a note per declared read-back (and for a gradient scaler with an optimizer
    torch cannot fuse); a CPU recipe naming the same gets none."""
    from .conftest import run_cli

    done = run_cli(
        "validate", str(REPO / "recipes" / "imagenet" / "resnet50_hot.yaml"), "--no-data-check", "--skip-device-check"
    )
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: ")]
    assert [n.split()[1] for n in notes] == ["algorithms.sam", "algorithms.stochastic_depth", "trainer.precision"]
    assert all(n.endswith("(docs/performance.md)") for n in notes) and "decoupled_sgdw (not fused)" in notes[2]
    fused = run_cli(
        "validate",
        str(REPO / "recipes" / "imagenet" / "resnet50_baseline.yaml"),
        "--no-data-check",
        "--skip-device-check",
        "optimizer={name: sgd, lr: 0.1}",
    )
    assert "note:" not in fused.stdout, fused.stdout  # a fused SGD takes the scaler's check on the device
    on_cpu = run_cli(
        "validate", str(REPO / "recipes" / "quickstart.yaml"), "trainer.device=cpu", "algorithms={sam: {}}"
    )
    assert on_cpu.returncode == 0 and "note:" not in on_cpu.stdout, on_cpu.stdout
