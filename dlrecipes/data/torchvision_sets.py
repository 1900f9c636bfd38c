"""MNIST and CIFAR-10/100: downloaded with torchvision when online, read from disk otherwise.

Offline (or with ``download: false``) a missing dataset is a :class:`DataError` naming
the files that were expected and where to get them.
"""

from __future__ import annotations

import pickle
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrecipes.data.splits import DatasetSplits
from dlrecipes.errors import DataError


@dataclass(frozen=True)
class CifarSource:
    name: str
    url: str
    md5: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: str
    num_classes: int
    names_file: str = "batches.meta"  # pickled dict holding the class names (optional)
    names_key: str = "label_names"


CIFAR10 = CifarSource(
    "cifar10",
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "c58f30108f718f92721af3b95e74349a",
    "cifar-10-batches-py",
    tuple(f"data_batch_{i}" for i in range(1, 6)),
    ("test_batch",),
    "labels",
    10,
)
CIFAR100 = CifarSource(
    "cifar100",
    "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    "eb9058c3a382ffc7106e4002c42a8d85",
    "cifar-100-python",
    ("train",),
    ("test",),
    "fine_labels",
    100,
    "meta",
    "fine_label_names",
)
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _missing(folder: Path, names: tuple[str, ...]) -> list[str]:
    return [str(folder / n) for n in names if not (folder / n).is_file()]


def _download_error(what: str, missing: list[str], url: str, reason: str) -> DataError:
    listed = "\n  ".join(missing)
    return DataError(
        f"{what} not found ({reason}). Expected these files:\n  {listed}\n"
        f"Get them from {url} (extract into the dataset root), or run once with "
        f"dataset.download=true on a machine that is online."
    )


@contextmanager
def no_empty_folders_on_failure(root: Path):
    """A failed download leaves no empty folders behind (folders that existed before stay)."""
    root = Path(root)
    missing_chain = [p for p in (root, *root.parents) if not p.exists()]  # created by the download, if any
    before = {p for p in root.rglob("*") if p.is_dir()} if root.exists() else set()
    try:
        yield
    except BaseException:
        created = [p for p in root.rglob("*") if p.is_dir() and p not in before] if root.exists() else []
        for folder in sorted(created, key=lambda p: len(p.parts), reverse=True) + missing_chain:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def ensure_cifar(root: Path, source: CifarSource, download: bool) -> Path:
    """The extracted batch folder; downloads and checks the archive if files are missing."""
    folder = root / source.folder
    missing = _missing(folder, source.train_files + source.test_files)
    if not missing:
        return folder
    if not download:
        raise _download_error(source.name, missing, source.url, "download is off")
    from torchvision.datasets.utils import download_and_extract_archive

    try:
        with no_empty_folders_on_failure(root):
            download_and_extract_archive(source.url, download_root=str(root), md5=source.md5)
    except Exception as exc:  # network errors come in many types (URLError, OSError, ...)
        raise _download_error(source.name, missing, source.url, f"download failed: {exc}") from None
    missing = _missing(folder, source.train_files + source.test_files)
    if missing:
        raise _download_error(source.name, missing, source.url, "the archive did not contain them")
    return folder


def read_cifar_batches(folder: Path, files: tuple[str, ...], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR python batches -> (uint8 images N x 3 x 32 x 32, int64 labels)."""
    images, labels = [], []
    for name in files:
        path = folder / name
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="latin1")  # the official format is a pickle
            images.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.append(np.asarray(batch[label_key], dtype=np.int64))
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as exc:
            raise DataError(f"{path}: not a readable CIFAR batch file ({type(exc).__name__}: {exc})") from None
    return np.concatenate(images), np.concatenate(labels)


def read_class_names(folder: Path, source: CifarSource) -> list[str] | None:
    """The class names from the archive's meta file, or None when it is absent or unreadable."""
    try:
        with open(folder / source.names_file, "rb") as f:
            names = pickle.load(f, encoding="latin1")[source.names_key]
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError):
        return None
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return names if len(names) == source.num_classes else None


def cifar_train_augmentation(mean, std, augment: bool, crop: tuple[int, str, str], size: int | None):
    """The CIFAR training split's augmentation: its transform of a sample (the torch loader's) and its
    :class:`~dlrecipes.data.device_loader.BatchAugment` (the device loader's), each ``crop``'s padding, padding mode
    and flips when ``augment``, then a resize to ``size`` (None: 32, none)."""
    from dlrecipes.data.device_loader import BatchAugment
    from dlrecipes.data.transforms import small_image_transforms

    padding, padding_mode, flip = crop
    padding = padding if augment else 0
    transform = small_image_transforms(
        32,
        mean,
        std,
        crop_padding=padding,
        hflip=augment,
        train=True,
        resize=size,
        padding_mode=padding_mode,
        alternate_flip=flip == "alternate",
    )
    batched = BatchAugment(
        tuple(mean),
        tuple(std),
        crop_padding=padding,
        hflip=augment,
        size=size,
        padding_mode=padding_mode,
        alternate_flip=augment and flip == "alternate",
    )
    return transform, batched


def build_cifar(
    root: str,
    source: CifarSource,
    download: bool,
    augment: bool,
    mean,
    std,
    image_size: int = 32,
    crop: tuple[int, str, str] = (4, "zeros", "random"),
) -> DatasetSplits:
    """The CIFAR splits; ``crop``: the training crop's padding and padding mode, and the flips ('random',
    'alternate'), when ``augment``."""
    import torch

    from dlrecipes.data.device_loader import BatchAugment
    from dlrecipes.data.preprocess import preprocess_spec
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset
    from dlrecipes.data.transforms import small_image_transforms

    if image_size < 8:
        from dlrecipes.errors import RecipeError

        raise RecipeError(f"dataset.image_size: must be at least 8, got {image_size}")
    folder = ensure_cifar(Path(root), source, download)
    train_x, train_y = read_cifar_batches(folder, source.train_files, source.label_key)
    test_x, test_y = read_cifar_batches(folder, source.test_files, source.label_key)
    size = None if image_size == 32 else image_size  # resized after augmentation, on the loader's device
    train_tf, train_batched = cifar_train_augmentation(mean, std, augment, crop, size)
    eval_tf = small_image_transforms(32, mean, std, crop_padding=0, hflip=False, train=False, resize=size)
    return DatasetSplits(
        train=TransformedTensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y), train_tf, train_batched),
        eval=TransformedTensorDataset(
            torch.from_numpy(test_x),
            torch.from_numpy(test_y),
            eval_tf,
            BatchAugment(tuple(mean), tuple(std), size=size),
        ),
        num_classes=source.num_classes,
        input_shape=(3, image_size, image_size),
        class_names=read_class_names(folder, source),
        preprocess=preprocess_spec("RGB", mean, std, size=(image_size, image_size)),
    )


def build_mnist(root: str, download: bool, augment: bool) -> DatasetSplits:
    from torchvision.datasets import MNIST

    from dlrecipes.data.device_loader import BatchAugment
    from dlrecipes.data.preprocess import preprocess_spec
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset
    from dlrecipes.data.transforms import MNIST_MEAN, MNIST_STD, small_image_transforms

    folder = Path(root) / "MNIST" / "raw"
    missing = _missing(folder, MNIST_FILES)
    if missing and not download:
        raise _download_error("mnist", missing, MNIST.mirrors[0], "download is off")
    try:
        with no_empty_folders_on_failure(Path(root)):
            train = MNIST(root, train=True, download=download and bool(missing))
            test = MNIST(root, train=False, download=False)
    except Exception as exc:
        missing = _missing(folder, MNIST_FILES)
        if not missing:
            raise DataError(f"{folder}: MNIST files are unreadable ({exc})") from None
        raise _download_error("mnist", missing, MNIST.mirrors[0], f"download failed: {exc}") from None
    train_tf = small_image_transforms(
        28, MNIST_MEAN, MNIST_STD, crop_padding=2 if augment else 0, hflip=False, train=True
    )
    eval_tf = small_image_transforms(28, MNIST_MEAN, MNIST_STD, crop_padding=0, hflip=False, train=False)
    return DatasetSplits(
        train=TransformedTensorDataset(
            train.data.unsqueeze(1),
            train.targets,
            train_tf,
            BatchAugment(MNIST_MEAN, MNIST_STD, crop_padding=2 if augment else 0),
        ),
        eval=TransformedTensorDataset(
            test.data.unsqueeze(1), test.targets, eval_tf, BatchAugment(MNIST_MEAN, MNIST_STD)
        ),
        num_classes=10,
        input_shape=(1, 28, 28),
        class_names=[str(d) for d in range(10)],
        preprocess=preprocess_spec("L", MNIST_MEAN, MNIST_STD, size=(28, 28)),
    )
