"""The tensor cache: decode once to a memory map, then batched crops; round trip and a run."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from PIL import Image

from dlrecipes.api import resolve
from dlrecipes.data.tensor_cache import CachedBatches, build_cache, center_crop, random_resized_crop
from dlrecipes.errors import RecipeError
from tests.conftest import fit


def _folder(root, per_class=5):
    samples = []
    sample_id = 0
    for label, c in enumerate(("a", "b", "c")):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            path = root / c / f"{i}.png"
            Image.fromarray(np.full((20 + 2 * i, 30, 3), sample_id, dtype=np.uint8)).save(path)
            samples.append((str(path), label))
            sample_id += 1
    return samples


def test_cache_holds_every_image_once_and_is_rebuilt_only_when_files_change(tmp_path):
    samples = _folder(tmp_path / "train")
    path = build_cache(samples, tmp_path / "cache", "train", 16, workers=1)
    images = np.load(path, mmap_mode="r")
    assert images.shape == (15, 16, 16, 3) and images.dtype == np.uint8
    assert [int(img[8, 8, 0]) for img in images] == list(range(15))
    assert np.load(tmp_path / "cache" / "train-16.labels.npy").tolist() == [label for _, label in samples]
    stamp = path.stat().st_mtime_ns
    assert build_cache(samples, tmp_path / "cache", "train", 16, workers=1).stat().st_mtime_ns == stamp
    Image.fromarray(np.full((20, 30, 3), 99, dtype=np.uint8)).save(samples[0][0])
    rebuilt = np.load(build_cache(samples, tmp_path / "cache", "train", 16, workers=1), mmap_mode="r")
    assert int(rebuilt[0][8, 8, 0]) == 99


def test_a_cache_whose_files_are_not_its_sources_is_made_again_never_unpickled(tmp_path, capsys):
    """A cache folder copied from elsewhere or edited, its fingerprint left as it was: labels of another count, an
    object array (which would unpickle), images of another shape. Each is said and made again from the source."""
    samples = _folder(tmp_path / "train", per_class=2)
    path = build_cache(samples, tmp_path / "cache", "train", 8, workers=1)
    labels = tmp_path / "cache" / "train-8.labels.npy"
    for damage in (
        lambda: np.save(labels, np.arange(3)),
        lambda: np.save(labels, np.array([{"a": 1}] * 6, dtype=object), allow_pickle=True),
        lambda: np.save(path, np.zeros((6, 4, 4, 3), dtype=np.uint8)),
    ):
        damage()
        capsys.readouterr()
        assert build_cache(samples, tmp_path / "cache", "train", 8, workers=1) == path
        assert "is not its source's (damaged or edited): made again" in capsys.readouterr().err
        assert np.load(labels).tolist() == [label for _, label in samples]
        assert np.load(path, mmap_mode="r").shape == (6, 8, 8, 3)
    build_cache(samples, tmp_path / "cache", "train", 8, workers=1)
    assert "made again" not in capsys.readouterr().err  # a whole cache is used as it is


def test_batches_cover_the_epoch_once_per_sample_and_shards_split_it(tmp_path):
    samples = _folder(tmp_path / "train", per_class=6)
    path = build_cache(samples, tmp_path / "cache", "train", 12, workers=1)
    labels = tmp_path / "cache" / "train-12.labels.npy"
    batches = CachedBatches(path, labels, batch_size=4, train=True, seed=0, rank=0, world_size=1)
    seen = torch.cat([batches[0, i][0][:, 0, 6, 6] for i in range(len(batches))]).tolist()
    assert len(batches) == 4 and len(seen) == len(set(seen)) == 16  # 18 samples, 4 full batches, no repeats
    shards = [CachedBatches(path, labels, 3, True, 0, rank, 2) for rank in (0, 1)]
    ids = [set(torch.cat([s[0, i][0][:, 0, 6, 6] for i in range(len(s))]).tolist()) for s in shards]
    assert not ids[0] & ids[1] and len(ids[0]) == len(ids[1]) == 9


def test_crops_have_the_requested_size_and_keep_constant_images_constant():
    images = torch.full((4, 3, 20, 30), 7, dtype=torch.uint8)
    out = random_resized_crop(images, 8, (0.2, 1.0), torch.Generator().manual_seed(0))
    assert out.shape == (4, 3, 8, 8) and out.dtype == torch.uint8 and bool((out == 7).all())
    assert center_crop(images, 16, 0.8).shape == (4, 3, 16, 16)


@pytest.mark.slow
def test_training_from_the_tensor_cache(tmp_path, tiny_recipe):
    _folder(tmp_path / "imgs" / "train", per_class=8)
    _folder(tmp_path / "imgs" / "val", per_class=2)
    result = fit(
        resolve(
            tiny_recipe,
            [
                f"dataset={{name: image_folder, train_path: {tmp_path}/imgs/train, val_path: {tmp_path}/imgs/val, "
                "crop_size: 16, resize_size: 20}",
                "model={name: cifar_resnet18}",
                "trainer.loader=tensor_cache",
                "trainer.batch_size=8",
                "run_name=tc",
                "trainer.num_workers=1",
                "trainer.max_duration=1ep",
            ],
        )
    )
    assert result.batches == 3
    assert (tmp_path / "imgs" / ".dlrecipes-cache" / "train-20.npy").exists()
    # the loaders' worker processes end with the training, not whenever the garbage collector reaches them (then,
    # in a later training of this process, each waited out torch's 5 s join timeout)
    assert not multiprocessing.active_children()


def test_tensor_cache_honours_separate_train_and_eval_sizes(tmp_path):
    from dlrecipes import registry
    from dlrecipes.data.tensor_cache import build_tensor_cache_loader

    _folder(tmp_path / "imgs" / "train", per_class=4)
    _folder(tmp_path / "imgs" / "val", per_class=2)
    data = registry.datasets.build(
        "image_folder",
        train_path=str(tmp_path / "imgs" / "train"),
        val_path=str(tmp_path / "imgs" / "val"),
        crop_size=12,
        eval_crop_size=18,
        resize_size=20,
    )
    shapes = {}
    for split, dataset, train in (("train", data.train, True), ("eval", data.eval, False)):
        loader = build_tensor_cache_loader(
            dataset, 2, train, torch.device("cpu"), 0, 0, 0, 1, None, None, **data.augment
        )
        shapes[split] = next(iter(loader))[0].shape
    assert shapes == {"train": (2, 3, 12, 12), "eval": (2, 3, 18, 18)}


def test_tensor_cache_is_for_image_folders(tiny_recipe):
    with pytest.raises(RecipeError, match="trainer.loader: 'tensor_cache' caches image folders"):
        resolve(tiny_recipe, ["trainer.loader=tensor_cache"])


def test_device_side_crops_stay_on_the_device_and_match_the_boxes_they_draw():
    """The GPU path of the tensor cache: random-resized crops, flips and normalisation of a batch
    with nothing drawn on the host or read back (checked on the meta device), and on the CPU a
    full-image box with no flip gives the resized image."""
    from dlrecipes.data.tensor_cache import crop_on_device, normalize, random_resized_crop_on_device

    from .stays_on_device import StaysOnDevice

    mean = torch.tensor([0.5, 0.4, 0.3]).view(1, -1, 1, 1).to("meta")
    std = torch.tensor([0.2, 0.2, 0.2]).view(1, -1, 1, 1).to("meta")
    batch = torch.zeros(8, 3, 48, 48, dtype=torch.uint8, device="meta")
    with StaysOnDevice() as audit:
        train = normalize(crop_on_device(batch, None, True, 32, 0.35, 0.875, True), mean, std)
        val = normalize(crop_on_device(batch, None, False, 32, 0.35, 0.875, True), mean, std)
    assert train.shape == val.shape == (8, 3, 32, 32) and audit.left == []

    ramp = torch.arange(16, dtype=torch.float32).repeat(16, 1).expand(2, 3, 16, 16).contiguous()
    whole = random_resized_crop_on_device(ramp, 16, (1.0, 1.0), torch.Generator().manual_seed(0), ratio=(1.0, 1.0))
    assert torch.allclose(whole, ramp, atol=1e-4)  # the whole image, same size: unchanged
    # flips: the same seed draws the same boxes, so each crop is the unflipped one or its mirror image, and
    # about half are mirrored (random images: no crop is its own mirror image)
    images = torch.randint(0, 256, (32, 3, 24, 20), generator=torch.Generator().manual_seed(2)).float()
    plain = random_resized_crop_on_device(images, 12, (0.3, 1.0), torch.Generator().manual_seed(1))
    flipped = random_resized_crop_on_device(images, 12, (0.3, 1.0), torch.Generator().manual_seed(1), hflip=True)
    _assert_about_half_mirrored(plain, flipped)


def _assert_about_half_mirrored(plain: torch.Tensor, flipped: torch.Tensor) -> None:
    mirrored = [torch.allclose(f, p.flip(-1), atol=1e-3) for p, f in zip(plain, flipped)]
    kept = [torch.allclose(f, p, atol=1e-3) for p, f in zip(plain, flipped)]
    assert all(m != k for m, k in zip(mirrored, kept)), (mirrored, kept)  # each one or the other, never both
    assert 8 <= sum(mirrored) <= 24, mirrored  # of 32


def test_host_side_crops_flip_about_half_of_the_crops():
    """The CPU path of the tensor cache (crop_batch): with hflip, each crop is the same crop as without, or its
    mirror image."""
    from dlrecipes.data.tensor_cache import crop_batch

    images = torch.randint(0, 256, (32, 3, 24, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    plain = crop_batch(images, torch.Generator().manual_seed(1), True, 12, 0.3, 0.875, hflip=False)
    flipped = crop_batch(images, torch.Generator().manual_seed(1), True, 12, 0.3, 0.875, hflip=True)
    assert plain.shape == flipped.shape == (32, 3, 12, 12)
    _assert_about_half_mirrored(plain.float(), flipped.float())


# --- dlrecipes data convert --format tensor_cache ---------------------------------------------------------------


def _convert_to_cache(folders, out=None, **options):
    from dlrecipes import api
    from dlrecipes.tools.data_convert import CacheOptions

    lines: list[str] = []
    params = {
        "train_path": str(folders / "train"),
        "val_path": str(folders / "val"),
        "crop_size": 12,
        "resize_size": 16,
    }
    reports = api.convert_dataset(
        "image_folder", params, out, CacheOptions(num_workers=1, **options), echo=lines.append, format="tensor_cache"
    )
    return reports, lines, params


def test_data_convert_writes_the_cache_the_loader_then_uses_as_it_is(tmp_path, monkeypatch):
    """The converted cache holds each source image, resized and centre-cropped, where training looks for it;
    building the loader afterwards rewrites nothing, and FFCV is never imported."""
    import sys

    from dlrecipes import registry
    from dlrecipes.data.tensor_cache import build_tensor_cache_loader, resize_center_crop

    from .conftest import image_folders

    monkeypatch.setitem(sys.modules, "ffcv", None)  # `import ffcv` fails, as where it is not installed
    folders = image_folders(tmp_path / "imgs", ["ant", "bee"])
    reports, lines, params = _convert_to_cache(folders)
    cache = tmp_path / "imgs" / ".dlrecipes-cache"  # beside the split folders: trainer.cache_dir's default
    assert [(r.split, r.samples, r.classes, r.size, r.written) for r in reports] == [
        ("train", 4, 2, 16, True),
        ("val", 4, 2, 16, True),
    ]
    assert lines[0] == f"caching train: 4 images -> {cache / 'train-16.npy'}"
    assert lines[1].startswith("  4 samples, 2 classes, 16x16 RGB uint8, ")
    assert lines[-1] == "train from it with trainer.loader=tensor_cache"
    data = registry.datasets.build("image_folder", **params)
    for split, dataset in (("train", data.train), ("val", data.eval)):
        expected = [resize_center_crop(Image.open(path).convert("RGB"), 16) for path, _ in dataset.samples]
        assert np.array_equal(np.load(cache / f"{split}-16.npy"), np.stack(expected))
        assert np.load(cache / f"{split}-16.labels.npy").tolist() == [label for _, label in dataset.samples]

    stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert sorted(stamps) == sorted(
        f"{s}-16{ext}" for s in ("train", "val") for ext in (".npy", ".labels.npy", ".json")
    )
    for dataset, train in ((data.train, True), (data.eval, False)):
        loader = build_tensor_cache_loader(
            dataset, 2, train, torch.device("cpu"), 0, 0, 0, 1, None, None, **data.augment
        )
        assert next(iter(loader))[0].shape == (2, 3, 12, 12)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps  # found up to date, not rebuilt

    again, lines, _ = _convert_to_cache(folders)
    assert [r.written for r in again] == [False, False] and lines[0].endswith(
        "train-16.npy is up to date (--overwrite rebuilds it)"
    )
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    assert [r.written for r in _convert_to_cache(folders, overwrite=True)[0]] == [True, True]


def test_data_convert_rejects_an_unknown_format_a_dataset_without_pil_images_and_the_other_format_s_options():
    from .conftest import run_cli

    for args, expected in (
        (
            ["digits", "--format", "tensor-cache"],
            "error: --format: expected ffcv, tensor_cache or shards, got 'tensor-cache'",
        ),
        (
            ["digits", "--format", "ffcv", "--out", "x", "--shard-size", "1MB"],
            "error: --shard-size: only with --format shards; --format ffcv reads --max-resolution, --write-mode, "
            "--jpeg-quality, --compress-probability, --page-size, --skip-bad, --out, --workers and --overwrite",
        ),
        (
            ["digits", "--format", "tensor_cache", "--write-mode", "raw"],
            "error: --write-mode: only with --format ffcv; --format tensor_cache reads --cache-size, --out, --workers "
            "and --overwrite",
        ),
        (
            ["digits", "--out", "x", "--cache-size", "32"],
            "error: --cache-size: only with --format tensor_cache; --format ffcv reads --max-resolution, --write-mode, "
            "--jpeg-quality, --compress-probability, --page-size, --skip-bad, --out, --workers and --overwrite",
        ),
        (
            ["digits", "--format", "tensor_cache"],
            (
                "error: --format tensor_cache: the tensor cache decodes datasets of PIL images (hf, image_folder, "
                "imagenet, imagenet100); 'digits' has none "
                "(use --format ffcv, or train it with trainer.loader=device or torch)"
            ),
        ),
    ):
        result = run_cli("data", "convert", *args)
        assert (result.returncode, result.stderr.strip()) == (2, expected), result.stderr


@pytest.mark.slow
def test_training_uses_a_converted_cache_in_its_cache_dir(tmp_path, tiny_recipe):
    from .conftest import image_folders

    folders = image_folders(tmp_path / "imgs", ["ant", "bee"], per_class=4)
    lines = _convert_to_cache(folders, out=tmp_path / "cache", cache_size=14)[1]
    assert (
        lines[-1] == f"train from it with trainer.loader=tensor_cache trainer.cache_dir={tmp_path / 'cache'} "
        "trainer.cache_size=14"
    )
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()}
    result = fit(
        resolve(
            tiny_recipe,
            [
                (
                    f"dataset={{name: image_folder, train_path: {folders}/train, val_path: {folders}/val, "
                    "crop_size: 12, resize_size: 16}"
                ),
                "model={name: cifar_resnet18}",
                "trainer.batch_size=4",
                "run_name=converted",
                "trainer.num_workers=0",
                "trainer.max_duration=1ep",
                *lines[-1].split()[4:],
            ],
        )
    )
    assert result.batches == 2
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()} == stamps
    assert not (folders / ".dlrecipes-cache").exists()
