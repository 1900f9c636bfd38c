"""The recipe keys of the batch augmentations, checked at validation without numpy or torch: timm's
policy strings, the conflicts between policies, the fills (the algorithms are in :mod:`.batch_augment`,
their policies in :mod:`.augment_policy`)."""

from __future__ import annotations

import re

from dlrecipes.errors import RecipeError

IMAGENET_FILL = (124, 116, 104)  # timm's fill: the ImageNet mean in 0-255

BATCH_POLICIES = ("batch_randaugment", "batch_trivialaugment", "batch_augmix")
ON_DEVICE = "augments batch[0] as the images, on the device"


def one_policy(name: str) -> dict[str, str]:
    others = {other: "each is a whole augmentation policy; keep one" for other in BATCH_POLICIES if other != name}
    return {
        **others,
        "randaugment": "both augment each image with a policy (randaugment on PIL images)",
        "augmix": "both augment each image with a policy (augmix on PIL images)",
    }


def policy_or_keys(kind: str):
    """A validator: a timm policy string of this kind, or the explicit keys, not both."""

    def check(params: dict, path: str) -> None:
        policy = params.get("policy")
        if policy is None:
            return
        parsed = parse_timm(policy, f"{path}.policy")
        if parsed["kind"] != kind:
            raise RecipeError(f"{path}.policy: {policy!r} is a timm {parsed['kind']} string; this is {kind}")
        both = sorted(k for k in params if k not in ("policy", "fill"))
        if both:
            raise RecipeError(f"{path}: give the timm policy string or the keys ({', '.join(both)}), not both")

    return check


def default_fill(fill: list[float] | None, ops: str) -> tuple[float, ...]:
    return tuple(fill) if fill is not None else (IMAGENET_FILL if ops == "timm" else (0.0,))


def check_erasing(params: dict, path: str) -> None:
    for key in ("scale", "ratio"):
        pair = params.get(key)
        if pair is not None and (len(pair) != 2 or not 0 < pair[0] <= pair[1]):
            raise RecipeError(f"{path}.{key}: expected [low, high] with 0 < low <= high, got {pair}")


# --- timm's policy strings ----------------------------------------------------------------------

_TIMM_KEYS = {"rand": {"m", "n", "mstd", "mmax", "inc", "p"}, "augmix": {"m", "w", "d", "a", "mstd", "b"}}


def parse_timm(policy: str, key_path: str = "policy") -> dict:
    """A timm policy string as this package's keys: ``rand-m9-n2-mstd0.5-inc1`` (RandAugment) or
    ``augmix-m5-w4-d2-a1`` (AugMix); unknown or unsupported parts are refused."""
    parts = str(policy).split("-")
    kind = parts[0]
    if kind not in _TIMM_KEYS:
        raise RecipeError(
            f"{key_path}: {policy!r} is not a timm RandAugment ('rand-...') or AugMix ('augmix-...') string"
        )
    values = {}
    for part in parts[1:]:
        match = re.fullmatch(r"([a-z]+)(-?[0-9.]+|inf)", part)
        if not match or match.group(1) not in _TIMM_KEYS[kind]:
            raise RecipeError(
                f"{key_path}: {policy!r}: unknown part {part!r} (timm's {kind} keys: "
                f"{', '.join(sorted(_TIMM_KEYS[kind]))})"
            )
        values[match.group(1)] = float(match.group(2))
    if kind == "rand":
        return _timm_rand(values, policy, key_path)
    if values.get("b"):
        raise RecipeError(f"{key_path}: {policy!r}: the blended AugMix (b1) is not supported; leave b out")
    if values.get("mstd", float("inf")) != float("inf"):
        raise RecipeError(f"{key_path}: {policy!r}: AugMix draws magnitudes uniformly (mstd inf); leave mstd out")
    return {
        "kind": "augmix",
        "severity": values.get("m", 3),
        "width": int(values.get("w", 3)),
        "depth": int(values.get("d", -1)),
        "alpha": values.get("a", 1.0),
        "ops": "timm",
    }


def _timm_rand(values: dict, policy: str, key_path: str) -> dict:
    if values.get("inc", 0) != 1:
        raise RecipeError(
            f"{key_path}: {policy!r}: only timm's increasing ops are implemented (add -inc1, as "
            "DeiT's rand-m9-mstd0.5-inc1); or give the explicit keys"
        )
    if values.get("mmax", 10) != 10:
        raise RecipeError(f"{key_path}: {policy!r}: mmax other than 10 is not supported")
    return {
        "kind": "randaugment",
        "num_ops": int(values.get("n", 2)),
        "magnitude": values.get("m", 10),
        "num_magnitude_bins": 11,
        "magnitude_std": values.get("mstd", 0.0),
        "p": values.get("p", 0.5),
        "ops": "timm",
    }
