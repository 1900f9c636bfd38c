"""Every registered model builds and runs a forward pass on its expected input size."""

from __future__ import annotations

import pytest
import torch

from dlrecipes import registry
from dlrecipes.builders import model_params
from dlrecipes.config import Component
from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import RecipeError


def _fake_splits(input_shape, num_classes=7):
    return DatasetSplits(train=None, eval=None, num_classes=num_classes, input_shape=input_shape)


@pytest.mark.parametrize(
    "entry", [e for e in registry.models if not e.metadata.get("multi_io")], ids=lambda e: e.name
)  # multi-input models: tests/test_multi_io.py
def test_model_forward_on_its_input_size(entry):
    shape = entry.metadata["input_size"]
    params = model_params(Component(entry.name, dict(entry.metadata.get("example_params", {}))), _fake_splits(shape))
    model = registry.models.build(entry.name, **params).eval()
    with torch.no_grad():
        out = model(torch.randn(2, *shape))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def test_cifar_resnet18_has_the_published_parameter_count():
    model = registry.models.build("cifar_resnet18", num_classes=10)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - 11.17e6) / 11.17e6 < 0.01


def test_models_accept_other_channel_counts():
    model = registry.models.build("mnist_cnn", num_classes=3, in_chans=3)
    assert model(torch.randn(2, 3, 20, 20)).shape == (2, 3)


def test_timm_refuses_small_inputs_and_points_to_cifar_models():
    with pytest.raises(RecipeError, match=r"32x32 \(below min_input_size=64\).*cifar_resnet18"):
        registry.models.build("timm", arch="resnet18", num_classes=10, input_shape=(3, 32, 32))
    model = registry.models.build("timm", arch="resnet18", num_classes=10, input_shape=(3, 32, 32), min_input_size=32)
    assert model.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_timm_loads_a_local_pretrained_file(tmp_path):
    source = registry.models.build("timm", arch="resnet18", num_classes=1000)
    weights = tmp_path / "resnet18.pth"
    torch.save(source.state_dict(), weights)
    model = registry.models.build("timm", arch="resnet18", num_classes=1000, pretrained_path=str(weights))
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    # a new head for another class count: the backbone is loaded, the classifier is fresh
    model = registry.models.build("timm", arch="resnet18", num_classes=5, pretrained_path=str(weights))
    assert torch.equal(model.conv1.weight, source.conv1.weight) and model.fc.out_features == 5


def test_model_num_classes_must_match_the_data():
    with pytest.raises(RecipeError, match="model.num_classes: 5 does not match the dataset, which has 7 classes"):
        model_params(Component("cnn_simple", {"num_classes": 5}), _fake_splits((1, 28, 28)))


@pytest.mark.parametrize("loss", ["cross_entropy", "binary_cross_entropy"])
def test_mosaicml_init_as_their_resnet_benchmark(loss):
    """Kaiming-normal conv/linear weights, BN weights uniform in [0, 1) and biases 0; with binary
    cross-entropy the classifier bias at -log(num_classes) (mosaicml/examples resnet_imagenet model.py)."""
    import math

    from dlrecipes.builders import build_model

    data = DatasetSplits([], [], 100, (3, 64, 64))
    torch.manual_seed(0)
    net = build_model(Component("torchvision", {"arch": "resnet50", "init": "mosaicml"}), data, loss).module
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    weights = torch.cat([m.weight.detach() for m in bns])
    assert 0.0 <= weights.min() and weights.max() < 1.0 and 0.45 < weights.mean() < 0.55
    assert all(bool((m.bias == 0).all()) for m in bns)
    conv = net.layer3[0].conv2  # 256 x 256 x 3 x 3: fan-in 2304, Kaiming std sqrt(2 / 2304)
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / 2304), rel=0.02)
    assert net.fc.weight.std().item() == pytest.approx(math.sqrt(2 / 2048), rel=0.02)
    if loss == "binary_cross_entropy":
        assert torch.allclose(net.fc.bias, torch.full((100,), -math.log(100)))
    else:
        assert net.fc.bias.abs().max() < 0.1  # torchvision's own uniform(+-1/sqrt(fan_in)) bias


def test_the_model_loss_comes_from_the_recipe():
    data = DatasetSplits([], [], 10, (3, 64, 64))
    params = model_params(Component("torchvision", {"arch": "resnet18"}), data, "binary_cross_entropy")
    assert params["loss"] == "binary_cross_entropy"
    with pytest.raises(RecipeError, match="model.loss: 'cross_entropy' differs from the recipe's loss"):
        model_params(
            Component("torchvision", {"arch": "resnet18", "loss": "cross_entropy"}), data, "binary_cross_entropy"
        )


@pytest.mark.parametrize("family", ["timm", "torchvision"])
def test_the_shipped_architecture_lists_are_the_installed_libraries(family):
    """validate looks names up in these lists; rewrite them with `python -m dlrecipes.models.arch_names`."""
    from dlrecipes.models.arch_names import installed, shipped

    version, names = installed(family)
    shipped_version, shipped_names = shipped(family)
    if version != shipped_version:
        pytest.skip(f"{family} {version} is installed, the list is from {shipped_version}: names checked at run time")
    assert shipped_names == set(names)


def test_a_name_missing_from_the_list_is_asked_of_the_library(monkeypatch):
    from dlrecipes.models import arch_names

    monkeypatch.setattr(arch_names, "shipped", lambda family: ("0", frozenset()))
    arch_names.check_arch("timm", "resnet18", "model")  # a newer library's model: found by asking timm
    with pytest.raises(RecipeError, match=r"model.arch: unknown timm architecture 'resnet5' \(did you mean"):
        arch_names.check_arch("timm", "resnet5", "model")
    with pytest.raises(RecipeError, match=r"model.arch: unknown torchvision classification model 'resnet5'"):
        arch_names.check_arch("torchvision", "resnet5", "model")


def test_an_older_library_than_the_list_is_asked(monkeypatch):
    """A listed name is trusted only when the installed library is not older than the list."""
    from dlrecipes.models import arch_names

    monkeypatch.setattr(arch_names, "shipped", lambda family: ("999.0", frozenset({"resnet18", "made_up_net"})))
    assert arch_names._older_than_list("timm")
    with pytest.raises(RecipeError, match=r"model.arch: unknown timm architecture 'made_up_net'"):
        arch_names.check_arch("timm", "made_up_net", "model")
    monkeypatch.setattr(arch_names, "shipped", lambda family: ("0.1", frozenset({"made_up_net"})))
    arch_names.check_arch("timm", "made_up_net", "model")  # a newer library: the list is trusted, timm not asked


def test_an_offline_pretrained_fetch_fails_at_once_naming_pretrained_path(monkeypatch):
    """Offline (HF_HUB_OFFLINE here, or a hub that does not answer) the hub's minute of retries is skipped:
    weights in the local cache would load, missing ones fail in one line."""
    import time

    from dlrecipes.errors import DataError
    from dlrecipes.models import fetch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(
        DataError,
        match=r"model.pretrained: cannot download the pretrained weights of timm "
        r"'resnet18' \(offline, and not in the local cache\); .* model.pretrained_path",
    ):
        registry.models.build("timm", arch="resnet18", num_classes=10, pretrained=True)
    assert time.perf_counter() - start < 5
    start = time.perf_counter()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert not fetch.reachable(("192.0.2.1", 443), timeout=0.5)  # TEST-NET: nothing answers
    assert time.perf_counter() - start < 2
