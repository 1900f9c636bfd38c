"""Images per second from three loaders over the same generated ImageNet-like JPEG folder.

    python benchmarks/data_loading.py [--images 2000] [--batch 64] [--workers 2] [--epochs 4]

(a) torchvision ImageFolder + PIL transforms in a DataLoader, (b) the FFCV loader (after
`data convert`), (c) the tensor cache; all with random-resized-crop to --crop, flip and
normalisation to float32, the same batch size and worker count. ``--loaders device`` adds the
in-memory loader (the folder decoded once at --crop px; pad-and-crop, flip, normalisation).  Only loading is timed (no
model).  ``ffcv_uint8`` is FFCV without the normalisation: the CPU's share of the GPU
pipeline, which normalises on the device.
The first epoch is reported apart from the steady state (mean of the second half of the
epochs): FFCV compiles its pipeline in the first epoch and warms the page cache over the next
ones; the tensor cache decodes the folder before its first epoch (setup).

``--augment none,rand-m9-mstd0.5-inc1`` (the default) times each loader without and with strong
augmentation: a timm policy string (``rand-...``, ``augmix-...``) or ``trivialaugment``, applied to
each loaded batch by the batch algorithm (``batch_randaugment``, ``batch_augmix``,
``batch_trivialaugment``) on the CPU in the main process, where a CPU run applies it; and, for
comparison, the PIL path: the torchvision loader with timm's PIL transform of the same policy
(torchvision's TrivialAugmentWide) in the workers, before ToTensor (``torchvision_pil``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def make_images(
    root: Path,
    count: int,
    classes: int,
    seed: int = 0,
    noise: int = 80,
    size: tuple[int, int] = (500, 375),
    first: int = 0,
) -> None:
    """JPEGs of about ``size`` (500x375: ~100 KB each at noise=80; ImageNet's JPEGs average about 110 KB;
    smoother images would decode unrealistically fast): smooth colour waves plus pixel noise, numbered from
    ``first`` (so that several processes can each write a part)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(first, first + count):
        folder = root / "train" / f"n{i % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        w = int(rng.integers(round(size[0] * 0.88), round(size[0] * 1.12)))
        h = int(rng.integers(round(size[1] * 0.88), round(size[1] * 1.12)))
        yy, xx = np.mgrid[0:h, 0:w]
        base = rng.integers(0, 255, 3)
        freq = rng.uniform(0.005, 0.05, 3)
        img = (base + 80 * np.sin(xx[..., None] * freq + yy[..., None] * freq[::-1])).clip(0, 255).astype(np.uint8)
        img = (img + rng.integers(0, noise, img.shape)).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"{i}.jpg", quality=90)


def time_epochs(loader, epochs: int, augment=None) -> list[float]:
    rates, batch = [], 0
    for _ in range(epochs):
        start, seen = time.perf_counter(), 0
        for images, _ in loader:
            if augment is not None:
                images = augment(images, batch)
                batch += 1
            seen += images.shape[0]
        rates.append(seen / (time.perf_counter() - start))
    return rates


def batch_augmentation(policy: str, loader):
    """``policy``'s batch algorithm as a function of (batch, index), normalised as ``loader`` normalises."""
    from dlrecipes import registry
    from dlrecipes.algorithms.augment_policy import batch_rng
    from dlrecipes.algorithms.batch_augment import augment_uint8

    if policy == "trivialaugment":
        algorithm = registry.algorithms.get("batch_trivialaugment").factory()
    else:
        name = "batch_augmix" if policy.startswith("augmix") else "batch_randaugment"
        algorithm = registry.algorithms.get(name).factory(policy=policy)

    def augment(images, index: int):
        rng = batch_rng(0, 0, index, algorithm.name)
        if images.dtype == torch.uint8:  # FFCV's uint8 pipeline: pixels already
            return augment_uint8(images, algorithm.policy, rng)
        return algorithm.augment(images, rng, lambda: loader)

    return augment


def pil_policy(policy: str):
    """The PIL transform of ``policy``: timm's for its strings, torchvision's TrivialAugmentWide."""
    from timm.data.auto_augment import augment_and_mix_transform, rand_augment_transform
    from torchvision import transforms

    hparams = {"translate_const": 100, "img_mean": (124, 116, 104)}
    if policy == "trivialaugment":
        return transforms.TrivialAugmentWide()
    if policy.startswith("augmix"):
        return augment_and_mix_transform(policy, hparams)
    return rand_augment_transform(policy, hparams)


def torchvision_pil_loader(root: Path, batch: int, workers: int, crop: int, policy: str):
    """The torchvision loader with ``policy`` on PIL images in the workers, just before ToTensor."""
    loader = torchvision_loader(root, batch, workers, crop)
    steps = loader.dataset.transform.transforms
    steps.insert(len(steps) - 2, pil_policy(policy))
    return loader


def torchvision_loader(root: Path, batch: int, workers: int, crop: int):
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD, imagenet_transforms

    dataset = ImageFolder(
        str(root / "train"), transform=imagenet_transforms(crop, crop, 0.08, True, IMAGENET_MEAN, IMAGENET_STD, True)
    )
    return DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True, persistent_workers=True
    )


def ffcv_loader(root: Path, batch: int, workers: int, crop: int, max_resolution: int, min_scale: float = 0.08):
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.ffcv.files import ConvertOptions, RawImages, write_beton
    from dlrecipes.data.ffcv.loader import FFCVLoader, FFCVSource
    from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD

    path = root / f"train-{max_resolution}.beton"
    if not path.exists():
        write_beton(
            RawImages(ImageFolder(str(root / "train"))),
            path,
            ConvertOptions(max_resolution=max_resolution, write_mode="jpg", num_workers=workers),
        )
    source = FFCVSource(str(path), True, crop, crop / 256, min_scale, True, IMAGENET_MEAN, IMAGENET_STD)
    return FFCVLoader(source, batch, workers, torch.device("cpu"), seed=0)


def ffcv_uint8_loader(root: Path, batch: int, workers: int, crop: int, max_resolution: int):
    """The CPU side of the GPU pipeline: decode + crop + flip to uint8; normalisation then runs on the GPU."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    ffcv_loader(root, batch, workers, crop, max_resolution)  # writes the file if needed
    return Loader(
        str(root / f"train-{max_resolution}.beton"),
        batch_size=batch,
        num_workers=workers,
        order=OrderOption.RANDOM,
        drop_last=True,
        pipelines={
            "image": [
                RandomResizedCropRGBImageDecoder((crop, crop)),
                RandomHorizontalFlip(),
                ToTensor(),
                ToTorchImage(),
            ],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },
    )


def tensor_cache_loader(root: Path, batch: int, workers: int, crop: int, cache_size: int):
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.tensor_cache import build_tensor_cache_loader
    from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD

    return build_tensor_cache_loader(
        ImageFolder(str(root / "train")),
        batch,
        True,
        torch.device("cpu"),
        workers,
        0,
        0,
        1,
        root / "cache",
        cache_size,
        crop_size=crop,
        eval_crop_size=crop,
        resize_size=cache_size,
        min_scale=0.08,
        hflip=True,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


def measure(build, epochs: int, policy: str, key: str) -> dict:
    """Setup time and images per second of the loader ``build`` makes, with ``policy`` applied to its batches."""
    t = time.perf_counter()
    loader = build()
    setup = time.perf_counter() - t
    rates = time_epochs(loader, epochs, None if policy == "none" else batch_augmentation(policy, loader))
    # steady state: the second half of the epochs (FFCV's page cache and pipeline warm up over the first)
    steady = float(np.mean(rates[len(rates) // 2 :])) if len(rates) > 1 else rates[0]
    print(f"{key:<40} setup {setup:6.1f}s  first epoch {rates[0]:7.0f} img/s  steady {steady:7.0f} img/s", flush=True)
    return {"setup_s": setup, "first_epoch": rates[0], "steady": steady, "epochs": rates}


def device_loader(root: Path, batch: int, crop: int):
    """The in-memory loader (``trainer.loader: device``, as for CIFAR) over the folder decoded once at ``crop`` px:
    pad-and-crop, flip and normalisation of whole batches (here on the CPU)."""
    from torchvision.datasets import ImageFolder

    from dlrecipes.data.device_loader import BatchAugment, DeviceTensorLoader
    from dlrecipes.data.tensor_cache import build_cache
    from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD

    samples = ImageFolder(str(root / "train")).samples
    path = build_cache(samples, root / "cache", "device", crop)
    images = torch.from_numpy(np.load(path)).permute(0, 3, 1, 2).contiguous()
    labels = torch.tensor([label for _, label in samples])
    augment = BatchAugment(IMAGENET_MEAN, IMAGENET_STD, crop_padding=crop // 8, hflip=True)
    return DeviceTensorLoader(images, labels, batch, augment, train=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--max-resolution", type=int, default=256, help="FFCV stored size")
    parser.add_argument("--cache-size", type=int, default=256, help="tensor cache stored size")
    parser.add_argument("--noise", type=int, default=80, help="pixel noise amplitude of the generated JPEGs")
    parser.add_argument("--data-dir", type=Path, help="reuse/keep the generated images here")
    parser.add_argument("--loaders", default="torchvision,ffcv,ffcv_uint8,tensor_cache")
    parser.add_argument(
        "--augment",
        default="none,rand-m9-mstd0.5-inc1",
        help="none and/or policies: timm strings (rand-..., augmix-...) or trivialaugment",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.data_dir or Path(tmp)
        if not (root / "train").exists():
            t = time.perf_counter()
            make_images(root, args.images, args.classes, noise=args.noise)
            print(f"generated {args.images} JPEGs in {time.perf_counter() - t:.1f}s", flush=True)
        builders = {
            "torchvision": lambda: torchvision_loader(root, args.batch, args.workers, args.crop),
            "ffcv": lambda: ffcv_loader(root, args.batch, args.workers, args.crop, args.max_resolution),
            "ffcv_uint8": lambda: ffcv_uint8_loader(root, args.batch, args.workers, args.crop, args.max_resolution),
            "tensor_cache": lambda: tensor_cache_loader(root, args.batch, args.workers, args.crop, args.cache_size),
            "device": lambda: device_loader(root, args.batch, args.crop),
        }
        results = {}
        policies = args.augment.split(",")
        for name in args.loaders.split(","):
            for policy in policies:
                key = name if policy == "none" else f"{name}+{policy}"
                results[key] = measure(builders[name], args.epochs, policy, key)
            if name == "torchvision":
                for policy in (p for p in policies if p != "none"):
                    key = f"torchvision_pil+{policy}"
                    results[key] = measure(
                        lambda policy=policy: torchvision_pil_loader(root, args.batch, args.workers, args.crop, policy),
                        args.epochs,
                        "none",
                        key,
                    )
        if "torchvision" in results:
            base = results["torchvision"]
            for name, r in results.items():
                print(
                    f"{name:<40} first epoch {r['first_epoch'] / base['first_epoch']:.2f}x  "
                    f"steady {r['steady'] / base['steady']:.2f}x torchvision"
                )
        meta = {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cores": torch.get_num_threads(),
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
