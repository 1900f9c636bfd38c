"""The fast path without FFCV: decode every image once into a uint8 memory-mapped array, then
load whole batches of uint8 tensors and crop, flip and normalise them with batched torch ops.

``trainer.loader: tensor_cache`` on an image-folder dataset writes
``<cache_dir>/<split>-<size>.npy`` (N x size x size x 3: shorter side resized to ``size``,
centre-cropped) and ``...labels.npy`` once, then trains from them.  Random-resized crops are
taken per sample and resized with ``F.interpolate``; evaluation resizes and centre-crops.
On a GPU the crops and normalisation run on the device; on the CPU, in the loader's workers.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from dlrecipes.errors import DataError

# --- building the cache ------------------------------------------------------------------


class FileImages:
    """Image files as the cache reads them: ``(path, label)`` samples, an image folder's."""

    def __init__(self, samples: Sequence[tuple[str, int]]):
        self.samples = [(str(path), int(label)) for path, label in samples]
        self.labels = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def pil_image(self, index: int):
        from PIL import Image

        with Image.open(self.samples[index][0]) as img:
            return img.convert("RGB")

    def cache_fingerprint(self) -> dict:
        stats = [os.stat(p) for p, _ in self.samples]
        return {"files": len(stats), "bytes": sum(s.st_size for s in stats), "mtime": max(s.st_mtime for s in stats)}


def image_source(dataset):
    """What the cache decodes: an ImageFolder's files, or a dataset that decodes its own images (``pil_image(i)``,
    ``labels``, ``cache_fingerprint()``: a Hugging Face dataset's :class:`~dlrecipes.data.hf_dataset.ArrowImages`)."""
    if hasattr(dataset, "pil_image"):
        return dataset
    return FileImages(dataset.samples if hasattr(dataset, "samples") else dataset)


def resize_center_crop(img, size: int) -> np.ndarray:
    """The shorter side resized to ``size``, then the centred ``size`` square, as an HWC uint8 array."""
    from PIL import Image

    w, h = img.size
    scale = size / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    return np.asarray(img.crop((left, top, left + size, top + size)))


_SOURCE = None  # the image source of a decoding worker process (given once, at its start)


def _start_worker(source) -> None:
    global _SOURCE
    _SOURCE = source


def _decode(args: tuple[int, int]) -> np.ndarray:
    index, size = args
    return resize_center_crop(_SOURCE.pil_image(index), size)


def cache_files(cache_dir: Path, split: str, size: int) -> dict[str, Path]:
    """A split's cache files: ``images`` (N x size x size x 3 uint8), ``labels`` (int64) and ``fingerprint`` (the
    source's :meth:`cache_fingerprint` as it was decoded, what says whether the cache is up to date)."""
    return {
        "images": cache_dir / f"{split}-{size}.npy",
        "labels": cache_dir / f"{split}-{size}.labels.npy",
        "fingerprint": cache_dir / f"{split}-{size}.json",
    }


def cache_is_current(source, cache_dir: Path, split: str, size: int) -> bool:
    """Whether ``cache_dir`` holds ``source``'s cache at ``size``, decoded from the files (or table) as they are now."""
    source = image_source(source)
    return _holds(cache_files(cache_dir, split, size), source.cache_fingerprint(), source.labels, size)


def _holds(files: dict[str, Path], fingerprint: dict, labels: Sequence[int], size: int) -> bool:
    """Whether the cache files are the source's: its fingerprint, and the files as data (a folder copied from
    elsewhere, or edited): plain arrays (no pickled objects) of the source's count and image size, its labels
    exactly. A cache that says it is current but is not is said, and made again."""
    try:
        if json.loads(files["fingerprint"].read_text()) != fingerprint:
            return False
        images = np.load(files["images"], mmap_mode="r")  # allow_pickle is off: an object array is refused
        held = np.load(files["labels"])
    except FileNotFoundError:
        return False
    except (OSError, ValueError, TypeError):
        held = images = None
    whole = (
        images is not None
        and images.dtype == np.uint8
        and images.shape == (len(labels), size, size, 3)
        and held.shape == (len(labels),)
        and held.dtype.kind in "iu"
        and np.array_equal(held, np.asarray(labels, dtype=np.int64))
    )
    if not whole:
        warning = f"warning: the tensor cache {files['images']} is not its source's (damaged or edited): made again"
        print(warning, file=sys.stderr)
    return whole


def build_cache(source, cache_dir: Path, split: str, size: int, workers: int = 2, rebuild: bool = False) -> Path:
    """Decode ``source`` (``(path, label)`` samples, or see :func:`image_source`) into ``cache_dir/split-size.npy``
    unless an up-to-date one exists (``rebuild``: even then)."""
    source = image_source(source)
    files = cache_files(cache_dir, split, size)
    fingerprint = source.cache_fingerprint()
    if not rebuild and _holds(files, fingerprint, source.labels, size):
        return files["images"]
    tmp = cache_dir / f".{split}-{size}.tmp-{os.getpid()}.npy"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(source), size, size, 3))
        jobs = [(i, size) for i in range(len(source))]
        with ProcessPoolExecutor(max(1, workers), initializer=_start_worker, initargs=(source,)) as pool:
            for i, image in enumerate(pool.map(_decode, jobs, chunksize=64)):
                out[i] = image
        out.flush()
        del out
        np.save(files["labels"], np.asarray(source.labels, dtype=np.int64))
        os.replace(tmp, files["images"])
        files["fingerprint"].write_text(json.dumps(fingerprint))
    except OSError as exc:
        raise DataError(f"trainer.loader: cannot write the tensor cache under {cache_dir}: {exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return files["images"]


# --- batched augmentation ----------------------------------------------------------------


def random_resized_crop(
    images: torch.Tensor,
    size: int,
    scale: tuple[float, float],
    generator: torch.Generator,
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """Per-sample random-resized crops of an NCHW batch, each resized to ``size`` (dtype kept).

    uint8 input stays uint8: torch's antialiased bilinear resize has a fast uint8 path on CPU.
    """
    n, _, h, w = images.shape
    area = h * w * torch.empty(n).uniform_(*scale, generator=generator)
    aspect = torch.exp(torch.empty(n).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator))
    cw = torch.sqrt(area * aspect).round().clamp(1, w).long()
    ch = torch.sqrt(area / aspect).round().clamp(1, h).long()
    top = (torch.rand(n, generator=generator) * (h - ch + 1)).long()
    left = (torch.rand(n, generator=generator) * (w - cw + 1)).long()
    crops = [
        F.interpolate(
            images[i : i + 1, :, t : t + c_h, x : x + c_w],
            size=(size, size),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
        for i, (t, x, c_h, c_w) in enumerate(zip(top.tolist(), left.tolist(), ch.tolist(), cw.tolist()))
    ]
    return torch.cat(crops)


def random_resized_crop_on_device(
    images: torch.Tensor,
    size: int,
    scale: tuple[float, float],
    generator: torch.Generator | None,
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: bool = False,
) -> torch.Tensor:
    """Random-resized crops (and flips) of a whole NCHW batch in one resampling, as float32.

    The same crop boxes as :func:`random_resized_crop` draws, but every random number is drawn
    on the images' device and no box is read back: each sample's box (mirrored when flipped) becomes
    an affine sampling grid for ``F.grid_sample`` (bilinear, without the antialiasing the per-sample
    CPU path applies when it shrinks a crop).
    """
    n, _, h, w = images.shape
    device = images.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.empty(n, device=device).uniform_(low, high, generator=generator)

    area = h * w * uniform(*scale)
    aspect = torch.exp(uniform(math.log(ratio[0]), math.log(ratio[1])))
    cw = torch.sqrt(area * aspect).round().clamp(1, w)
    ch = torch.sqrt(area / aspect).round().clamp(1, h)
    top = (uniform(0.0, 1.0) * (h - ch + 1)).floor()
    left = (uniform(0.0, 1.0) * (w - cw + 1)).floor()
    # the box in grid_sample's coordinates (-1..1 spans the image's outer pixel edges)
    sx, sy = cw / w, ch / h
    cx, cy = (2 * left + cw) / w - 1, (2 * top + ch) / h - 1
    if hflip:
        sx = torch.where(uniform(0.0, 1.0) < 0.5, -sx, sx)
    theta = torch.zeros(n, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, cx, sy, cy
    grid = F.affine_grid(theta, [n, images.shape[1], size, size], align_corners=False)
    return F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)


def center_crop(images: torch.Tensor, size: int, resize_ratio: float) -> torch.Tensor:
    """Resize so that a ``size`` crop covers ``resize_ratio`` of the side, then crop the centre."""
    resized = round(size / resize_ratio)
    x = F.interpolate(images, size=(resized, resized), mode="bilinear", align_corners=False, antialias=True)
    start = (resized - size) // 2
    return x[:, :, start : start + size, start : start + size]


def crop_batch(
    images: torch.Tensor,
    generator: torch.Generator,
    train: bool,
    size: int,
    min_scale: float,
    resize_ratio: float,
    hflip: bool,
) -> torch.Tensor:
    """uint8 NCHW in, uint8 NCHW (size x size) out: random-resized crop + flip, or centre crop."""
    if not train:
        return center_crop(images, size, resize_ratio)
    x = random_resized_crop(images, size, (min_scale, 1.0), generator)
    if hflip:
        flip = torch.rand(x.shape[0], generator=generator) < 0.5
        x = torch.where(flip[:, None, None, None].to(x.device), x.flip(3), x)
    return x


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 (or 0-255 float) -> float, (x / 255 - mean) / std, in two in-place passes (channels-last kept).

    ``mean`` and ``std`` should be on the images' device already (a copy per batch would wait).
    """
    scale = 1.0 / (255.0 * std)
    shift = -mean / std
    return images.to(torch.float32, memory_format=torch.channels_last).mul_(scale).add_(shift)


def crop_on_device(
    images: torch.Tensor,
    generator: torch.Generator | None,
    train: bool,
    size: int,
    min_scale: float,
    resize_ratio: float,
    hflip: bool,
) -> torch.Tensor:
    """What :func:`crop_batch` does, for a batch on the training device: float NCHW out, 0-255."""
    if not train:
        return center_crop(images, size, resize_ratio).float()
    return random_resized_crop_on_device(images, size, (min_scale, 1.0), generator, hflip=hflip)


class CachedBatches(Dataset):
    """Item ``(epoch, i)`` is batch ``i`` of that epoch: uint8 rows from the memory map, cropped
    here (in a worker) when ``crop`` is given, else left for the device."""

    def __init__(
        self,
        images_path: Path,
        labels_path: Path,
        batch_size: int,
        train: bool,
        seed: int,
        rank: int,
        world_size: int,
        crop: dict | None = None,
        mean: Sequence[float] = (0.0,),
        std: Sequence[float] = (1.0,),
    ):
        self.images_path, self.labels = images_path, np.load(labels_path)
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.batch_size, self.train, self.seed = batch_size, train, seed
        self.rank, self.world_size = rank, world_size
        self.crop = crop
        self._images = None

    @property
    def images(self) -> np.ndarray:
        if self._images is None:  # opened lazily, once per worker process
            self._images = np.load(self.images_path, mmap_mode="r")
        return self._images

    def order(self, epoch: int) -> np.ndarray:
        n = len(self.labels)
        if self.train:
            order = np.random.default_rng(self.seed + epoch).permutation(n)
            order = order[: n - n % self.world_size]
        else:
            order = np.arange(n)
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        n = len(self.order(0))
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        idx = np.sort(self.order(epoch)[index * self.batch_size : (index + 1) * self.batch_size])  # sequential reads
        x = torch.from_numpy(np.ascontiguousarray(self.images[idx])).permute(0, 3, 1, 2)  # channels-last view
        y = torch.from_numpy(self.labels[idx])
        if self.crop is not None:  # CPU training: the workers do all of it, the main process only trains
            generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 100_003 + index)
            x = normalize(crop_batch(x, generator, self.train, **self.crop), self.mean, self.std)
        return x, y


class _EpochBatches(torch.utils.data.Sampler):
    """Yields ``(epoch, batch index)``; the epoch advances each pass, so workers can persist."""

    def __init__(self, batches: CachedBatches):
        self.batches = batches
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter([(epoch, i) for i in range(len(self.batches))])


class TensorCacheLoader:
    """Composer-facing loader: a DataLoader whose items are whole batches, normalised on the device."""

    fixed_batches = True  # batch i holds min(batch_size, num_samples - i * batch_size) samples (the engine)

    def __init__(
        self,
        batches: CachedBatches,
        num_workers: int,
        device: torch.device,
        crop: dict,
        mean: Sequence[float],
        std: Sequence[float],
    ):
        self.batches = batches
        self.device = device
        self.crop = crop
        self.mean = torch.tensor(mean).view(1, -1, 1, 1).to(device)  # once: on the device for every batch
        self.std = torch.tensor(std).view(1, -1, 1, 1).to(device)
        self.sampler = _EpochBatches(batches)
        self.loader = DataLoader(
            batches,
            batch_size=None,
            sampler=self.sampler,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=device.type == "cuda",
        )

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def batch_size(self) -> int:  # Composer reads it for evaluation microbatches
        return self.batches.batch_size

    @property
    def num_samples(self) -> int:
        return len(self) * self.batches.batch_size if self.batches.train else len(self.batches.order(0))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from dlrecipes.data.device_loader import device_generator

        generator = device_generator(self.device, self.batches.seed * 7919 + self.sampler.epoch)
        for x, y in self.loader:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if self.batches.crop is None:  # GPU: crops and normalisation on the device
                x = normalize(crop_on_device(x, generator, self.batches.train, **self.crop), self.mean, self.std)
            yield x, y


def default_cache_dir(dataset) -> Path:
    """``.dlrecipes-cache`` beside an image folder's split folders, or in the folder of a dataset's own files."""
    home = dataset.cache_home() if hasattr(dataset, "cache_home") else Path(dataset.root).resolve().parent
    if home is None:
        raise DataError(
            "trainer.cache_dir: this dataset is held in memory, with no folder to cache beside; "
            "set trainer.cache_dir to a folder for the tensor cache"
        )
    return home / ".dlrecipes-cache"


def cache_location(dataset, cache_dir: Path | None, cache_size: int | None, resize_size: int) -> tuple[Path, int]:
    """Where a split's cache is (``trainer.cache_dir``, default :func:`default_cache_dir`) and the side of its
    images (``trainer.cache_size``, default the dataset's ``resize_size``): what training and
    ``dlrecipes data convert --format tensor_cache`` both ask, so that one finds what the other wrote."""
    return (Path(cache_dir) if cache_dir else default_cache_dir(dataset)), cache_size or resize_size


def cache_split(train: bool) -> str:
    """The split's name in the cache's file names."""
    return "train" if train else "val"


def build_tensor_cache_loader(
    dataset,
    batch_size: int,
    train: bool,
    device: torch.device,
    num_workers: int,
    seed: int,
    rank: int,
    world_size: int,
    cache_dir: Path | None,
    cache_size: int | None,
    crop_size: int,
    eval_crop_size: int,
    resize_size: int,
    min_scale: float,
    hflip: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> TensorCacheLoader:
    """Cache ``dataset`` (an ImageFolder, or see :func:`image_source`) next to its data (or in ``cache_dir``)
    and load from the cache.

    Training takes ``crop_size`` random-resized crops; evaluation an ``eval_crop_size`` centre crop
    covering ``eval_crop_size / resize_size`` of the side, as the torchvision path does.
    """
    cache_dir, cache_size = cache_location(dataset, cache_dir, cache_size, resize_size)
    split = cache_split(train)
    images_path = build_cache(dataset, cache_dir, split, cache_size, workers=max(1, num_workers))
    size = crop_size if train else eval_crop_size
    crop = {"size": size, "min_scale": min_scale, "resize_ratio": eval_crop_size / resize_size, "hflip": hflip}
    batches = CachedBatches(
        images_path,
        cache_files(cache_dir, split, cache_size)["labels"],
        batch_size,
        train,
        seed,
        rank,
        world_size,
        crop=None if device.type == "cuda" else crop,
        mean=mean,
        std=std,
    )
    return TensorCacheLoader(batches, num_workers, device, crop, mean, std)
