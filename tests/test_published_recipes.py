"""MosaicML's ResNet-50 ImageNet recipes, key by key against what MosaicML published.

The source is mosaicml/examples, examples/benchmarks/resnet_imagenet: ``yamls/resnet50.yaml``
(the baseline's values, and the mild / medium / hot overrides: loss, train crop, eval resize,
duration), ``main.py`` (optimizer, scheduler, callbacks, precision, the algorithms of each
recipe and their parameters), ``data.py`` (train: RandomResizedCrop(crop, scale (0.08, 1)) +
horizontal flip, no resize when resize_size is -1; eval: Resize(resize) + CenterCrop(crop))
and ``model.py`` (initialisation). The table below holds their values with the file each comes
from; the recipes are read through ``resolve`` with each factory's defaults filled in, so a
value we leave to a default is compared too.
"""

from __future__ import annotations

import inspect
import math

import pytest

from dlrecipes import registry
from dlrecipes.api import resolve

from .conftest import RECIPES

YAML, MAIN, DATA, MODEL = "yamls/resnet50.yaml", "main.py", "data.py", "model.py"

# key path in the resolved recipe -> (published value, source file)
BASELINE = {
    "model.name": ("torchvision", MODEL),  # torchvision.models.resnet.<name>
    "model.arch": ("resnet50", YAML),
    "model.init": ("mosaicml", MODEL),  # kaiming_normal_ conv/linear, BN weight rand, bias 0
    "loss": ("cross_entropy", YAML),
    "trainer.seed": (17, YAML),
    "trainer.max_duration": ("90ep", YAML),
    "trainer.device_train_microbatch_size": ("auto", YAML),
    "trainer.batch_size": (2048, YAML),  # train_dataset.batch_size, global: main.py divides by world size
    "trainer.eval_batch_size": (2048, YAML),
    "trainer.eval_interval": ("1ep", MAIN),
    "trainer.precision": ("amp_fp16", MAIN),  # on a GPU
    "trainer.num_workers": (8, MAIN),
    "dataset.name": ("imagenet", DATA),  # ImageFolder(<path>/train), ImageFolder(<path>/val)
    "dataset.crop_size": (224, YAML),  # train_dataset.crop_size (train resize_size -1: no resize)
    "dataset.min_scale": (0.08, DATA),
    "dataset.hflip": (True, DATA),
    "dataset.eval_crop_size": (224, YAML),
    "dataset.resize_size": (256, YAML),  # eval_dataset.resize_size
    "optimizer.name": ("decoupled_sgdw", MAIN),
    "optimizer.lr": (2.048, YAML),
    "optimizer.momentum": (0.875, YAML),
    "optimizer.weight_decay": (5.0e-4, YAML),
    "optimizer.dampening": (0.0, MAIN),  # DecoupledSGDW's defaults, over all parameters
    "optimizer.nesterov": (False, MAIN),
    "optimizer.no_decay_norm_and_bias": (False, MAIN),
    "optimizer.scale_lr": ("none", YAML),
    "scheduler.name": ("cosine", MAIN),  # CosineAnnealingWithWarmupScheduler
    "scheduler.warmup": ("8ep", YAML),
    "scheduler.alpha_f": (0.0, YAML),
    "checkpoint.save_interval": ("10ep", YAML),
    "checkpoint.keep": (1, YAML),
    "callbacks.speed_monitor.window_size": (50, MAIN),
    "callbacks.lr_monitor": ({}, MAIN),
    "callbacks.memory_monitor": ({}, MAIN),
    "algorithms": ({}, MAIN),
}

MILD_ALGORITHMS = {
    "blurpool": {},
    "channels_last": {},
    "ema": {"half_life": "100ba", "update_interval": "20ba"},
    "progressive_resizing": {"initial_scale": 0.5, "delay_fraction": 0.4, "finetune_fraction": 0.2},
    "label_smoothing": {"smoothing": 0.08},
}
MEDIUM_ALGORITHMS = {
    **MILD_ALGORITHMS,
    "label_smoothing": {"smoothing": 0.1},
    "mixup": {"alpha": 0.2},
    "sam": {"rho": 0.5, "interval": 10},
}
HOT_ALGORITHMS = {
    **MEDIUM_ALGORITHMS,
    "progressive_resizing": {"initial_scale": 0.6, "delay_fraction": 0.2, "finetune_fraction": 0.2},
    "label_smoothing": {"smoothing": 0.13},
    "mixup": {"alpha": 0.25},
    "sam": {"rho": 0.5, "interval": 5},
    "colout": {"p_col": 0.05, "p_row": 0.05},
    "randaugment": {"depth": 1, "severity": 9},
    "stochastic_depth": {
        "target_layer_name": "ResNetBottleneck",
        "stochastic_method": "sample",
        "drop_distribution": "linear",
        "drop_rate": 0.1,
    },
}


def _recipe(duration: str, algorithms: dict) -> dict:
    """A mild/medium/hot recipe: the baseline with the yaml's overrides and main.py's algorithms."""
    return {
        **BASELINE,
        "loss": ("binary_cross_entropy", YAML),  # model.loss_name
        "dataset.crop_size": (176, YAML),  # train_dataset.crop_size
        "dataset.resize_size": (232, YAML),  # eval_dataset.resize_size (eval crop stays 224)
        "trainer.max_duration": (duration, YAML),
        "algorithms": (algorithms, MAIN),
    }


PUBLISHED = {
    "resnet50_baseline": BASELINE,
    "resnet50_mild": _recipe("36ep", MILD_ALGORITHMS),
    "resnet50_medium": _recipe("135ep", MEDIUM_ALGORITHMS),
    "resnet50_hot": _recipe("270ep", HOT_ALGORITHMS),
}


def _defaults(reg: registry.Registry, name: str) -> dict:
    return {k: p.default for k, p in reg.get(name).parameters.items() if p.default is not inspect.Parameter.empty}


def _effective(recipe: str) -> dict:
    """The resolved recipe as a flat {key path: value}, factory defaults included."""
    config = resolve(RECIPES / "imagenet" / f"{recipe}.yaml", check_device=False, check_data=False)
    flat = {"loss": config.loss, "algorithms": sorted(config.algorithms)}
    for name, params in config.algorithms.items():
        flat.update(
            {f"algorithms.{name}.{k}": v for k, v in {**_defaults(registry.algorithms, name), **params}.items()}
        )
    for section, reg in (
        ("model", registry.models),
        ("dataset", registry.datasets),
        ("optimizer", registry.optimizers),
        ("scheduler", registry.schedulers),
    ):
        component = getattr(config, section)
        params = {"name": component.name, "scale_lr": "none", **_defaults(reg, component.name), **component.params}
        flat.update({f"{section}.{k}": v for k, v in params.items()})
    for section in ("trainer", "checkpoint"):
        flat.update({f"{section}.{k}": v for k, v in vars(getattr(config, section)).items()})
    if flat["trainer.eval_batch_size"] is None:  # null means: the training batch size
        flat["trainer.eval_batch_size"] = flat["trainer.batch_size"]
    if flat["dataset.eval_crop_size"] is None:
        flat["dataset.eval_crop_size"] = flat["dataset.crop_size"]
    for name, params in config.callbacks.items():
        flat[f"callbacks.{name}"] = params
        flat.update({f"callbacks.{name}.{k}": v for k, v in {**_defaults(registry.callbacks, name), **params}.items()})
    return flat


def _expected(recipe: str) -> dict:
    """The published table, each algorithm's parameters one key each (with the defaults they rely on)."""
    table = dict(PUBLISHED[recipe])
    algorithms, source = table.pop("algorithms")
    table["algorithms"] = (sorted(algorithms), source)
    for name, params in algorithms.items():
        for k, v in {**_defaults(registry.algorithms, name), **params}.items():
            table[f"algorithms.{name}.{k}"] = (v, source)
    return table


@pytest.mark.parametrize("recipe", sorted(PUBLISHED))
def test_recipe_matches_the_published_values_key_by_key(recipe):
    effective = _effective(recipe)
    wrong = []
    for key, (value, source) in _expected(recipe).items():
        got = effective.get(key, "<missing>")
        same = math.isclose(got, value) if isinstance(value, float) and isinstance(got, (int, float)) else got == value
        if not same:
            wrong.append(f"{key}: recipe has {got!r}, {source} publishes {value!r}")
    assert not wrong, f"recipes/imagenet/{recipe}.yaml differs from mosaicml/examples:\n" + "\n".join(wrong)


# ResNet strikes back (Wightman, Touvron, Jegou 2021), Table 1, column A3: key path -> (published value, what the
# table says). A value the table leaves out (say, which augmentations run where) is not compared.
A3_TABLE = "Table 1 (A3)"
A3 = {
    "model.name": ("timm", "timm's ResNet-50"),
    "model.arch": ("resnet50", A3_TABLE),
    "model.drop_rate": (0.0, "Dropout: no"),
    "model.drop_path_rate": (None, "Stoch. Depth: no"),
    "model.pretrained": (False, "from scratch"),
    "trainer.max_duration": ("100ep", "Epochs 100"),
    "trainer.batch_size": (2048, "Batch size 2048"),
    "dataset.crop_size": (160, "Train Res 160"),
    "dataset.eval_crop_size": (224, "Test Res 224"),
    "dataset.resize_ratio": (0.95, "Test crop ratio 0.95"),
    "dataset.min_scale": (0.08, "RRC (timm's scale 0.08-1)"),
    "dataset.hflip": (True, "H. flip"),
    "optimizer.name": ("lamb", "Optimizer LAMB"),
    "optimizer.lr": (8e-3, "LR 8e-3"),
    "optimizer.weight_decay": (0.02, "Weight decay 0.02"),
    "scheduler.name": ("cosine", "LR decay cosine"),
    "scheduler.warmup": ("5ep", "Warmup epochs 5"),
    "loss": ("binary_cross_entropy", "BCE loss: yes, CE loss: no"),
    "algorithms.mixup_cutmix.mixup_alpha": (0.1, "Mixup alpha 0.1"),
    "algorithms.mixup_cutmix.cutmix_alpha": (1.0, "Cutmix alpha 1.0"),
    "algorithms.mixup_cutmix.switch_prob": (0.5, "timm's Mixup: switch probability 0.5"),
    "algorithms.mixup_cutmix.prob": (1.0, "timm's Mixup: every batch mixed"),
    "algorithms.mixup_cutmix.label_smoothing": (0.0, "Label smoothing: no"),
    "algorithms.batch_randaugment.policy": ("rand-m6-mstd0.5-inc1", "Rand Augment 6 / 0.5"),
}
# what Table 1's A3 column has and the recipe leaves out: each must be named in the recipe's comments
A3_ABSENT = {
    "label_smoothing",
    "ema",
    "swa",
    "gradient_clipping",
    "random_erasing",
    "batch_random_erasing",
    "batch_color_jitter",
    "stochastic_depth",
    "mixup",
    "cutmix",
}  # mixup_cutmix switches between the two
A3_DEPARTURES = ("RandAugment runs on whole batches on the GPU", "Mixed precision is bf16", "The warmup starts from 0")


def test_the_a3_recipe_matches_resnet_strikes_back_key_by_key():
    """recipes/imagenet/resnet50_a3.yaml against Table 1's A3 column; each departure is named in its comments."""
    effective = _effective("resnet50_a3")
    wrong = []
    for key, (value, says) in A3.items():
        got = effective.get(key, "<missing>")
        same = math.isclose(got, value) if isinstance(value, float) and isinstance(got, (int, float)) else got == value
        if not same:
            wrong.append(f"{key}: recipe has {got!r}, the paper ({says}) {value!r}")
    assert not wrong, "recipes/imagenet/resnet50_a3.yaml differs from ResNet strikes back A3:\n" + "\n".join(wrong)
    assert not A3_ABSENT & set(effective["algorithms"]), effective["algorithms"]
    assert effective["trainer.precision"].startswith("amp_") and effective["trainer.loader"] != "device"
    comments = " ".join(
        line.lstrip("# ")
        for line in (RECIPES / "imagenet" / "resnet50_a3.yaml").read_text().splitlines()
        if line.startswith("#")
    )
    missing = [d for d in A3_DEPARTURES if d not in comments]
    assert not missing, f"departures not named in the recipe's comments: {missing}"
