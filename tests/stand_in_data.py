"""Generated stand-ins for the datasets recipes name, in their own formats: MNIST's idx files, CIFAR's
pickled batches, ImageNet-style JPEG folders and FFCV files made from them."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

from .conftest import image_folders


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` as an MNIST idx file of unsigned bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist_files(root: Path, train: int = 20, test: int = 10) -> Path:
    """root/MNIST/raw/ with random 28x28 digits labelled 0-9 in turn."""
    raw, rng = root / "MNIST" / "raw", np.random.default_rng(0)
    write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 255, (train, 28, 28)))
    write_idx(raw / "train-labels-idx1-ubyte", np.arange(train) % 10)
    write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 255, (test, 28, 28)))
    write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(test) % 10)
    return root


def cifar_batches(folder: Path, per_batch: int = 6) -> Path:
    """``folder`` (cifar-10-batches-py) with five training batches and a test batch of ``per_batch`` random images."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 255, (per_batch, 3072), dtype=np.uint8),
            "labels": [i % 10 for i in range(per_batch)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:  # as in the real archive: names as bytes in python 2 pickles
        pickle.dump({"label_names": [f"class{i}".encode() for i in range(10)], "num_vis": 3072}, f)
    return folder


def ffcv_files(images: Path, out: Path, max_resolution: int) -> Path:
    """``out``/train.beton and val.beton written from the image folders images/train and images/val."""
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.ffcv.files import ConvertOptions, RawImages, write_beton

    out.mkdir(parents=True, exist_ok=True)
    options = ConvertOptions(max_resolution=max_resolution, write_mode="jpg", num_workers=1)
    for split in ("train", "val"):
        write_beton(RawImages(ImageFolder(str(images / split))), out / f"{split}.beton", options)
    return out


def shard_files(images: Path, out: Path) -> Path:
    """``out``: dataset shards (litdata) written from the image folders images/train and images/val."""
    from dlrecipes.data.image_folder import build_image_folders
    from dlrecipes.data.shards.write import ShardsOptions, write_shards

    splits = build_image_folders(str(images / "train"), str(images / "val"), 16, 18, 0.35, True, (0.5,) * 3, (0.5,) * 3)
    write_shards(splits, str(out), ShardsOptions(), echo=lambda line: None)
    return out


__all__ = ["write_idx", "mnist_files", "cifar_batches", "ffcv_files", "shard_files", "image_folders"]
