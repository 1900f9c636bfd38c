"""Factories of the strong augmentations of whole batches on the training device (:mod:`.batch_augment`), which
:mod:`.registered` adds by name (``algorithms.add``, beside the rest): light, as validation imports them; their
policies are made in :mod:`.support` and :mod:`.augment_policy`, their keys checked in :mod:`.augment_keys`."""

from __future__ import annotations

from typing import Annotated, Literal

from dlrecipes.algorithms.augment_keys import default_fill
from dlrecipes.algorithms.support import batch_augmix_policy, batch_randaugment_policy, jitter_ranges
from dlrecipes.core.ranges import AtLeastOne, NonNegative, Positive, Range


def batch_randaugment(
    policy: str | None = None,
    num_ops: AtLeastOne = 2,
    magnitude: NonNegative = 9,
    num_magnitude_bins: AtLeastOne = 31,
    magnitude_std: NonNegative = 0.0,
    p: Annotated[float, Range(0, 1)] = 1.0,
    ops: Literal["torchvision", "timm"] = "torchvision",
    fill: list[float] | None = None,
):
    """RandAugment on whole batches on the device (any loader); or a timm string such as rand-m9-mstd0.5-inc1.

    Args:
        policy: a timm string ('rand-m9-mstd0.5-inc1') in place of the keys below but fill; null: the keys.
        num_ops: how many ops, each drawn at random, are applied one after another to each image.
        magnitude: the ops' strength, 0 to num_magnitude_bins - 1 (9 of 31 bins: 30% of each op's largest).
        num_magnitude_bins: how many steps the magnitude scale has (31: magnitude 30 is each op's largest).
        magnitude_std: the spread of Gaussian noise on magnitude, per image and op; 0: none; .inf: uniform up to it.
        p: the probability that each of the num_ops ops is applied to an image (1: always).
        ops: 'torchvision' (its RandAugment's ops and magnitudes) or 'timm' (timm's, with Invert and SolarizeAdd).
        fill: the 0-255 value (one, or per channel) of pixels geometric ops uncover; null: 0 (timm ops: ImageNet mean).
    """
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    return BatchAugmentation(
        "batch_randaugment",
        batch_randaugment_policy(policy, num_ops, magnitude, num_magnitude_bins, magnitude_std, p, ops, fill),
    )


def batch_trivialaugment(num_magnitude_bins: Annotated[int, Range(2)] = 31, fill: list[float] | None = None):
    """TrivialAugmentWide on whole batches on the device: one op per image at a random magnitude.

    Args:
        num_magnitude_bins: how many steps of strength there are; each image draws one op and one step.
        fill: the 0-255 value (one, or per channel) of pixels geometric ops uncover; null: 0 (black).
    """
    import dlrecipes.algorithms.augment_policy as augment_policy
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    return BatchAugmentation(
        "batch_trivialaugment",
        augment_policy.trivialaugment_policy(num_magnitude_bins, default_fill(fill, "torchvision")),
    )


def batch_augmix(
    policy: str | None = None,
    severity: Annotated[int, Range(1, 10)] = 3,
    width: AtLeastOne = 3,
    depth: int = -1,
    alpha: Positive = 1.0,
    all_ops: bool = True,
    fill: list[float] | None = None,
):
    """AugMix on whole batches on the device (Hendrycks et al. 2020); or a timm string such as augmix-m5-w4-d2.

    Args:
        policy: a timm string ('augmix-m5-w4-d2') in place of the keys below but fill; null: the keys.
        severity: the ops' strength, 1 to 10: each op draws one of the `severity` weakest of 10 steps.
        width: how many chains of ops are run on each image and mixed.
        depth: how many ops each chain applies; -1 draws 1 to 3 per chain and image.
        alpha: concentration of the chains' Dirichlet weights and of the Beta weight of the mix: 1 is uniform.
        all_ops: also use brightness, color, contrast and sharpness (false: not these, which ImageNet-C tests).
        fill: the 0-255 value (one, or per channel) of pixels geometric ops uncover; null: 0 (policy: ImageNet mean).
    """
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    return BatchAugmentation("batch_augmix", batch_augmix_policy(policy, severity, width, depth, alpha, all_ops, fill))


def batch_color_jitter(
    brightness: NonNegative = 0.4,
    contrast: NonNegative = 0.4,
    saturation: NonNegative = 0.4,
    hue: Annotated[float, Range(0, 0.5)] = 0.0,
    p: Annotated[float, Range(0, 1)] = 1.0,
):
    """Color jitter on whole batches on the device: per image, brightness, contrast, saturation, hue in random order.

    Args:
        brightness: scale brightness by a factor drawn from [1 - brightness, 1 + brightness] (at least 0); 0: off.
        contrast: scale contrast by a factor drawn from [1 - contrast, 1 + contrast] (at least 0); 0: off.
        saturation: scale saturation by a factor drawn from [1 - saturation, 1 + saturation] (at least 0); 0: off.
        hue: turn the hue by an amount drawn from [-hue, hue], a fraction of the colour circle; 0: off.
        p: the probability that an image is jittered at all.
    """
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    ranges = jitter_ranges(brightness, contrast, saturation, hue)
    return BatchAugmentation("batch_color_jitter", jitter={"ranges": ranges, "p": p})


def batch_random_erasing(
    p: Annotated[float, Range(0, 1)] = 0.25,
    scale: list[float] = [0.02, 0.33],  # noqa: B006
    ratio: list[float] = [0.3, 3.3],  # noqa: B006
    value: float | Literal["random"] = 0.0,
):
    """Random erasing on whole normalised batches on the device (Zhong et al. 2017): a box per image, 0 or noise.

    Args:
        p: the probability that an image gets a box erased.
        scale: [low, high]: the box's area, a fraction of the image's, is drawn uniformly from it.
        ratio: [low, high]: the box's height / width is drawn from it (log-uniformly).
        value: the box's fill in normalised units: a number (0: the mean colour) or 'random' (Gaussian noise per pixel).
    """
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    return BatchAugmentation(
        "batch_random_erasing", erasing={"p": p, "scale": tuple(scale), "ratio": tuple(ratio), "value": value}
    )
