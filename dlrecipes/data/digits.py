"""The embedded dataset: 1,797 handwritten digits, 8x8 pixels, shipped inside the package.

These are the "Optical Recognition of Handwritten Digits" data from the UCI repository
(Alpaydin & Kaynak, 1998; CC BY 4.0), the same array scikit-learn bundles as
``load_digits``.  They need no download, so a fresh machine can train on real data.
Images are upsampled to ``image_size`` (28 by default, like MNIST) so MNIST models and
recipes apply unchanged.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from dlrecipes.data.splits import DatasetSplits

NUM_CLASSES = 10


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (1797, 8, 8) with values 0..16, labels uint8 (1797,))."""
    with resources.files(__package__).joinpath("digits.npz").open("rb") as f:
        data = np.load(f)
        return data["images"], data["labels"]


def stratified_split(labels: np.ndarray, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, eval) with each class split in the same proportion."""
    rng = np.random.default_rng(seed)
    train, evaluation = [], []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_eval = int(round(len(idx) * eval_fraction))
        evaluation.append(idx[:n_eval])
        train.append(idx[n_eval:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(evaluation))


def build_digits(image_size: int, augment: bool, eval_fraction: float, split_seed: int) -> DatasetSplits:
    import torch
    import torch.nn.functional as F
    from torchvision.transforms import v2

    from dlrecipes.data.device_loader import BatchAugment
    from dlrecipes.data.preprocess import preprocess_spec
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset

    images, labels = load_digits_arrays()
    train_idx, eval_idx = stratified_split(labels, eval_fraction, split_seed)
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    if image_size != 8:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    y = torch.from_numpy(labels.astype(np.int64))
    train_x = x[torch.from_numpy(train_idx)]
    mean = train_x.float().mean().item() / 255
    std = train_x.float().std().item() / 255
    normalize = [v2.ToDtype(torch.float32, scale=True), v2.Normalize([mean], [std])]
    train_tf = v2.Compose(
        ([v2.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1))] if augment else []) + normalize
    )
    eval_tf = v2.Compose(normalize)
    return DatasetSplits(
        # on-device batches: a 2-pixel random shift stands in for the random affine
        train=TransformedTensorDataset(
            train_x,
            y[torch.from_numpy(train_idx)],
            train_tf,
            BatchAugment((mean,), (std,), crop_padding=2 if augment else 0),
        ),
        eval=TransformedTensorDataset(
            x[torch.from_numpy(eval_idx)], y[torch.from_numpy(eval_idx)], eval_tf, BatchAugment((mean,), (std,))
        ),
        num_classes=NUM_CLASSES,
        input_shape=(1, image_size, image_size),
        class_names=[str(d) for d in range(10)],
        preprocess=preprocess_spec("L", (mean,), (std,), size=(image_size, image_size)),
    )
