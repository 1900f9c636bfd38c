"""Every recipe in recipes/ validates, and the shared bases are really shared."""

from __future__ import annotations

import pytest

from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from dlrecipes.recipe import load_recipe

from .conftest import RECIPES, image_folders

ALL_RECIPES = sorted(p for p in RECIPES.rglob("*.yaml") if "base" not in p.relative_to(RECIPES).parts)


@pytest.mark.parametrize("path", ALL_RECIPES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_validates(path):
    config = resolve(path, check_device=False, check_data=False)
    assert config.description, f"{path.name} should say what it is for"
    assert config.name == path.stem


def test_the_first_set_of_recipes_exists():
    names = {p.name for p in ALL_RECIPES}
    assert {
        "quickstart.yaml",
        "mnist_cnn_simple.yaml",
        "mnist.yaml",
        "cifar10_resnet18.yaml",
        "finetune_timm.yaml",
        "imagenet100_fast.yaml",
    } <= names


def test_recipes_share_bases():
    bases = [load_recipe(p).sources for p in ALL_RECIPES]
    from_base = [s for s in bases if any("recipes/base/" in v or "base/" in v for v in s.values())]
    assert len(from_base) >= len(ALL_RECIPES) - 1


def test_gpu_recipes_give_a_clear_error_on_this_machine():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RecipeError, match="trainer.device: 'gpu' requested but no CUDA GPU is available"):
        resolve(RECIPES / "imagenet100_fast.yaml")
    with pytest.raises(RecipeError, match="trainer.precision: amp_bf16 needs a GPU"):
        resolve(RECIPES / "imagenet100_fast.yaml", ["trainer.device=auto"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["resnet50_mild", "resnet50_medium", "resnet50_hot"])
def test_published_imagenet_recipes_train_two_batches_on_a_tiny_image_folder(recipe, tmp_path):
    """All the recipe's algorithms together, on CPU-sized settings (the hot one has ten)."""
    from tests.conftest import fit

    image_folders(tmp_path, ("n01", "n02"), per_class=4, size=(80, 72))
    config = resolve(
        RECIPES / "imagenet" / f"{recipe}.yaml",
        [
            f"dataset={{name: image_folder, train_path: {tmp_path}/train, val_path: {tmp_path}/val, crop_size: 64, "
            "resize_size: 72}",
            "trainer.device=cpu",
            "trainer.precision=fp32",
            "trainer.device_train_microbatch_size=null",
            "trainer.batch_size=4",
            "trainer.num_workers=0",
            "trainer.max_duration=2ba",
            "trainer.progress_bar=false",
            "trainer.console_log_interval=100ep",
            "model.min_input_size=32",
            "checkpoint.save=false",
            f"runs_dir={tmp_path}/runs",
            "~callbacks.memory_monitor",
        ],
    )
    result = fit(config)
    assert result.batches == 2


def test_imagenet100_fast_uses_ffcv_with_decoder_progressive_resizing():
    config = resolve(RECIPES / "imagenet100_fast.yaml", check_device=False, check_data=False)
    assert config.dataset.name == "ffcv"
    assert {"progressive_resizing", "channels_last", "blurpool", "label_smoothing", "ema"} <= set(config.algorithms)
    assert config.trainer.precision == "amp_bf16" and config.trainer.batch_size % 8 == 0


@pytest.mark.slow
def test_finetune_timm_recipe_trains_from_a_local_weights_file(tmp_path):
    """The shipped fine-tuning recipe, offline: timm weights from a file, new 2-class head, frozen first epoch."""
    import timm
    import torch

    from .conftest import build_trainer, prepare_run_dir

    image_folders(tmp_path, ("cat", "dog"), per_class=4, size=(80, 72))
    source = timm.create_model("resnet10t", num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "resnet10t.pth")
    config = resolve(
        RECIPES / "finetune_timm.yaml",
        [
            "model.arch=resnet10t",
            "model.pretrained=false",
            f"model.pretrained_path={tmp_path}/resnet10t.pth",
            f"dataset.train_path={tmp_path}/train",
            f"dataset.val_path={tmp_path}/val",
            "dataset.crop_size=64",
            "dataset.resize_size=72",
            "trainer.device=cpu",
            "trainer.batch_size=4",
            "trainer.num_workers=0",
            "trainer.max_duration=2ep",
            "trainer.progress_bar=false",
            "checkpoint.save=false",
            f"runs_dir={tmp_path}/runs",
        ],
    )
    trainer = build_trainer(config, prepare_run_dir(config, "finetune", resume=False))
    try:
        net = trainer.state.model.module
        assert torch.equal(net.conv1[0].weight, source.conv1[0].weight)  # the file's backbone, a new 2-class head
        assert net.fc.out_features == 2
        trainer.fit(duration="1ep")
        assert torch.equal(net.conv1[0].weight, source.conv1[0].weight)  # frozen during the first epoch
        trainer.fit(duration="1ep")
        assert not torch.equal(net.conv1[0].weight, source.conv1[0].weight)
        lrs = sorted({g["lr"] for g in trainer.state.optimizers[0].param_groups})
        assert len(lrs) > 2  # head lr plus layer-wise decayed backbone lrs
    finally:
        trainer.close()


def test_imagenet100_is_the_plain_baseline_of_the_fast_recipe():
    plain = resolve(RECIPES / "imagenet100.yaml", check_device=False, check_data=False)
    fast = resolve(RECIPES / "imagenet100_fast.yaml", check_device=False, check_data=False)
    assert plain.dataset.name == "imagenet100" and plain.trainer.loader == "torch"  # ImageFolder + PIL in workers
    assert plain.algorithms == {} and plain.trainer.compile is False
    assert (plain.model.name, plain.model.params["arch"]) == (fast.model.name, fast.model.params["arch"])
    assert plain.trainer.max_duration == fast.trainer.max_duration


def test_every_recipe_the_course_map_names_is_shipped():
    """The course map (docs/course.md, and its table in README) names recipes; each is one of the recipes
    validated above."""
    import re

    section = (RECIPES.parent / "docs" / "course.md").read_text()
    readme = (RECIPES.parent / "README.md").read_text().split("## The course path", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"recipes/([\w/]+\.yaml)", readme)) == set(re.findall(r"recipes/([\w/]+\.yaml)", section))
    named = set(re.findall(r"recipes/([\w/]+\.yaml)", section))
    assert len(named) >= 8
    assert named <= {str(p.relative_to(RECIPES)) for p in ALL_RECIPES}


def test_imagenet100_shards_trains_as_imagenet100_fast_but_from_shards():
    fast = resolve(RECIPES / "imagenet100_fast.yaml", check_device=False, check_data=False)
    shards = resolve(RECIPES / "imagenet100_shards.yaml", check_device=False, check_data=False)
    assert shards.dataset.name == "shards" and shards.dataset.params["remote"].startswith("s3://")
    assert shards.dataset.params["decode"] == "device"  # nvJPEG on the GPU, cropped at progressive resizing's size
    for section in ("model", "trainer", "optimizer", "scheduler", "algorithms"):
        assert getattr(shards, section) == getattr(fast, section), section
    same = ("crop_size", "eval_crop_size", "min_scale")
    assert {k: shards.dataset.params[k] for k in same} == {k: fast.dataset.params[k] for k in same}


@pytest.mark.slow
def test_imagenet100_shards_trains_two_batches_from_shards_it_was_given(tmp_path):
    """The recipe's whole pipeline (shards decoded in batches on the device, progressive resizing and the other
    algorithms) on CPU-sized settings."""
    pytest.importorskip("litdata")
    from tests.conftest import fit

    from .conftest import run_cli

    image_folders(tmp_path, ("n01", "n02"), per_class=4, size=(80, 72))
    made = run_cli(
        "data",
        "convert",
        "image_folder",
        f"train_path={tmp_path}/train",
        f"val_path={tmp_path}/val",
        "--format",
        "shards",
        "--out",
        str(tmp_path / "shards"),
    )
    assert made.returncode == 0, made.stderr[-2000:]
    config = resolve(
        RECIPES / "imagenet100_shards.yaml",
        [
            f"dataset.remote={tmp_path}/shards",
            "dataset.crop_size=64",
            "dataset.eval_crop_size=64",
            "dataset.resize_size=72",
            "trainer.device=cpu",
            "trainer.precision=fp32",
            "trainer.batch_size=4",
            "trainer.num_workers=0",
            "trainer.max_duration=2ba",
            "trainer.progress_bar=false",
            "trainer.console_log_interval=100ep",
            "model.min_input_size=32",
            "checkpoint.save=false",
            f"runs_dir={tmp_path}/runs",
        ],
    )
    assert fit(config).batches == 2
