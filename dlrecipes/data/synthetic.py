"""Random tensors with random labels: for smoke tests and benchmarks, never for accuracy."""

from __future__ import annotations

from dlrecipes.data.splits import DatasetSplits


def build_synthetic(
    num_classes: int, input_shape: tuple[int, int, int], train_samples: int, eval_samples: int, seed: int
) -> DatasetSplits:
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> TensorDataset:
        x = torch.randn((n, *input_shape), generator=g)
        y = torch.randint(0, num_classes, (n,), generator=g)
        return TensorDataset(x, y)

    return DatasetSplits(split(train_samples), split(eval_samples), num_classes, tuple(input_shape))
