"""What the built-in algorithms of :mod:`.registered` use besides their factories: the checks made when a recipe
is validated (prerequisites, ``requires=``: each returns a problem or None; parameter validators, ``validator=``:
each raises a RecipeError), and the batch augmentations' policies (from a timm string or the recipe's keys) and
color-jitter ranges.

Like :mod:`.registered`, this imports neither torch, numpy nor Composer until a function needs them.
"""

from __future__ import annotations

import inspect

from dlrecipes.algorithms.augment_keys import default_fill
from dlrecipes.core.distributed import world_size
from dlrecipes.core.durations import parse_duration
from dlrecipes.core.precision import precision_of
from dlrecipes.errors import RecipeError
from dlrecipes.registry import algorithms, datasets

__all__ = [
    "needs_pil_dataset",
    "needs_pixels",
    "needs_bottleneck_resnet",
    "ghost_batch_fits",
    "check_qat_times",
    "qat_fits_the_run",
    "batch_randaugment_policy",
    "batch_augmix_policy",
    "jitter_ranges",
]


def needs_pil_dataset(on_batches: str):
    """The check of an algorithm that augments PIL images, naming ``on_batches``: the one that does it on tensors."""

    def check(config) -> str | None:
        if datasets.get(config.dataset.name).metadata.get("pil_images") and config.trainer.loader != "device":
            return None
        pil = ", ".join(e.name for e in datasets if e.metadata.get("pil_images"))
        given = (
            "the device loader yields batches of tensors"
            if config.trainer.loader == "device"
            else f"dataset '{config.dataset.name}' yields tensors"
        )
        return (
            f"augments PIL images before ToTensor, and {given}; use algorithms.{on_batches}, which does it "
            f"on whole batches of tensors on the device (or a PIL dataset: {pil})"
        )

    return check


def needs_pixels(config) -> str | None:
    if datasets.get(config.dataset.name).metadata.get("pixels", True):
        return None
    return (
        f"works on pixel values (it undoes the loader's normalisation), and dataset '{config.dataset.name}' "
        "yields random tensors; use an image dataset (digits, cifar10, image_folder, ...)"
    )


def needs_bottleneck_resnet(config) -> str | None:
    from dlrecipes.models.registered import BOTTLENECK_RESNETS

    if config.model.name == "torchvision" and config.model.params.get("arch") in BOTTLENECK_RESNETS:
        return None
    return (
        "drops torchvision ResNet Bottleneck blocks; use model {name: torchvision, arch: resnet50} "
        f"(or {', '.join(BOTTLENECK_RESNETS[1:])})"
    )


def ghost_batch_fits(config) -> str | None:
    ghost = config.algorithms["ghost_batchnorm"].get("ghost_batch_size", 32)
    micro = config.trainer.device_train_microbatch_size
    batch = micro if isinstance(micro, int) else config.trainer.batch_size
    if ghost <= batch:
        return None
    return f"ghost_batch_size={ghost} is larger than the batch each device sees ({batch}); lower it"


# --- quantization-aware training -------------------------------------------------------------

_QAT_TIMES = ("start", "freeze_bn", "freeze_observers")


def _qat_times(params: dict) -> dict[str, str]:
    """The recipe's QAT times, defaults (the registered factory's) filled in, unset freezes left out."""
    qat = algorithms.get("qat").factory
    defaults = {k: p.default for k, p in inspect.signature(qat).parameters.items() if k in _QAT_TIMES}
    times = {k: params.get(k, defaults[k]) for k in _QAT_TIMES}
    return {k: v for k, v in times.items() if v is not None}


def check_qat_times(params: dict, path: str) -> None:
    """The freezes come after ``start`` (checked where the units agree; Composer checks nothing)."""
    times = _qat_times(params)
    start = parse_duration(times["start"])
    for key in ("freeze_bn", "freeze_observers"):
        if key in times and parse_duration(times[key])[1] == start[1] and parse_duration(times[key])[0] < start[0]:
            raise RecipeError(
                f"{path}.{key}: {times[key]!r} comes before start {times['start']!r}; "
                "it freezes what QAT inserts, so give a time at or after start"
            )


def qat_fits_the_run(config) -> str | None:
    """QAT runs in fp32, in one process, uncompiled, and its times fall inside training."""
    t = config.trainer
    if precision_of(t.precision).mixed:
        return f"fake quantization needs fp32 activations; trainer.precision is {t.precision} (use fp32)"
    if t.compile is not False:
        return (
            "swaps the network's modules mid-training, which a torch.compile'd model does not follow; "
            "set trainer.compile=false"
        )
    if getattr(config, "task", None) is not None:
        return "quantizes single-output classifiers; remove the task section (several inputs/outputs)"
    if t.fsdp is not None or world_size() > 1:
        return "runs in a single process (DDP/FSDP would not keep the inserted observers in sync); train on one device"
    end = parse_duration(t.max_duration)
    for key, value in _qat_times(config.algorithms["qat"]).items():
        number, unit = parse_duration(value)
        if (unit == "dur" and number >= 1) or (unit == end[1] and number >= end[0]):
            # a problem of one key: name it (requires' messages name only the algorithm)
            raise RecipeError(
                f"algorithms.qat.{key}: {value!r} is not before the end of training "
                f"(trainer.max_duration={t.max_duration}); QAT would never {'start' if key == 'start' else 'freeze'}"
            )
    return None


# --- the batch augmentations' policies ---------------------------------------------------------


def batch_randaugment_policy(
    policy: str | None,
    num_ops: int,
    magnitude: float,
    num_magnitude_bins: int,
    magnitude_std: float,
    p: float,
    ops: str,
    fill: list[float] | None,
):
    """batch_randaugment's policy: a timm string's (``rand-m9-mstd0.5-inc1``) when given, else the keys'."""
    import dlrecipes.algorithms.augment_policy as augment_policy
    from dlrecipes.algorithms.augment_keys import parse_timm

    if policy is not None:
        keys = parse_timm(policy)
        num_ops, magnitude, num_magnitude_bins = keys["num_ops"], keys["magnitude"], keys["num_magnitude_bins"]
        magnitude_std, p, ops = keys["magnitude_std"], keys["p"], keys["ops"]
    return augment_policy.randaugment_policy(
        num_ops, magnitude, num_magnitude_bins, magnitude_std, p, ops, default_fill(fill, ops)
    )


def batch_augmix_policy(
    policy: str | None,
    severity: int,
    width: int,
    depth: int,
    alpha: float,
    all_ops: bool,
    fill: list[float] | None,
):
    """batch_augmix's policy: a timm string's (``augmix-m5-w4-d2``, timm's ops) when given, else the keys'."""
    import dlrecipes.algorithms.augment_policy as augment_policy

    ops = "torchvision"
    if policy is not None:
        from dlrecipes.algorithms.augment_keys import parse_timm

        keys = parse_timm(policy)
        severity, width, depth, alpha, ops = keys["severity"], keys["width"], keys["depth"], keys["alpha"], keys["ops"]
    return augment_policy.augmix_policy(severity, width, depth, alpha, all_ops, ops, default_fill(fill, ops))


def jitter_ranges(brightness: float, contrast: float, saturation: float, hue: float) -> dict:
    """batch_color_jitter's ranges: a factor around 1 for the first three, a shift around 0 for hue (None: off)."""

    def around_one(x: float):
        return (max(0.0, 1.0 - x), 1.0 + x) if x > 0 else None

    return {
        "brightness": around_one(brightness),
        "contrast": around_one(contrast),
        "saturation": around_one(saturation),
        "hue": (-hue, hue) if hue > 0 else None,
    }
