"""Image folders decoded by libjpeg-turbo (dlrecipes/data/jpeg.py) against the PIL path: the same crop box and flip
from the same seed, and pixels equal within a stated tolerance, at full size and at a reduced (DCT-scaled) size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import image_folders

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# After normalisation (1 / 255 of the range is about 0.017): the decoders and the resizes (torch's uint8 antialiased
# bilinear kernel, made to match Pillow's, and roi_align's area mean after a reduced decode) round differently.
# Measured on these images and 48 more, 3-4 seeds each (2026-11-28): whole 0.0001 on average, 0.0175 (1/255) at most;
# reduced up to 0.101 on average (0.40 at most: DCT scaling's block mean against Pillow's wider triangle filter, on
# stripes a few pixels wide at the reduced size), its evaluation 0.077 (0.24). The bounds leave room for another
# libjpeg-turbo build.
FULL = {"mean": 0.005, "max": 0.05}  # decoded whole: under 1/255 on average, 3/255 at most
DEVICE = {"mean": 0.02, "max": 0.15}  # decoded whole in a batch, each box by its area mean (roi_align)
REDUCED = {"mean": 0.12, "max": 0.45}  # decoded at 1/4 or 1/8 of the size: 7/255 on average, 26/255 at most


def photo_like(path: Path, size: tuple[int, int], seed: int) -> None:
    """A JPEG with smooth gradients and a little noise, as photographs are (random pixels are not)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    channels = [np.sin(x / rng.uniform(8, 40) + rng.uniform(0, 6)) + np.cos(y / rng.uniform(8, 40)) for _ in range(3)]
    pixels = (np.stack(channels, -1) * 60 + 128 + rng.normal(0, 4, (h, w, 3))).clip(0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=90)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    for s, split in enumerate(("train", "val")):
        for k, c in enumerate(("a", "b")):
            for i in range(3):  # the same images in every process (hash() of a str is not)
                photo_like(root / split / c / f"{i}.jpg", (400 + 37 * i, 300), seed=100 * s + 10 * k + i)
    return root


def _both(folders: Path, crop: int, resize: int, min_scale: float):
    from dlrecipes.data.image_folder import build_image_folders

    args = (str(folders / "train"), str(folders / "val"), crop, resize, min_scale, True, MEAN, STD)
    return build_image_folders(*args, decode="turbo"), build_image_folders(*args, decode="pil")


def _difference(turbo, pil, index: int, seed: int) -> tuple[float, float]:
    torch.manual_seed(seed)
    a, label_a = turbo[index]
    torch.manual_seed(seed)
    b, label_b = pil[index]
    assert label_a == label_b and a.shape == b.shape and a.dtype == b.dtype == torch.float32
    diff = (a - b).abs()
    return float(diff.mean()), float(diff.max())


@pytest.mark.parametrize("crop, min_scale, kind", [(224, 0.9, FULL), (24, 0.5, REDUCED)], ids=["whole", "reduced"])
def test_training_crops_equal_the_pil_paths_within_the_tolerance(folders, crop, min_scale, kind):
    turbo, pil = _both(folders, crop, crop + 32, min_scale)
    assert turbo.train.decodes_with_turbo() and not pil.train.decodes_with_turbo()
    for index in range(len(turbo.train)):
        for seed in (0, 1, 2):
            mean, largest = _difference(turbo.train, pil.train, index, seed)
            assert mean <= kind["mean"] and largest <= kind["max"], (index, seed, mean, largest)


@pytest.mark.parametrize("crop, resize, kind", [(224, 256, FULL), (24, 32, REDUCED)], ids=["whole", "reduced"])
def test_evaluation_crops_equal_the_pil_paths_within_the_tolerance(folders, crop, resize, kind):
    turbo, pil = _both(folders, crop, resize, 0.35)
    for index in range(len(turbo.eval)):
        mean, largest = _difference(turbo.eval, pil.eval, index, 0)
        assert mean <= kind["mean"] and largest <= kind["max"], (index, mean, largest)


def test_a_reduced_decode_is_used_only_where_the_crop_box_is_that_many_times_the_crop():
    from dlrecipes.data.jpeg import largest_scale

    assert largest_scale(400, 50, jpeg=True) == 8 and largest_scale(400, 100, jpeg=True) == 4
    assert largest_scale(400, 101, jpeg=True) == 1 and largest_scale(400, 50, jpeg=False) == 1


def test_a_pil_step_added_by_composer_switches_the_dataset_to_pil(folders):
    from composer.utils import add_vision_dataset_transform
    from torchvision import transforms

    turbo, _ = _both(folders, 32, 40, 0.35)
    add_vision_dataset_transform(turbo.train, transforms.RandomGrayscale(p=1.0), is_tensor_transform=False)
    assert not turbo.train.decodes_with_turbo()
    image, _ = turbo.train[0]
    assert torch.allclose(image[0] * STD[0] + MEAN[0], image[1] * STD[1] + MEAN[1], atol=1e-5)  # grey: it ran


def test_an_unreadable_file_is_named_on_both_paths(tmp_path):
    from dlrecipes.data.image_folder import build_image_folders
    from dlrecipes.errors import DataError

    image_folders(tmp_path, ["a"], per_class=2)
    (tmp_path / "train" / "a" / "0.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    for decode in ("turbo", "pil"):
        splits = build_image_folders(
            str(tmp_path / "train"), str(tmp_path / "val"), 16, 20, 0.35, True, MEAN, STD, decode=decode
        )
        with pytest.raises(DataError, match=r"cannot read image .*0\.jpg .*bad_images=skip"):
            splits.train[0]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_batch_decoded_on_the_device_equals_the_pil_path_within_the_tolerance(folders, split):
    """decode: device on the CPU (the same code as on a GPU, where decode_jpeg is nvJPEG's): the workers' crops
    and flips, decoded and cropped as one batch, against the PIL path sample by sample."""
    from dlrecipes.data.device_decode import DecodeOnDevice, collate_encoded
    from dlrecipes.data.image_folder import build_image_folders

    args = (str(folders / "train"), str(folders / "val"), 64, 72, 0.5, True, MEAN, STD)
    later, pil = build_image_folders(*args, decode="device"), build_image_folders(*args, decode="pil")
    later, pil = getattr(later, split), getattr(pil, split)
    samples, expected = [], []
    for index in range(len(later)):
        torch.manual_seed(index)
        samples.append(later[index])
        torch.manual_seed(index)
        expected.append(pil[index])
    images, labels = DecodeOnDevice(torch.device("cpu"), *later.device_decode[:1], MEAN, STD)(collate_encoded(samples))
    assert labels.tolist() == [label for _, label in expected]
    for image, (reference, _) in zip(images, expected):
        diff = (image - reference).abs()
        assert float(diff.mean()) <= DEVICE["mean"] and float(diff.max()) <= DEVICE["max"], (
            split,
            float(diff.mean()),
            float(diff.max()),
        )


def test_progressive_resizing_sets_the_size_the_device_decode_crops_to(folders):
    """The device path's training loader decodes at a size it is told, as FFCV's: each box is cropped once at the
    scheduled size, and equals the full-size batch's crop of the same box resized (within the device tolerance)."""
    from dlrecipes.algorithms.progressive_resizing import decodes_at_a_size
    from dlrecipes.data.device_decode import DecodeOnDevice, EncodedLoader, collate_encoded
    from dlrecipes.data.image_folder import build_image_folders

    args = (str(folders / "train"), str(folders / "val"), 64, 72, 0.5, True, MEAN, STD)
    later = build_image_folders(*args, decode="device").train
    loader = EncodedLoader(later, batch_size=4, collate_fn=collate_encoded)
    loader.decoder = DecodeOnDevice(torch.device("cpu"), *later.device_decode)
    assert decodes_at_a_size(loader) and loader.full_resolution == 64
    torch.manual_seed(0)
    batch = next(iter(loader))
    full, _ = loader.decoder(batch)
    loader.set_resolution(32)
    small, labels = loader.decoder(batch)
    assert small.shape == (4, 3, 32, 32) and loader.full_resolution == 64 and len(labels) == 4
    shrunk = torch.nn.functional.interpolate(full, size=(32, 32), mode="bilinear", antialias=True)
    assert float((small - shrunk).abs().mean()) <= DEVICE["mean"] * 2  # two resamplings against one


@pytest.mark.slow
def test_a_training_decoded_on_the_device_follows_progressive_resizing(tmp_path):
    from tests.conftest import run_cli, write

    image_folders(tmp_path / "data", ["a", "b"], per_class=8, size=(64, 48))
    recipe = write(
        tmp_path / "device.yaml",
        f"""
        model: {{name: cifar_resnet18}}
        dataset: {{name: image_folder, train_path: {tmp_path}/data/train, val_path: {tmp_path}/data/val,
                   crop_size: 32, resize_size: 36, decode: device}}
        trainer: {{max_duration: 3ep, batch_size: 8, num_workers: 1, progress_bar: false, device: cpu}}
        optimizer: {{name: sgd, lr: 0.01}}
        checkpoint: {{save: false}}
        runs_dir: {tmp_path}/runs
        run_name: device
        algorithms:
          progressive_resizing: {{initial_scale: 0.5, delay_fraction: 0.0, finetune_fraction: 0.34, size_increment: 8}}
    """,
    )
    result = run_cli("train", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 3 epochs, 6 batches" in result.stderr
    log = (tmp_path / "runs" / "device" / "train-rank0.log").read_text()
    resolutions = [
        int(float(line.rsplit(":", 1)[1])) for line in log.splitlines() if "progressive_resizing/resolution" in line
    ]
    assert list(dict.fromkeys(resolutions)) == [16, 24, 32]  # set in the decoder at each epoch's start


def _bogus_huffman_table(path: Path) -> None:
    """A JPEG whose header (size) and end read whole but whose first Huffman table libjpeg-turbo refuses."""
    data = bytearray(path.read_bytes())
    table = data.index(b"\xff\xc4")
    data[table + 5 : table + 21] = b"\xff" * 16  # code counts that add up to more than 256
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("bad_images", ["fail", "skip"])
def test_an_unreadable_file_decoded_on_the_device_is_named_or_skipped(tmp_path, bad_images, capfd):
    """decode: device reads a truncated file in the worker (bad_images as on the other paths); a file whose header and
    end are whole but whose data the device's decoder and the CPU's refuse fails the batch's decode: named in the
    same line, or skipped (warned of once, its place the batch's next readable sample's)."""
    from dlrecipes.data.device_decode import DecodeOnDevice, collate_encoded
    from dlrecipes.data.image_folder import build_image_folders
    from dlrecipes.errors import DataError

    image_folders(tmp_path, ["a"], per_class=4, size=(64, 48))
    cut = tmp_path / "train" / "a" / "0.jpg"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size * 2 // 3])
    _bogus_huffman_table(tmp_path / "train" / "a" / "1.jpg")
    splits = build_image_folders(
        str(tmp_path / "train"),
        str(tmp_path / "val"),
        16,
        20,
        0.35,
        True,
        MEAN,
        STD,
        bad_images=bad_images,
        decode="device",
    )
    decoder = DecodeOnDevice(torch.device("cpu"), *splits.train.device_decode)
    message = (
        r"dataset.train_path: cannot read image .*{}\.jpg \(.*\); fix or remove it, or set dataset.bad_images=skip"
    )
    if bad_images == "fail":
        with pytest.raises(DataError, match=message.format(0)):
            splits.train[0]
        with pytest.raises(DataError, match=message.format(1)):
            decoder(collate_encoded([splits.train[i] for i in (1, 2, 3)]))
        return
    samples = [splits.train[i] for i in range(4)]  # 0: the worker skips it (1's sample in its place)
    images, labels = decoder(collate_encoded(samples))
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [0, 0, 0, 0]
    images_again, _ = decoder(collate_encoded(samples))
    assert torch.equal(images[:2], images_again[:2]) and torch.equal(images[1], images[2])  # 1's place: 2's sample
    warned = capfd.readouterr().err
    assert warned.count("skipping unreadable image") == 2 and warned.count("1.jpg") == 1, warned
