"""Fine-tuning: the head found or named, its own learning rate, a frozen backbone, layer-wise decay, new heads."""

from __future__ import annotations

import pytest
import torch

from dlrecipes.algorithms.finetune import default_head, head_parameter_names
from dlrecipes.api import resolve
from dlrecipes.errors import RecipeError
from tests.conftest import build_trainer, fit, prepare_run_dir, run_cli, write

FINETUNE = [
    "model={name: mnist_cnn, width: 4}",
    "dataset.image_size=28",
    "finetune={freeze_backbone: 1ep, head_lr: 0.5}",
    "checkpoint.save=false",
    "~checkpoint.monitor",
]


def _net(trainer):
    return trainer.state.model.module


@pytest.mark.slow
def test_the_backbone_stays_frozen_for_its_epochs_then_trains(tiny_recipe):
    config = resolve(tiny_recipe, [*FINETUNE, "trainer.max_duration=1ep"])
    trainer = build_trainer(config, prepare_run_dir(config, "frozen", resume=False))
    try:
        net = _net(trainer)
        head = head_parameter_names(net, [])
        assert default_head(net) == "classifier.2" and head == {"classifier.2.weight", "classifier.2.bias"}
        start = {k: v.clone() for k, v in net.state_dict().items()}
        groups = trainer.state.optimizers[0].param_groups
        head_groups = [g for g in groups if g.get("finetune_head")]
        assert head_groups and all(g["lr"] == 0.5 for g in head_groups)
        assert all(g["lr"] == config.optimizer.params["lr"] for g in groups if not g.get("finetune_head"))

        trainer.fit()  # epoch 1: only the head learns
        after = net.state_dict()
        in_head = {k for k in after if k.startswith("classifier.2.")}
        frozen = [k for k in after if k not in in_head]
        assert frozen and all(torch.equal(after[k], start[k]) for k in frozen)  # weights and BN statistics alike
        assert any(not torch.equal(after[k], start[k]) for k in in_head)

        trainer.fit(duration="1ep")  # epoch 2: everything learns
        later = net.state_dict()
        assert any(not torch.equal(later[k], start[k]) for k in frozen if k.endswith("weight"))
        assert any(k.endswith("running_mean") and not torch.equal(later[k], start[k]) for k in frozen)
        assert all(p.requires_grad for p in net.parameters())
    finally:
        trainer.close()


def test_named_heads_and_layer_decay_shape_the_learning_rates(tiny_recipe):
    from dlrecipes.records.history import group_lrs, run_lr

    config = resolve(
        tiny_recipe,
        [*FINETUNE, "finetune.head=[classifier.*]", "finetune.layer_decay=0.5", "finetune.freeze_backbone=0ep"],
    )
    trainer = build_trainer(config, prepare_run_dir(config, "decay", resume=False))
    try:
        groups = trainer.state.optimizers[0].param_groups
        lrs = sorted({g["lr"] for g in groups})
        assert len(lrs) >= 3 and max(lrs) == 0.5  # the head keeps head_lr, deeper-in blocks get less
        # history.csv: "lr" is the head's (no group trains at optimizer.lr, 0.05: the last group stands in), and each
        # block at another rate has a column of its own
        assert run_lr(trainer.state) == 0.5
        assert group_lrs(trainer.state) == {f"lr/block{k}": 0.05 * 0.5 ** (7 - k) for k in range(7)}
        assert "FreezeBackbone" not in {type(a).__name__ for a in trainer.state.algorithms}
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "override, message",
    [
        ("finetune.head_lr=0", "finetune.head_lr: expected float > 0 or null, got 0"),
        ("finetune.layer_decay=1.5", r"finetune.layer_decay: expected float in \(0, 1\] or null, got 1.5"),
        ("finetune.freeze_backbone=soon", "finetune.freeze_backbone"),
        ("finetune.heads=[fc]", "finetune.heads"),
    ],
)
def test_bad_finetune_settings_name_the_key(tiny_recipe, override, message):
    with pytest.raises(RecipeError, match=message):
        resolve(tiny_recipe, [*FINETUNE, override])
    with pytest.raises(RecipeError, match="keep one of them"):
        resolve(tiny_recipe, [*FINETUNE, "finetune.layer_decay=0.5", "algorithms={layerwise_lr_decay: {}}"])


def test_a_head_that_matches_nothing_is_named_before_training(tiny_recipe):
    config = resolve(tiny_recipe, [*FINETUNE, "finetune.head=[fc]"])
    with pytest.raises(
        RecipeError,
        match=r"finetune.head: no module of the model matches \['fc'\]; "
        r"its top-level modules are: features, classifier",
    ):
        build_trainer(config, prepare_run_dir(config, "nohead", resume=False))


def test_timm_heads_are_found_from_the_model():
    import timm

    assert default_head(timm.create_model("resnet10t", num_classes=3)) == "fc"
    assert default_head(timm.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32)) == "head"


@pytest.mark.slow
def test_finetuning_our_checkpoint_onto_a_new_class_count(tiny_recipe, tmp_path):
    source = fit(resolve(tiny_recipe, ["run_name=source"]))
    best = source.run_dir / "checkpoints" / "best.pt"
    recipe = write(
        tmp_path / "new_head.yaml",
        f"""
        model: {{name: cnn_simple, width: 4, hidden: 16}}
        dataset: {{name: synthetic, num_classes: 3, input_shape: [1, 8, 8], train_samples: 64, eval_samples: 32}}
        runs_dir: {tmp_path / "runs"}
        trainer: {{max_duration: 2ep, batch_size: 32, progress_bar: false, device: cpu}}
        optimizer: {{name: sgd, lr: 0.05}}
        checkpoint: {{load_path: {best}, save: false}}
        finetune: {{freeze_backbone: 1ep, head_lr: 0.1}}
    """,
    )
    refused = run_cli("train", str(recipe))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint.load_path: {best} does not fit the model: module.classifier.3.weight (10, 16) vs the "
        "model's (3, 16); module.classifier.3.bias (10,) vs the model's (3,). For a new head (another class count), "
        "skip those weights with checkpoint.load_ignore_keys (e.g. ['module.classifier.3.*'])"
    )
    done = run_cli("train", str(recipe), "checkpoint.load_ignore_keys=[module.classifier.3.*]")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded weights from" in done.stderr and "not loaded: module.classifier.3.bias" in done.stderr
