"""Datasets: the embedded digits, synthetic data, image folders, and MNIST/CIFAR from files."""

from __future__ import annotations

import functools
import hashlib
import http.server
import tarfile
import threading

import numpy as np
import pytest
import torch

from dlrecipes import registry
from dlrecipes.data import torchvision_sets
from dlrecipes.data.digits import load_digits_arrays, stratified_split
from dlrecipes.data.image_folder import imagenet100_classes
from dlrecipes.errors import DataError

from .conftest import image_folders
from .stand_in_data import cifar_batches, write_idx


def test_embedded_digits_are_the_real_uci_set():
    images, labels = load_digits_arrays()
    assert images.shape == (1797, 8, 8) and images.max() == 16
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_digits_split_is_stratified_disjoint_and_shaped():
    _, labels = load_digits_arrays()
    train, evaluation = stratified_split(labels, 0.2, seed=0)
    assert len(set(train) & set(evaluation)) == 0 and len(train) + len(evaluation) == 1797
    assert all(abs((labels[evaluation] == c).sum() - 0.2 * (labels == c).sum()) <= 1 for c in range(10))
    data = registry.datasets.build("digits", image_size=28, augment=True)
    x, y = data.train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and isinstance(y, int)
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10 and len(data.eval) == len(evaluation)
    eval_x = torch.stack([data.eval[i][0] for i in range(len(data.eval))])
    assert abs(eval_x.mean().item()) < 0.2  # normalised with the training statistics


def test_synthetic_is_deterministic():
    a = registry.datasets.build(
        "synthetic", num_classes=3, input_shape=(3, 8, 8), train_samples=10, eval_samples=4, seed=1
    )
    b = registry.datasets.build(
        "synthetic", num_classes=3, input_shape=(3, 8, 8), train_samples=10, eval_samples=4, seed=1
    )
    assert torch.equal(a.train.tensors[0], b.train.tensors[0]) and len(a.eval) == 4
    assert a.train.tensors[1].max() < 3


_jpegs = image_folders


def test_image_folder_builds_transforms_per_split(tmp_path):
    _jpegs(tmp_path, ["cat", "dog", "emu"])
    data = registry.datasets.build(
        "image_folder", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"), crop_size=16, resize_size=20
    )
    assert data.num_classes == 3 and data.class_names == ["cat", "dog", "emu"]
    x, y = data.train[0]
    assert x.shape == (3, 16, 16) and y == 0
    assert data.eval[5][0].shape == (3, 16, 16) and data.eval[5][1] == 2


def test_image_folder_train_and_eval_sizes_are_separate(tmp_path):
    """MosaicML's mild recipe shape: small training crops, larger evaluation centre crops."""
    _jpegs(tmp_path, ["cat", "dog"], size=(40, 30))
    data = registry.datasets.build(
        "image_folder",
        train_path=str(tmp_path / "train"),
        val_path=str(tmp_path / "val"),
        crop_size=12,
        eval_crop_size=20,
        resize_size=24,
    )
    assert data.train[0][0].shape == (3, 12, 12) and data.eval[0][0].shape == (3, 20, 20)
    assert data.input_shape == (3, 12, 12)
    assert data.augment["crop_size"] == 12 and data.augment["eval_crop_size"] == 20


def test_an_eval_crop_larger_than_the_resize_is_refused_at_validation(tmp_path):
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    from .conftest import write

    recipe = write(
        tmp_path / "r.yaml",
        f"""
description: sizes
model: {{name: cifar_resnet18}}
dataset: {{name: imagenet, root: {tmp_path}, crop_size: 176, eval_crop_size: 240, resize_size: 232}}
""",
    )
    with pytest.raises(
        RecipeError,
        match=r"dataset.eval_crop_size: a 240 px evaluation centre crop does not fit .* "
        r"dataset.resize_size=232",
    ):
        resolve(recipe, check_device=False)


def test_image_folder_errors_name_the_folder(tmp_path):
    with pytest.raises(DataError, match=r"dataset.train_path: folder not found: .*nope"):
        registry.datasets.build("image_folder", train_path=str(tmp_path / "nope"), val_path=str(tmp_path))
    _jpegs(tmp_path, ["a"])
    (tmp_path / "train" / "empty").mkdir()
    (tmp_path / "val" / "empty").mkdir()
    with pytest.raises(DataError, match="empty"):
        registry.datasets.build("image_folder", train_path=str(tmp_path / "train"), val_path=str(tmp_path / "val"))


def _bad_image_recipe(tmp_path, bad_images):
    _jpegs(tmp_path, ["cat", "dog"], per_class=4, size=(12, 12))
    (tmp_path / "train" / "cat" / "0.jpg").write_bytes(b"")  # zero bytes
    good = (tmp_path / "train" / "dog" / "0.jpg").read_bytes()
    (tmp_path / "train" / "dog" / "1.jpg").write_bytes(good[: len(good) // 3])  # truncated
    from tests.conftest import write

    return write(
        tmp_path / "bad.yaml",
        f"""
        model: {{name: cnn_simple, width: 4, hidden: 8}}
        dataset: {{name: image_folder, train_path: train, val_path: val, crop_size: 8, resize_size: 10,
                   bad_images: {bad_images}}}
        runs_dir: {tmp_path / "runs"}
        trainer: {{max_duration: 3ep, batch_size: 4, num_workers: 2, progress_bar: false, device: cpu}}
        optimizer: {{name: sgd, lr: 0.01}}
        checkpoint: {{save: false}}
    """,
    )


def test_unreadable_images_fail_by_default_naming_the_file(tmp_path):
    from tests.conftest import run_cli

    result = run_cli("train", str(_bad_image_recipe(tmp_path, "fail")), "trainer.num_workers=1")
    assert result.returncode == 2, result.stderr[-1500:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: dataset.train_path: cannot read image ") and "Traceback" not in result.stderr
    assert ("cat/0.jpg" in last or "dog/1.jpg" in last) and "dataset.bad_images=skip" in last


@pytest.mark.slow
def test_unreadable_images_can_be_skipped_and_counted(tmp_path):
    from tests import forked
    from tests.conftest import REPO

    # a process of its own (forked, tests/forked.py): the warnings come from the DataLoader's worker processes,
    # on its stderr
    result = forked.run(["train", str(_bad_image_recipe(tmp_path, "skip"))], REPO)
    assert result.returncode == 0, result.stderr[-1500:]
    warned = {
        line.split("image ")[1].split(" (")[0]
        for line in result.stderr.splitlines()
        if line.startswith("warning: skipping unreadable image")
    }
    assert warned == {str(tmp_path / "train" / "cat" / "0.jpg"), str(tmp_path / "train" / "dog" / "1.jpg")}
    assert "warning: 2 unreadable image(s) skipped in the train data" in result.stderr
    assert "done: 3 epochs" in result.stderr  # two workers, three epochs: still counted once each


def test_class_count_must_match_the_model(tmp_path):
    from tests.conftest import run_cli

    recipe = _bad_image_recipe(tmp_path, "skip")
    result = run_cli("train", str(recipe), "model.num_classes=10")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: model.num_classes: 10 does not match the dataset, which has 2 classes "
        "(leave model.num_classes out to take it from the data)"
    )


def test_imagenet100_uses_the_shipped_synsets_and_lists_missing_ones(tmp_path):
    classes = imagenet100_classes()
    assert len(classes) == 100 and len(set(classes)) == 100 and all(c.startswith("n") for c in classes)
    _jpegs(tmp_path, classes[:98] + ["n99999999"], per_class=1, size=(12, 12))
    with pytest.raises(DataError, match=rf"lacks 2 of the 100 expected class folders: {classes[98]}, {classes[99]}"):
        registry.datasets.build("imagenet100", root=str(tmp_path))
    _jpegs(tmp_path, classes[98:], per_class=1, size=(12, 12))
    data = registry.datasets.build("imagenet100", root=str(tmp_path), crop_size=8, resize_size=10)
    assert data.num_classes == 100 and data.class_names == classes  # the extra folder is ignored
    assert len(data.train) == 100


def test_mnist_reads_idx_files_and_names_missing_ones(tmp_path):
    with pytest.raises(
        DataError,
        match=r"mnist not found \(download is off\)[\s\S]*train-images-idx3-ubyte[\s\S]*t10k-labels-idx1-ubyte",
    ):
        registry.datasets.build("mnist", root=str(tmp_path), download=False)
    raw = tmp_path / "MNIST" / "raw"
    rng = np.random.default_rng(0)
    write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 255, (20, 28, 28)))
    write_idx(raw / "train-labels-idx1-ubyte", np.arange(20) % 10)
    write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 255, (10, 28, 28)))
    write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(10))
    data = registry.datasets.build("mnist", root=str(tmp_path), download=False)
    assert len(data.train) == 20 and len(data.eval) == 10
    x, y = data.eval[3]
    assert x.shape == (1, 28, 28) and y == 3


def _cifar_archive(tmp_path, n=6):
    folder = cifar_batches(tmp_path / "src" / "cifar-10-batches-py", n)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    return archive


@pytest.fixture
def http_server(tmp_path):
    """Serve tmp_path over HTTP on loopback (the download code path, without the internet)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_cifar_download_path_fetches_checks_and_extracts(tmp_path, monkeypatch, http_server):
    archive = _cifar_archive(tmp_path)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    url = f"{http_server}/{archive.name}"
    source = torchvision_sets.CIFAR10.__class__(**{**torchvision_sets.CIFAR10.__dict__, "url": url, "md5": md5})
    monkeypatch.setattr(torchvision_sets, "CIFAR10", source)
    data = registry.datasets.build("cifar10", root=str(tmp_path / "root"), download=True)
    assert len(data.train) == 30 and len(data.eval) == 6 and data.num_classes == 10
    assert data.class_names == [f"class{i}" for i in range(10)]  # from batches.meta, for the end-of-run report
    x, y = data.train[7]
    assert x.shape == (3, 32, 32) and y == 1


def test_cifar_offline_names_the_expected_files(tmp_path, monkeypatch, http_server):
    source = torchvision_sets.CIFAR10.__class__(
        **{**torchvision_sets.CIFAR10.__dict__, "url": f"{http_server}/no-such-archive.tar.gz"}
    )
    monkeypatch.setattr(torchvision_sets, "CIFAR10", source)
    with pytest.raises(DataError, match=r"cifar10 not found \(download failed: [\s\S]*data_batch_1[\s\S]*test_batch"):
        registry.datasets.build("cifar10", root=str(tmp_path / "root" / "cifar"), download=True)
    assert not (tmp_path / "root").exists()  # no empty folders left behind
    with pytest.raises(DataError, match=r"download is off"):
        registry.datasets.build("cifar10", root=str(tmp_path / "root"), download=False)


def test_mnist_failed_download_leaves_no_folders(tmp_path, monkeypatch, http_server):
    from torchvision.datasets import MNIST

    monkeypatch.setattr(MNIST, "mirrors", [f"{http_server}/no-mirror/"])
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match=r"mnist not found \(download failed"):
        registry.datasets.build("mnist", root=str(tmp_path / "data" / "mnist"), download=True)
    assert list((tmp_path / "data").iterdir()) == []  # the folder that existed stays, nothing under it


def test_cifar_resized_for_larger_networks_on_either_loader(tmp_path, monkeypatch, http_server):
    import torch

    from dlrecipes.builders import device_loader

    archive = _cifar_archive(tmp_path)
    source = torchvision_sets.CIFAR10.__class__(
        **{
            **torchvision_sets.CIFAR10.__dict__,
            "url": f"{http_server}/{archive.name}",
            "md5": hashlib.md5(archive.read_bytes()).hexdigest(),
        }
    )
    monkeypatch.setattr(torchvision_sets, "CIFAR10", source)
    data = registry.datasets.build("cifar10", root=str(tmp_path / "root"), download=True, image_size=48)
    assert data.input_shape == (3, 48, 48)
    assert data.train[0][0].shape == (3, 48, 48) and data.eval[0][0].shape == (3, 48, 48)  # DataLoader path
    for dataset, train in ((data.train, True), (data.eval, False)):
        images, _ = next(iter(device_loader(dataset, 4, train, "cpu", seed=0).dataloader))  # on-device path
        assert images.shape == (4, 3, 48, 48) and images.dtype == torch.float32
    # both paths resize the same way: the eval images (no augmentation) agree
    on_device, _ = next(iter(device_loader(data.eval, 2, False, "cpu", seed=0).dataloader))
    assert torch.allclose(on_device, torch.stack([data.eval[0][0], data.eval[1][0]]), atol=1e-4)


def test_timm_on_cifar_is_refused_at_32_px_and_accepted_resized(tmp_path):
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {name: timm, arch: resnet18}\ndataset: {name: cifar10}\ntrainer: {device: cpu}\n")
    with pytest.raises(RecipeError, match="the data is 32x32"):
        resolve(recipe)
    assert resolve(recipe, ["dataset.image_size=64"]).dataset.params["image_size"] == 64
