"""The flagship benchmark's generated data and scale, shared by gpu_suite.py (its speed) and gpu_check.py (its
sync-free case): ImageNet-like JPEGs made once under a folder, their FFCV files, and the overrides that point the
flagship recipe (recipes/imagenet100_fast.yaml) at them."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from data_loading import make_images


class Scale:
    """The sizes a suite run uses: ``tiny`` for the CPU smoke run the tests make, full for a GPU."""

    def __init__(self, tiny: bool, device: str):
        self.tiny, self.device = tiny, device
        self.precision = "amp_bf16" if device == "gpu" else "fp32"
        self.images = 48 if tiny else 6000
        self.image_size = (500, 375)  # about ImageNet's
        self.classes = 4 if tiny else 100
        self.crop, self.eval_crop, self.max_res = (32, 32, 48) if tiny else (192, 224, 256)
        self.flagship_batch = 8 if tiny else 256
        self.epochs = 3 if tiny else 5
        self.workers = 1 if tiny else 16
        self.steps, self.rounds, self.warmup = (2, 2, 1) if tiny else (30, 5, 10)


def flagship_overrides(data: Path, scale: Scale) -> list[str]:
    small = ["model.min_input_size=16"] if scale.tiny else []  # timm's ResNet-50 at 32 px: a smoke run only
    return small + [
        f"dataset.train_path={data}/train.beton",
        f"dataset.val_path={data}/val.beton",
        f"dataset.crop_size={scale.crop}",
        f"dataset.eval_crop_size={scale.eval_crop}",
        f"trainer.batch_size={scale.flagship_batch}",
        f"trainer.num_workers={scale.workers}",
        f"trainer.device={scale.device}",
        f"trainer.precision={scale.precision}",
    ]


def _make_images(root: Path, scale: Scale) -> None:
    """``scale.images`` JPEGs under ``root``/train, in up to ``scale.workers`` processes of at least 100 images
    (20-30 ms each on one core: 6,000 take 2-3 minutes), each its part from a seed of its own."""
    parts = max(1, min(scale.workers, scale.images // 100))
    size = -(-scale.images // parts)
    jobs = [
        (root, min(size, scale.images - k * size), scale.classes, k, 80, scale.image_size, k * size)
        for k in range(parts)
    ]
    if parts == 1:
        make_images(*jobs[0])
        return
    # forked: the parts need numpy and PIL only, never CUDA (which a fork could not use)
    with ProcessPoolExecutor(parts, mp_context=multiprocessing.get_context("fork")) as pool:
        for done in [pool.submit(make_images, *job) for job in jobs]:
            done.result()


def flagship_data(scale: Scale, root: Path) -> Path:
    """Generated ImageNet-like JPEGs under ``root`` (kept if there) and their FFCV files; returns their folder."""
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.ffcv.files import ConvertOptions, RawImages, write_beton

    ffcv = root / f"ffcv-{scale.max_res}"
    if not (ffcv / "val.beton").exists():
        t = time.perf_counter()
        if not (root / "train").exists():
            _make_images(root, scale)
        val = root / "val"
        if not val.exists():  # the eval split: every tenth image, linked (a stand-in, not held out)
            for i, image in enumerate(sorted((root / "train").glob("*/*.jpg"))):
                if i % 10 == 0:
                    (val / image.parent.name).mkdir(parents=True, exist_ok=True)
                    (val / image.parent.name / image.name).symlink_to(image)
        ffcv.mkdir(parents=True, exist_ok=True)
        options = ConvertOptions(max_resolution=scale.max_res, write_mode="jpg", num_workers=scale.workers)
        for split in ("train", "val"):
            write_beton(RawImages(ImageFolder(str(root / split))), ffcv / f"{split}.beton", options)
        print(f"flagship  data: {scale.images} JPEGs -> FFCV in {time.perf_counter() - t:.0f}s", flush=True)
    return ffcv
