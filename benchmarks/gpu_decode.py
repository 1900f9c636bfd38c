"""gpu_suite.py's ``decode`` section: JPEGs decoded on the device (``dataset.decode: device``) against FFCV.

On the flagship's generated ImageNet-like JPEGs (gpu_suite.py's ``flagship_data``: 6,000 of about 500x375 and their
FFCV files at 256 px): nvJPEG's batched decode alone (``torchvision.io.decode_jpeg(list, device="cuda")``), the
device-decode loader alone (the workers read files and draw crops; each batch decoded, cropped to 160 px, flipped
and normalised on the device), and ``dlrecipes train`` of the flagship recipe (ResNet-50, its algorithms) at 160 px
fed by it, then by FFCV at 160 px: the steady epochs' images/s of each (history.csv). The goal: the loader never
the bottleneck of ResNet-50 on one H100 (at least 6,000 images/s). About 3 minutes on an H100 (two ResNet-50
trainings of 3 epochs, FFCV's compilation); ``--tiny`` on the CPU: a smoke run of the device path (no FFCV run).
"""

from __future__ import annotations

import copy
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CROP = 160


def crop_of(scale) -> int:
    return scale.crop if scale.tiny else CROP  # the smoke run: the flagship's tiny crop


def device_decode_overrides(images: Path, scale) -> list[str]:
    """The flagship recipe on the image folder, decoded on the device, at ``CROP`` px."""
    return [
        f"dataset={{name: image_folder, train_path: {images}/train, val_path: {images}/val, "
        f"crop_size: {crop_of(scale)}, "
        f"eval_crop_size: {scale.eval_crop}, resize_size: {max(scale.eval_crop, round(scale.eval_crop / 0.875))}, "
        "min_scale: 0.25, decode: device}"
    ]


def loader_alone(images: Path, scale) -> list[float]:
    """Images/s of the device-decode train loader, epoch by epoch, each batch decoded on the device (no model)."""
    from dlrecipes.api import resolve
    from dlrecipes.builders import build_dataloaders, build_datasets

    config = resolve(
        ROOT / "recipes" / "imagenet100_fast.yaml",
        device_decode_overrides(images, scale)
        + [
            f"trainer.batch_size={scale.flagship_batch}",
            f"trainer.num_workers={scale.workers}",
            f"trainer.device={scale.device}",
            f"trainer.precision={scale.precision}",
            "model.min_input_size=16",
        ],
    )
    train, _ = build_dataloaders(build_datasets(config.dataset), config.trainer, scale.device, seed=0)
    rates = []
    for epoch in range(scale.epochs):
        train.dataloader.sampler.set_epoch(epoch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start, seen = time.perf_counter(), 0
        for batch in train.dataloader:
            images_, _ = train.batch_transforms(batch)
            seen += images_.shape[0]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rates.append(seen / (time.perf_counter() - start))
    return rates


def trained(overrides: list[str], runs: Path, scale, name: str) -> dict:
    """``dlrecipes train`` of the flagship recipe with ``overrides``, in its own process: images/s per epoch."""
    small = ["model.min_input_size=16"] if scale.tiny else []
    cmd = [
        sys.executable,
        "-m",
        "dlrecipes",
        "train",
        str(ROOT / "recipes" / "imagenet100_fast.yaml"),
        *small,
        *overrides,
        f"trainer.batch_size={scale.flagship_batch}",
        f"trainer.num_workers={scale.workers}",
        f"trainer.device={scale.device}",
        f"trainer.precision={scale.precision}",
        f"trainer.max_duration={scale.epochs}ep",
        "trainer.progress_bar=false",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
        f"runs_dir={runs}",
        f"run_name={name}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    with open(runs / name / "history.csv") as f:
        rates = [float(row["images_per_sec"]) for row in csv.DictReader(f)]
    return {"epochs": rates, "steady": statistics.median(rates[1:]) if len(rates) > 1 else rates[0]}


def decode_section(scale, data_dir: Path | None, flagship_data, nvjpeg_rate) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        images = data_dir or Path(tmp) / "images"
        ffcv = flagship_data(scale, images)
        result: dict = {
            "crop": crop_of(scale),
            "nvjpeg_img_s": nvjpeg_rate(images / "train") if scale.device == "gpu" else None,
        }
        if result["nvjpeg_img_s"]:
            print(f"decode    nvJPEG batched decode alone: {result['nvjpeg_img_s']:,.0f} img/s", flush=True)
        result["loader_epochs"] = loader_alone(images, scale)
        print(
            f"decode    device-decode loader alone: {', '.join(f'{r:.0f}' for r in result['loader_epochs'])} "
            "img/s per epoch",
            flush=True,
        )
        runs = Path(tmp) / "runs"
        result["device_decode"] = trained(device_decode_overrides(images, scale), runs, scale, "device_decode")
        print(
            f"decode    ResNet-50 at {crop_of(scale)} px fed by device decoding: "
            f"{result['device_decode']['steady']:,.0f} img/s",
            flush=True,
        )
        if not scale.tiny:  # FFCV at the same crop (its compilation: a minute on the CPU, left to the flagship)
            at_crop = copy.copy(scale)
            at_crop.crop = CROP
            ffcv_overrides = [
                f"dataset.train_path={ffcv}/train.beton",
                f"dataset.val_path={ffcv}/val.beton",
                f"dataset.crop_size={CROP}",
                f"dataset.eval_crop_size={scale.eval_crop}",
            ]
            result["ffcv"] = trained(ffcv_overrides, runs, at_crop, "ffcv")
            print(f"decode    ResNet-50 at {CROP} px fed by FFCV: {result['ffcv']['steady']:,.0f} img/s", flush=True)
    return result
