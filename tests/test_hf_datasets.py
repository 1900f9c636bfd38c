"""dataset: {name: hf}: the embedded digits saved as a Hugging Face dataset (save_to_disk and Parquet), read back,
cached, converted and trained on; a missing dataset, split, column or library is one line."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dlrecipes import registry
from dlrecipes.data.digits import load_digits_arrays, stratified_split
from dlrecipes.errors import DataError, UserError

from .conftest import REPO, TINY_RECIPE, run_cli, write

if importlib.util.find_spec("datasets") is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI installs the hf extra (in dev); the Hugging Face dataset tests must run there")
    pytest.skip("Hugging Face datasets is not installed (pip install -e '.[hf]')", allow_module_level=True)

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SIZE = 8  # the digits' own side: no resizing, so what is read back is the source, pixel for pixel


def _digits(count: int | None):
    """(uint8 images 0..240, labels) of the train and test splits: a stratified 80/20 split, ``count`` images at
    most."""
    images, labels = load_digits_arrays()
    images = (images.astype(np.uint16) * 15).astype(np.uint8)
    train, test = stratified_split(labels, 0.2, 0)
    if count is not None:
        train, test = train[:count], test[: max(1, count // 4)]
    return {"train": (images[train], labels[train]), "test": (images[test], labels[test])}


def _save(root, source, monkeypatch) -> dict:
    """The digits as a Hugging Face dataset: a save_to_disk folder and a Parquet folder; their paths by layout."""
    import datasets

    # load_dataset copies a Parquet folder into the library's cache: this test's, not the user's
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "hf-cache"))
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    splits = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict({"image": list(images), "label": labels.tolist()}, features=features)
            for split, (images, labels) in source.items()
        }
    )
    splits.save_to_disk(str(root / "saved"))
    (root / "parquet").mkdir()
    for split, table in splits.items():
        table.to_parquet(str(root / "parquet" / f"{split}.parquet"))
    return {"saved": root / "saved", "parquet": root / "parquet"}


@pytest.fixture
def digits_hf(tmp_path, monkeypatch):
    source = _digits(40)
    return source, _save(tmp_path, source, monkeypatch)


def _build(path, **params):
    return registry.datasets.build("hf", path=str(path), crop_size=SIZE, resize_size=SIZE, hflip=False, **params)


def _rgb(images: np.ndarray) -> np.ndarray:
    return np.repeat(images[..., None], 3, axis=-1)  # grey digits as the RGB images every reader gives


@pytest.mark.parametrize("layout", ["saved", "parquet"])
def test_images_labels_and_class_names_read_back_as_saved(digits_hf, layout):
    from dlrecipes.data.ffcv.files import RawImages

    source, paths = digits_hf
    data = _build(paths[layout])
    assert data.class_names == NAMES and data.num_classes == 10  # the ClassLabel's names
    for split, dataset in (("train", data.train), ("test", data.eval)):  # eval_split unset: test (no validation)
        images, labels = source[split]
        raw = RawImages(dataset)
        assert len(raw) == len(labels)
        assert np.array_equal(np.stack([raw[i][0] for i in range(len(raw))]), _rgb(images))
        assert [raw[i][1] for i in range(len(raw))] == labels.tolist()
    image, label = data.eval[0]  # the eval transform: centre crop of the whole 8x8 image, normalised
    assert tuple(image.shape) == (3, SIZE, SIZE) and label == int(source["test"][1][0])


def test_splits_are_chosen_by_name(digits_hf):
    source, paths = digits_hf
    data = _build(paths["saved"], split="test", eval_split="train")
    assert len(data.train) == len(source["test"][1]) and len(data.eval) == len(source["train"][1])


def test_the_tensor_cache_holds_the_source_images(digits_hf, tmp_path):
    from dlrecipes.data.tensor_cache import build_cache

    source, paths = digits_hf
    data = _build(paths["parquet"])
    images = np.load(build_cache(data.train, tmp_path / "cache", "train", SIZE, workers=1))
    assert np.array_equal(images, _rgb(source["train"][0]))
    assert np.load(tmp_path / "cache" / f"train-{SIZE}.labels.npy").tolist() == source["train"][1].tolist()


def test_data_convert_writes_the_tensor_cache_training_finds_up_to_date(digits_hf):
    """``data convert hf --format tensor_cache``: each split's images and labels as saved, in the folder of its
    Arrow files (where training looks by default), and the loader then builds nothing."""
    import torch

    from dlrecipes import api
    from dlrecipes.data.tensor_cache import build_tensor_cache_loader, cache_is_current
    from dlrecipes.tools.data_convert import CacheOptions

    source, paths = digits_hf
    params = {"path": str(paths["saved"]), "crop_size": SIZE, "resize_size": SIZE, "hflip": False}
    lines: list[str] = []
    reports = api.convert_dataset(
        "hf", params, None, CacheOptions(num_workers=1), echo=lines.append, format="tensor_cache"
    )
    data = _build(paths["saved"])
    for report, (split, dataset, train) in zip(reports, (("train", data.train, True), ("test", data.eval, False))):
        images, labels = source[split]
        cache = report.images.parent
        assert cache == dataset.cache_home() / ".dlrecipes-cache" and report.written
        assert (report.samples, report.classes) == (len(labels), len(np.unique(labels)))
        assert np.array_equal(np.load(report.images), _rgb(images))
        assert np.load(cache / f"{report.split}-{SIZE}.labels.npy").tolist() == labels.tolist()
        assert cache_is_current(dataset, cache, report.split, SIZE)
        stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
        build_tensor_cache_loader(dataset, 4, train, torch.device("cpu"), 0, 0, 0, 1, None, None, **data.augment)
        assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    assert f"caching train: {len(source['train'][1])} images -> {reports[0].images}" in lines


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "image_column=img",
            "error: dataset.image_column: {path} has no column 'img' (did you mean 'image'?); "
            "its columns: image, label",
        ),
        ("label_column=digit", "error: dataset.label_column: {path} has no column 'digit'; its columns: image, label"),
        ("image_column=label", "error: dataset.image_column: column 'label' of {path} holds ClassLabel("),
        ("eval_split=validaton", "error: dataset.eval_split: {path} has no split 'validaton'; its splits: train, test"),
    ],
)
def test_a_wrong_column_or_split_is_one_line_naming_the_key_and_what_exists(digits_hf, tmp_path, override, expected):
    _, paths = digits_hf
    result = run_cli("data", "convert", "hf", f"path={paths['saved']}", override, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected.format(path=paths["saved"])), result.stderr


def test_a_hub_dataset_offline_and_not_cached_fails_at_once_in_one_line(tmp_path, monkeypatch):
    import datasets  # noqa: F401  (imported before the clock starts: what is timed is the hub's answer)

    import dlrecipes.tools.data_convert  # noqa: F401

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    result = run_cli("data", "convert", "hf", "path=nobody-here/no-such-digits", "--out", str(tmp_path / "out"))
    assert time.perf_counter() - start < 15  # the hub's own retries take about a minute
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: dataset.path: cannot download the Hugging Face dataset 'nobody-here/no-such-digits' (offline, and "
        "not in the local cache); download it on a connected machine "
        "(datasets.load_dataset('nobody-here/no-such-digits').save_to_disk(FOLDER)) and set dataset.path to that folder"
    )


def test_without_the_datasets_library_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(UserError, match=r"pip install 'dlrecipes\[hf\]'"):
        _build(tmp_path)


def test_a_folder_without_data_files_is_named(tmp_path):
    with pytest.raises(DataError, match=rf"dataset.path: cannot read {tmp_path} as a Hugging Face dataset"):
        _build(tmp_path)


def test_a_saved_datasets_metadata_names_only_its_own_files(digits_hf, tmp_path):
    """dataset_dict.json's split names and state.json's data files are data: a name leading out of the dataset's
    folder (which load_from_disk would open) is one line naming the metadata file, and nothing outside is read."""
    import json
    import shutil

    _, paths = digits_hf
    outside = tmp_path / "outside.arrow"
    shutil.copy(next((paths["saved"] / "train").glob("*.arrow")), outside)
    state = paths["saved"] / "train" / "state.json"
    held = json.loads(state.read_text())
    held["_data_files"] = [{"filename": "../../outside.arrow"}]
    state.write_text(json.dumps(held))
    with pytest.raises(DataError, match=r"state.json names the file '../../outside.arrow', which is not a plain name"):
        _build(paths["saved"])
    listed = paths["saved"] / "dataset_dict.json"
    listed.write_text(json.dumps({"splits": ["train", "../../elsewhere"]}))
    with pytest.raises(DataError, match=r"dataset_dict.json names a split '../../elsewhere', which is not a plain"):
        _build(paths["saved"])


def test_validating_an_hf_recipe_does_not_import_datasets(tmp_path):
    recipe = write(
        tmp_path / "hf.yaml",
        TINY_RECIPE.replace(
            "dataset: {name: digits, image_size: 8, augment: false}",
            "dataset: {name: hf, path: nobody-here/digits, crop_size: 8, resize_size: 8}",
        ),
    )
    code = (
        "import sys; from dlrecipes.api import resolve; resolve(sys.argv[1], []); "
        "assert 'datasets' not in sys.modules, 'datasets imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(recipe)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("ffcv") is None, reason="FFCV is not installed")
def test_data_convert_writes_ffcv_files_with_the_class_names(digits_hf, tmp_path):
    from dlrecipes.data.ffcv.files import inspect_beton

    source, paths = digits_hf
    out = tmp_path / "ffcv"
    result = run_cli(
        "data",
        "convert",
        "hf",
        f"path={paths['saved']}",
        f"crop_size={SIZE}",
        f"resize_size={SIZE}",
        "--out",
        str(out),
        "--workers",
        "1",
        "--write-mode",
        "raw",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for split, beton in (("train", "train.beton"), ("test", "val.beton")):
        info = inspect_beton(out / beton)
        labels = source[split][1]
        assert info["samples"] == len(labels) and info["class_names"] == NAMES
        counts = {int(k): v for k, v in info["classes"].items()}
        assert counts == {int(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True))}


@pytest.mark.slow
def test_one_epoch_on_the_saved_digits_learns_them(tmp_path, monkeypatch, tiny_recipe):
    from dlrecipes.api import resolve
    from tests.conftest import fit

    paths = _save(tmp_path, _digits(None), monkeypatch)
    result = fit(
        resolve(
            tiny_recipe,
            [
                f"dataset={{name: hf, path: {paths['saved']}, crop_size: 8, resize_size: 8, "
                "min_scale: 1.0, hflip: false}",
                "model={name: cnn_simple, width: 16, hidden: 64}",
                "optimizer={name: adamw, lr: 0.002}",
                "trainer.loader=tensor_cache",
                f"trainer.cache_dir={tmp_path / 'cache'}",
                "trainer.max_duration=1ep",
                "trainer.batch_size=16",
                "trainer.train_subset_num_batches=-1",
                "trainer.eval_subset_num_batches=-1",
                "run_name=hf",
            ],
        )
    )
    assert result.batches == 1437 // 16
    assert result.eval_metrics["top1"] >= 0.7  # chance is 0.1 (it reached 0.9 when written)
