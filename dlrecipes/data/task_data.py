"""Datasets whose samples are ``(*inputs, *targets)``: two views of the embedded digits, and synthetic data.

Each builder returns :class:`DatasetSplits` with ``io`` saying what a sample holds; the
registry entries declare the same thing from their parameters with the ``*_io`` functions
here (``io=``), without loading data, so this module imports torch only inside the builders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrecipes.data.splits import DataIO, DatasetSplits, OutputSpec

if TYPE_CHECKING:
    from torch import Tensor


def digits_two_view_io(image_size: int) -> DataIO:
    """Left and right halves of a digit -> its class and its parity."""
    half = image_size // 2
    return DataIO(
        inputs={"left": (1, image_size, half), "right": (1, image_size, image_size - half)},
        outputs={"digit": OutputSpec("class", 10), "parity": OutputSpec("class", 2)},
    )


def two_views(image: Tensor, digit: int) -> tuple[Tensor, Tensor, int, int]:
    """A sample of the two-view digits: the left and right halves of the (transformed) image, its
    class and its parity."""
    half = image.shape[-1] // 2
    return image[..., :half], image[..., half:], digit, digit % 2


def build_digits_two_view(image_size: int, augment: bool, eval_fraction: float, split_seed: int) -> DatasetSplits:
    """The embedded digits (dlrecipes.data.digits), each cut into a left and a right view."""
    from dlrecipes.data.digits import build_digits
    from dlrecipes.data.tensor_dataset import TransformedTensorDataset

    # the same images, split, normalisation and augmentation as the `digits` dataset
    single = build_digits(image_size, augment, eval_fraction, split_seed)

    def two_view(split) -> TransformedTensorDataset:
        return TransformedTensorDataset(split.images, split.labels, split.transform, sample=two_views)

    io = digits_two_view_io(image_size)
    return DatasetSplits(
        train=two_view(single.train),
        eval=two_view(single.eval),
        num_classes=0,
        input_shape=io.inputs["left"],
        io=io,
    )


def synthetic_multi_io_io(
    inputs: list[str], input_shape: tuple[int, ...], classes: dict[str, int], regression: list[str]
) -> DataIO:
    from dlrecipes.errors import RecipeError

    if not inputs:
        raise RecipeError("dataset.inputs: name at least one input")
    if not classes and not regression:
        raise RecipeError("dataset.classes: name at least one output (under classes or regression)")
    names = [*inputs, *classes, *regression]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise RecipeError(f"dataset: {', '.join(twice)} named more than once among inputs, classes and regression")
    for name, k in classes.items():
        if k < 2:
            raise RecipeError(f"dataset.classes.{name}: needs at least 2 classes, got {k}")
    return DataIO(
        inputs={name: tuple(input_shape) for name in inputs},
        outputs={
            **{name: OutputSpec("class", k) for name, k in classes.items()},
            **{name: OutputSpec("regression", 1) for name in regression},
        },
    )


def build_synthetic_multi_io(
    inputs: list[str],
    input_shape: tuple[int, ...],
    classes: dict[str, int],
    regression: list[str],
    train_samples: int,
    eval_samples: int,
    noise: float,
    seed: int,
) -> DatasetSplits:
    """Labels and values drawn at random; each adds a fixed random pattern to every input, plus noise.

    A class label ``k`` of output ``o`` adds pattern ``P[o][k]`` (one per input), a value
    ``v`` in [-1, 1] adds ``v * Q[o]``: every target can be read from the inputs, better from
    all of them together, so a model that learns shows it in every output's metric.
    """
    import torch
    from torch.utils.data import TensorDataset

    io = synthetic_multi_io_io(inputs, input_shape, classes, regression)
    g = torch.Generator().manual_seed(seed)
    shape = (len(inputs), *input_shape)
    class_patterns = {o: torch.randn((k, *shape), generator=g) for o, k in classes.items()}
    value_patterns = {o: torch.randn(shape, generator=g) for o in regression}

    def split(n: int):
        x = noise * torch.randn((n, *shape), generator=g)
        labels = {o: torch.randint(0, k, (n,), generator=g) for o, k in classes.items()}
        values = {o: torch.rand((n,), generator=g) * 2 - 1 for o in regression}
        for o, y in labels.items():
            x += class_patterns[o][y]
        for o, v in values.items():
            x += v.view(n, *([1] * len(shape))) * value_patterns[o]
        return TensorDataset(*x.unbind(1), *labels.values(), *values.values())

    return DatasetSplits(split(train_samples), split(eval_samples), 0, tuple(input_shape), io=io)
