"""Algorithms: each trains two batches through a recipe; our own two, function by function."""

from __future__ import annotations

import copy
import inspect
import re

import numpy as np
import pytest
import torch
import yaml

import dlrecipes.algorithms  # noqa: F401  the built-ins, our own algorithms among them
from dlrecipes import registry
from dlrecipes.algorithms.gradient_checkpointing import apply_gradient_checkpointing
from dlrecipes.algorithms.layerwise_lr_decay import apply_layerwise_lr_decay, block_index
from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from tests.conftest import fit

from .conftest import image_folders, write

SMALL_RECIPE = """
    model: {name: cifar_resnet18}
    dataset: {name: synthetic, input_shape: [3, 32, 32], train_samples: 16, eval_samples: 8, num_classes: 4}
    trainer:
      max_duration: 2ba
      batch_size: 8
      num_workers: 0
      progress_bar: false
      console_log_interval: 100ep
      device: cpu
    optimizer: {name: sgd, lr: 0.01}
    checkpoint: {save: false}
    plots: false  # most of a 2-batch run's time; test_loggers.py plots each shape of history
"""

# What an algorithm needs beyond the small recipe above (its prerequisites).
SETUP = {
    "stochastic_depth": ["model={name: torchvision, arch: resnet50, min_input_size: 32}"],
    "randaugment": ["PIL_DATA"],
    "augmix": ["PIL_DATA"],
    # the batch policies work on pixels: a dataset that says how it normalises (synthetic noise does not)
    **{
        name: ["PIL_DATA"]
        for name in ("batch_randaugment", "batch_trivialaugment", "batch_augmix", "batch_color_jitter")
    },
    "ghost_batchnorm": ["algorithms.ghost_batchnorm={ghost_batch_size: 4}"],
    "distillation": ["TEACHER"],
    "swa": [
        "trainer.max_duration=2ep",
        "algorithms.swa={swa_start: 0ep, swa_end: 2ep, update_interval: 1ep}",
        "trainer.train_subset_num_batches=1",
    ],
}


@pytest.fixture
def small_recipe(tmp_path):
    path = write(tmp_path / "small.yaml", SMALL_RECIPE)
    path.write_text(path.read_text() + f"runs_dir: {tmp_path / 'runs'}\n")
    return path


def _image_folder(root):
    image_folders(root, ("a", "b"), per_class=8, size=(40, 30))
    return [
        f"dataset={{name: image_folder, train_path: {root}/train, val_path: {root}/val, "
        "crop_size: 32, resize_size: 36}"
    ]


def _teacher(root) -> str:
    """A teacher for the small recipe's data (4 classes, 3 channels): a model spec with a state-dict file."""
    from dlrecipes.models.architectures.simple_cnn import CNNSimple

    root.mkdir(parents=True, exist_ok=True)
    torch.save(CNNSimple(4, 3, width=4, hidden=8).state_dict(), root / "teacher.pt")
    return f"{{name: cnn_simple, width: 4, hidden: 8, checkpoint: {root / 'teacher.pt'}}}"


def _setup(name, tmp_path) -> list[str]:
    overrides = []
    for extra in SETUP.get(name, []):
        if extra == "PIL_DATA":
            overrides += _image_folder(tmp_path / "images")
        else:
            teacher = f"algorithms.distillation={{teacher: {_teacher(tmp_path / 'teacher')}}}"
            overrides += [teacher] if extra == "TEACHER" else [extra]
    return overrides


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.algorithms.names())
def test_each_algorithm_trains_two_batches(name, small_recipe, tmp_path):
    overrides = [f"algorithms.{name}=true", *_setup(name, tmp_path)]
    result = fit(resolve(small_recipe, overrides))
    assert result.batches == 2
    assert all(np.isfinite(v) for v in result.eval_metrics.values())


@pytest.mark.parametrize("name", registry.algorithms.names())
def test_parameters_round_trip_through_validation(name, small_recipe, tmp_path):
    entry = registry.algorithms.get(name)
    defaults = {k: p.default for k, p in entry.parameters.items() if p.default is not inspect.Parameter.empty}
    overrides = [f"algorithms.{name}={yaml.safe_dump(defaults, default_flow_style=True).strip()}"]
    for extra in SETUP.get(name, []):
        if extra.startswith("model="):
            overrides.append(extra)
        elif extra == "PIL_DATA":
            overrides.append("dataset={name: image_folder, train_path: x, val_path: y}")
        elif extra == "TEACHER":  # required: no default; validation records its file's checksum
            overrides.append(f"algorithms.distillation.teacher={_teacher(tmp_path / 'teacher')}")
    if name == "ghost_batchnorm":
        overrides.append("trainer.batch_size=32")  # the default ghost batch must fit in a batch
    config = resolve(small_recipe, overrides, check_data=False)
    got = dict(config.algorithms[name])
    if name == "distillation":  # the teacher's file made absolute, and its checksum recorded
        assert got.pop("teacher")["checkpoint"] == str(tmp_path / "teacher" / "teacher.pt")
        assert len(got.pop("teacher_sha256")) == 64 and defaults.pop("teacher_sha256") is None
    assert got == defaults
    assert registry.algorithms.build(name, **config.algorithms[name]) is not None


def test_unknown_algorithm_parameter_suggests(small_recipe):
    with pytest.raises(
        RecipeError,
        match=(
            r"algorithms.label_smoothing.smothing: unknown parameter of algorithm 'label_smoothing' "
            r"\(did you mean 'smoothing'\?\)"
        ),
    ):
        resolve(small_recipe, ["algorithms.label_smoothing={smothing: 0.1}"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithms.mixup=true", "algorithms.cutmix=true"], "algorithms: mixup and cutmix cannot be used together"),
        (["algorithms.ema=true", "algorithms.swa=true"], "algorithms: ema and swa cannot be used together"),
        (
            ["algorithms.stochastic_depth=true"],
            "algorithms.stochastic_depth: drops torchvision ResNet Bottleneck blocks",
        ),
        (
            ["algorithms.stochastic_depth=true", "model={name: torchvision, arch: resnet18, min_input_size: 32}"],
            "use model {name: torchvision, arch: resnet50}",
        ),
        (
            ["algorithms.ghost_batchnorm=true"],
            "algorithms.ghost_batchnorm: ghost_batch_size=32 is larger than the batch each device sees (8)",
        ),
        (
            ["algorithms.randaugment=true"],
            "algorithms.randaugment: augments PIL images before ToTensor, and dataset "
            "'synthetic' yields tensors; use algorithms.batch_randaugment, which does it on whole batches",
        ),
        (
            ["algorithms.augmix=true", "trainer.loader=device"],
            "algorithms.augmix: augments PIL images before ToTensor, "
            "and the device loader yields batches of tensors; use algorithms.batch_augmix",
        ),
        *(
            (
                [f"algorithms.{name}=true"],
                f"algorithms.{name}: works on pixel values (it undoes the loader's normalisation), "
                "and dataset 'synthetic' yields random tensors",
            )
            for name in ("batch_randaugment", "batch_trivialaugment", "batch_augmix", "batch_color_jitter")
        ),
    ],
)
def test_conflicts_and_prerequisites_fail_at_validation(small_recipe, overrides, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        resolve(small_recipe, overrides)


# --- layer-wise learning-rate decay ------------------------------------------------------


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Conv2d(4, 4, 3),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(2),
    )


def test_layerwise_lr_decay_gives_each_block_its_rate():
    net = _net()
    net(torch.randn(1, 3, 8, 8))
    from timm.optim import param_groups_weight_decay

    opt = torch.optim.SGD(param_groups_weight_decay(net, 0.1), lr=0.2, momentum=0.9)
    scales = apply_layerwise_lr_decay(net, opt, decay=0.5, block_depth=1)
    assert scales == [0.125, 0.25, 0.5, 1.0]  # four blocks own parameters (Flatten has none)
    index = block_index(net, block_depth=1)
    names = {id(p): n for n, p in net.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            assert group["lr"] == pytest.approx(0.2 * scales[index[names[id(p)]]])
            assert group["weight_decay"] == (0.0 if p.ndim <= 1 else 0.1)  # the no-decay split survives
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(net.parameters()))


def test_layerwise_lr_decay_through_the_trainer_scales_the_schedule(small_recipe):
    from .conftest import build_trainer, prepare_run_dir

    config = resolve(
        small_recipe, ["algorithms.layerwise_lr_decay={decay: 0.5}", "scheduler={name: linear, alpha_f: 0.5}"]
    )
    trainer = build_trainer(config, prepare_run_dir(config, "lwd", resume=False))
    try:
        groups = trainer.state.optimizers[0].param_groups
        # blocks of cifar_resnet18 inside the classifier: conv1, bn1, layer1.0 ... layer4.1, fc
        depth = max(g["layerwise_block"] for g in groups) + 1
        assert depth == 11
        before = {g["layerwise_block"]: g["lr"] for g in groups}
        assert before[10] == pytest.approx(0.01) and before[0] == pytest.approx(0.01 * 0.5**10)
        trainer.fit()
        after = {g["layerwise_block"]: g["lr"] for g in trainer.state.optimizers[0].param_groups}
    finally:
        trainer.close()
    ratios = {block: after[block] / before[block] for block in before}
    assert max(ratios.values()) < 1.0  # the linear decay moved every group ...
    assert max(ratios.values()) == pytest.approx(min(ratios.values()))  # ... by the same factor


# --- gradient checkpointing ----------------------------------------------------------------


def _saved_bytes(model, x):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).logsumexp(1).mean()
    return loss, total[0]


def test_gradient_checkpointing_same_loss_gradients_and_bn_stats_less_saved_memory():
    torch.manual_seed(0)
    plain = registry.models.build("cifar_resnet18", num_classes=10).train()
    checkpointed = copy.deepcopy(plain)
    assert apply_gradient_checkpointing(checkpointed) == 8  # the eight BasicBlocks
    x = torch.randn(4, 3, 32, 32)
    loss_a, bytes_a = _saved_bytes(plain, x)
    loss_b, bytes_b = _saved_bytes(checkpointed, x)
    loss_a.backward()
    loss_b.backward()
    assert torch.allclose(loss_a, loss_b)
    for (name, pa), (_, pb) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6, rtol=1e-4), name
    for (name, ba), (_, bb) in zip(plain.named_buffers(), checkpointed.named_buffers()):
        assert torch.equal(ba, bb), name  # running stats moved once, not twice
    assert bytes_b < 0.5 * bytes_a, (bytes_a, bytes_b)
    # eval mode and copies (e.g. EMA's) behave like the original
    clone = copy.deepcopy(checkpointed).eval()
    with torch.no_grad():
        assert torch.allclose(clone(x), plain.eval()(x), atol=1e-5)


def test_gradient_checkpointing_names_what_it_could_not_find():
    with pytest.raises(ValueError, match="no modules of type Bottleneck to checkpoint; the model has: .*Conv2d"):
        apply_gradient_checkpointing(_net(), targets=["Bottleneck"])


def test_layer_freezing_writes_checkpoints_after_a_layer_froze(tiny_recipe):
    """Composer's LayerFreezing leaves the frozen parameters' momentum in optimizer.state; torch's state_dict then
    failed the first checkpoint after a freeze (KeyError: the id of a parameter). Three epochs, freezing from 30%:
    every epoch's checkpoint is written."""
    from dlrecipes.api import resolve
    from tests.conftest import fit

    result = fit(
        resolve(
            tiny_recipe,
            [
                "run_name=frozen",
                "trainer.max_duration=3ep",
                "optimizer.momentum=0.9",
                "algorithms={layer_freezing: {freeze_start: 0.3, freeze_level: 1.0}}",
            ],
        )
    )
    assert result.status == "finished" and result.epochs == 3
    assert sorted(p.name for p in (result.run_dir / "checkpoints").glob("ep*-rank0.pt")) == [
        "ep1-ba3-rank0.pt",
        "ep2-ba6-rank0.pt",
        "ep3-ba9-rank0.pt",
    ]
