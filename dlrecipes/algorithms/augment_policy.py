"""Augmentation policies for whole batches: what each sample gets, drawn on the host.

A policy (RandAugment, TrivialAugmentWide, AugMix, color jitter) becomes, for each batch, a
*plan*: layers of one op per sample (or none) with its value, drawn with numpy from one
generator seeded by the run's seed, the rank and the batch's index (:func:`batch_rng`), so the
same batch of the same run always gets the same augmentation, resumed or not, on any device.
Drawing on the host costs microseconds for a batch and means the device never waits for a
random number: :mod:`.batch_augment` ships the plan to the device in one copy and applies each
op once to the samples that drew it (:mod:`.batch_ops`).

Magnitudes follow torchvision's policies (``transforms.v2.RandAugment``, ``TrivialAugmentWide``,
``AugMix``) for the explicit keys, and timm's for timm's policy strings (``rand-m9-mstd0.5-inc1``,
``augmix-m5-w4-d2``; parsed by :mod:`.augment_keys`): timm's op set (with Invert and SolarizeAdd), its
"increasing" magnitudes, each op applied with probability 0.5 in RandAugment, its magnitude noise.
Differences from timm, by design: nearest interpolation for the geometric ops (timm picks
bilinear or bicubic at random) and the fill given to the algorithm (timm fills with the ImageNet
mean, which is the default fill of timm's policies here too).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from dlrecipes.algorithms.augment_keys import IMAGENET_FILL  # noqa: F401 (timm's fill: part of this module's vocabulary)

# Each op's value at a level in [0, 1]: (kind, scale, signed). Kinds: "linear" value = scale * level;
# "size" = scale * level * the image side (truncated for torchvision's policies); "factor" = 1 + scale * level;
# "bits" = start - span * level (a pair); "threshold" = 255 * (1 - level) (torchvision) or 256 - int(256 * level)
# (timm); "none": no value.
_TV_RA = {
    "Identity": ("none", 0, False),
    "ShearX": ("linear", 0.3, True),
    "ShearY": ("linear", 0.3, True),
    "TranslateX": ("size", 150.0 / 331.0, True),
    "TranslateY": ("size", 150.0 / 331.0, True),
    "Rotate": ("linear", 30.0, True),
    "Brightness": ("factor", 0.9, True),
    "Color": ("factor", 0.9, True),
    "Contrast": ("factor", 0.9, True),
    "Sharpness": ("factor", 0.9, True),
    "Posterize": ("bits", (8, 4), False),
    "Solarize": ("threshold", 255, False),
    "AutoContrast": ("none", 0, False),
    "Equalize": ("none", 0, False),
}
_TV_WIDE = {
    **_TV_RA,
    "ShearX": ("linear", 0.99, True),
    "ShearY": ("linear", 0.99, True),
    "TranslateX": ("pixels", 32.0, True),
    "TranslateY": ("pixels", 32.0, True),
    "Rotate": ("linear", 135.0, True),
    "Brightness": ("factor", 0.99, True),
    "Color": ("factor", 0.99, True),
    "Contrast": ("factor", 0.99, True),
    "Sharpness": ("factor", 0.99, True),
    "Posterize": ("bits", (8, 6), False),
}
_TV_AUGMIX = {
    **{k: v for k, v in _TV_RA.items() if k != "Identity"},
    "TranslateX": ("size", 1.0 / 3.0, True),
    "TranslateY": ("size", 1.0 / 3.0, True),
    "Posterize": ("bits", (4, 4), False),
}
_TV_AUGMIX_PARTIAL = (
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
_TIMM = {
    "AutoContrast": ("none", 0, False),
    "Equalize": ("none", 0, False),
    "Invert": ("none", 0, False),
    "Rotate": ("linear", 30.0, True),
    "Posterize": ("timm_bits", 4, False),
    "Solarize": ("timm_threshold", 256, False),
    "SolarizeAdd": ("timm_add", 110, False),
    "Color": ("factor", 0.9, True),
    "Contrast": ("factor", 0.9, True),
    "Brightness": ("factor", 0.9, True),
    "Sharpness": ("factor", 0.9, True),
    "ShearX": ("linear", 0.3, True),
    "ShearY": ("linear", 0.3, True),
    "TranslateX": ("rel", 0.45, True),
    "TranslateY": ("rel", 0.45, True),
}
_TIMM_AUGMIX = (
    "AutoContrast",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "Equalize",
    "Rotate",
    "Posterize",
    "Solarize",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
)
TABLES = {"randaugment": _TV_RA, "trivialaugment": _TV_WIDE, "augmix": _TV_AUGMIX, "timm": _TIMM}


@dataclass(frozen=True)
class Policy:
    """One policy, as drawn by :func:`draw`: the op names and their value table, how a level is drawn
    (``levels``: "fixed" magnitude/(bins-1) with optional noise ``magnitude_std``; "bins": a random bin
    below ``magnitude``; "uniform": uniform up to magnitude/(bins-1)), ``num_ops`` layers each applied with
    probability ``p``; for AugMix, ``width`` chains of ``depth`` ops (-1: 1 to 3) mixed with ``alpha``."""

    kind: str  # randaugment, trivialaugment, augmix
    ops: tuple[str, ...]
    table: str
    levels: str = "fixed"
    magnitude: float = 9
    num_magnitude_bins: int = 31
    magnitude_std: float = 0.0
    num_ops: int = 2
    p: float = 1.0
    width: int = 3
    depth: int = -1
    alpha: float = 1.0
    fill: tuple[float, ...] = field(default=(0.0,))


def randaugment_policy(
    num_ops: int, magnitude: float, num_magnitude_bins: int, magnitude_std: float, p: float, ops: str, fill
) -> Policy:
    table = "timm" if ops == "timm" else "randaugment"
    return Policy(
        "randaugment",
        tuple(TABLES[table]),
        table,
        "fixed",
        magnitude,
        num_magnitude_bins,
        magnitude_std,
        num_ops,
        p,
        fill=tuple(fill),
    )


def trivialaugment_policy(num_magnitude_bins: int, fill) -> Policy:
    return Policy(
        "trivialaugment",
        tuple(_TV_WIDE),
        "trivialaugment",
        "bins",
        num_magnitude_bins,
        num_magnitude_bins,
        num_ops=1,
        fill=tuple(fill),
    )


def augmix_policy(severity: float, width: int, depth: int, alpha: float, all_ops: bool, ops: str, fill) -> Policy:
    if ops == "timm":
        return Policy(
            "augmix",
            _TIMM_AUGMIX,
            "timm",
            "uniform",
            severity,
            11,
            width=width,
            depth=depth,
            alpha=alpha,
            fill=tuple(fill),
        )
    names = tuple(_TV_AUGMIX) if all_ops else _TV_AUGMIX_PARTIAL
    return Policy(
        "augmix", names, "augmix", "bins", severity, 10, width=width, depth=depth, alpha=alpha, fill=tuple(fill)
    )


# --- drawing a batch's plan ----------------------------------------------------------------------


def batch_rng(seed: int, rank: int, batch: int, salt: str) -> np.random.Generator:
    """The generator of one batch: from the run's seed, the rank, the batch's index in the run and the
    algorithm (``salt``), so a resumed run draws what the uninterrupted one drew."""
    return np.random.default_rng([int(seed) % 2**63, int(rank), int(batch), zlib.crc32(salt.encode())])


def draw_levels(policy: Policy, rng: np.random.Generator, n: int) -> np.ndarray:
    """Each sample's level in [0, 1] (the fraction of each op's largest value)."""
    top = policy.num_magnitude_bins - 1
    if policy.levels == "bins":
        return rng.integers(0, int(policy.magnitude), n) / top
    if policy.levels == "uniform":
        return rng.uniform(0, policy.magnitude, n) / 10.0
    m = np.full(n, float(policy.magnitude))
    if policy.magnitude_std == float("inf"):
        m = rng.uniform(0, policy.magnitude, n)
    elif policy.magnitude_std > 0:
        m = np.clip(rng.normal(policy.magnitude, policy.magnitude_std, n), 0, top)
    return m / top


def _binned(end: float, levels: np.ndarray, bins: int | None, start: float = 0.0) -> np.ndarray:
    """``end * levels``; at a level that is a bin, the value of torchvision's float32 ``linspace(0, end, bins)``
    there (what its policies pass: ``int()`` of 15.999999 is 15, and a shear's last bit moves a nearest pixel)."""
    exact = start + (end - start) * levels
    if not bins or bins < 2:
        return exact
    import torch

    index = np.round(levels * (bins - 1))
    table = torch.linspace(start, end, bins).double().numpy()
    on_bin = np.abs(index - levels * (bins - 1)) < 1e-9
    return np.where(on_bin, table[np.clip(index, 0, bins - 1).astype(np.int64)], exact)


def op_values(
    name: str, table: dict, levels: np.ndarray, signs: np.ndarray, size: tuple[int, int], bins: int | None = None
) -> np.ndarray:
    """The values (float64) of op ``name`` at ``levels``, negated where ``signs`` and the op is signed
    (``bins``: torchvision's policies' bin count, whose float32 magnitudes are used on the bins)."""
    kind, scale, signed = table[name]
    side = size[1] if name == "TranslateX" else size[0]
    if kind == "none":
        return np.zeros_like(levels)
    if kind == "bits":
        return np.round(scale[0] - scale[1] * levels)  # torch.round: half to even, as numpy
    if kind == "threshold":
        return 255.0 * _binned(0.0, levels, bins, start=1.0)
    if kind in ("timm_bits", "timm_threshold"):
        return scale - np.floor(scale * levels)
    if kind == "timm_add":
        return np.floor(scale * levels)
    value = {
        "linear": lambda: _binned(scale, levels, bins),
        "factor": lambda: _binned(scale, levels, bins),
        "size": lambda: np.trunc(_binned(scale * side, levels, bins)),
        "pixels": lambda: np.trunc(_binned(scale, levels, bins)),
        "rel": lambda: scale * side * levels,
    }[kind]()
    value = np.where(signs & signed, -value, value)
    return 1.0 + value if kind == "factor" else value


def draw_layer(policy: Policy, rng: np.random.Generator, n: int, size: tuple[int, int]):
    """One layer: each sample's op index into ``policy.ops`` (-1: none) and value."""
    ids = rng.integers(0, len(policy.ops), n)
    levels = draw_levels(policy, rng, n)
    signs = rng.random(n) <= 0.5
    if policy.p < 1:
        ids = np.where(rng.random(n) < policy.p, ids, -1)
    values = np.zeros(n)
    table = TABLES[policy.table]
    bins = None if policy.table == "timm" else policy.num_magnitude_bins
    for k, name in enumerate(policy.ops):
        chosen = ids == k
        if chosen.any():
            values[chosen] = op_values(name, table, levels[chosen], signs[chosen], size, bins)
    return ids, values


def draw_chains(policy: Policy, rng: np.random.Generator, n: int, size: tuple[int, int]):
    """AugMix: ``width`` chains of layers (a sample's op -1 past its chain's depth), the chains' weights
    (n, width) and each sample's mixing weight (n,)."""
    mix = rng.beta(policy.alpha, policy.alpha, n)
    weights = rng.dirichlet([policy.alpha] * policy.width, n)
    chains = []
    for _ in range(policy.width):
        depth = np.full(n, policy.depth) if policy.depth > 0 else rng.integers(1, 4, n)
        layers = []
        for step in range(int(depth.max())):
            ids, values = draw_layer(policy, rng, n, size)
            layers.append((np.where(depth > step, ids, -1), values))
        chains.append(layers)
    return chains, weights, mix


def draw_jitter(rng: np.random.Generator, n: int, ranges: dict[str, tuple[float, float] | None], p: float):
    """Color jitter as torchvision's ``ColorJitter``: a random order of brightness, contrast, saturation and
    hue per sample, each factor uniform in its range (None: that one left out). Ops: indices into
    :data:`JITTER_OPS`."""
    factors = np.stack([rng.uniform(*r, n) if r else np.zeros(n) for r in ranges.values()], 1)
    order = np.argsort(rng.random((n, 4)), 1)
    applied = rng.random(n) < p
    layers = []
    for step in range(4):
        ids = order[:, step]
        active = np.array([r is not None for r in ranges.values()])[ids] & applied
        layers.append((np.where(active, ids, -1), factors[np.arange(n), ids]))
    return layers


JITTER_OPS = ("Brightness", "Contrast", "Color", "Hue")


def draw_erasing(rng: np.random.Generator, n: int, size: tuple[int, int], p: float, scale, ratio) -> np.ndarray:
    """Random erasing boxes (n, 4: top, left, height, width; height 0: none) as torchvision's
    ``RandomErasing.get_params`` draws them: up to 10 tries of area and aspect per sample."""
    h, w = size
    area = h * w * rng.uniform(scale[0], scale[1], (n, 10))
    aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), (n, 10)))
    bh = np.round(np.sqrt(area * aspect)).astype(np.int64)
    bw = np.round(np.sqrt(area / aspect)).astype(np.int64)
    fits = (bh < h) & (bw < w)
    first = np.argmax(fits, 1)
    rows = np.arange(n)
    bh, bw = bh[rows, first], bw[rows, first]
    ok = fits[rows, first] & (rng.random(n) < p)
    top = (rng.random(n) * (h - bh + 1)).astype(np.int64)
    left = (rng.random(n) * (w - bw + 1)).astype(np.int64)
    return np.where(ok[:, None], np.stack([top, left, bh, bw], 1), 0)
