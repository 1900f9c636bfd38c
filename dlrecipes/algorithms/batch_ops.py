"""Image operations on whole uint8 batches (N, C, H, W), one parameter per sample.

Each op takes the batch and a float tensor ``v`` of N values on the batch's device (a shear
factor, pixels, degrees, an enhancement factor, bits or a threshold) and returns a uint8 batch.
Each computes what ``torchvision.transforms.v2.functional`` computes for one image with that
value, in the same arithmetic, so a sample's result equals torchvision's within 1/255
(tests/test_batch_augment.py checks every op):

- geometric ops (shear, translate, rotate) build one inverse affine matrix per sample as
  ``_get_inverse_affine_matrix`` does (in float64, then float32 as torchvision's theta) and
  sample the nearest pixel as ``grid_sample`` does (a gather) on torchvision's pixel grid;
  pixels from outside the image take ``fill``;
- color ops blend with per-sample factors broadcast over the batch (brightness, saturation,
  contrast, sharpness, hue), with torchvision's grayscale weights and uint8 truncation;
- equalize and invert have no parameter and are torchvision's own functions, which work on
  batches already (autocontrast too, rewritten without torchvision's boolean-mask assignment, a
  host sync on a GPU).

``solarize_add`` (timm's SolarizeAdd: add ``v`` to pixels below 128) has no torchvision op; it
is checked against timm's definition instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

_GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def constant(values, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """A small constant on ``device``, copied without waiting (``torch.tensor(..., device=cuda)`` copies
    and synchronises, which the sync-debug gate refuses)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _per_sample(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).view(-1, 1, 1, 1)


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Clamp and truncate to uint8, as torchvision's ``_blend`` does."""
    return x.clamp_(0, 255).to(torch.uint8)


# --- geometry ---------------------------------------------------------------------------------


def inverse_affine(
    angle: np.ndarray,
    translate: tuple[np.ndarray, np.ndarray],
    shear: tuple[np.ndarray, np.ndarray],
    center: tuple[float, float],
) -> np.ndarray:
    """Per-sample (N, 2, 3) inverse affine matrices, torchvision's ``_get_inverse_affine_matrix`` (angle
    and shear in radians; center relative to the image centre; scale 1), in float64 on the host: numpy's
    float64 sin/cos/tan round as Python's ``math`` does, so the float32 matrices are torchvision's to the
    bit (torch's own differ in the last bit now and then, which moves a nearest pixel at a tie)."""
    rot, sx, sy = angle, shear[0], shear[1]
    tx, ty = translate
    cx, cy = center
    a = np.cos(rot - sy) / np.cos(sy)
    b = -(a * np.tan(sx) + np.sin(rot))
    c = np.sin(rot - sy) / np.cos(sy)
    d = np.cos(rot) - c * np.tan(sx)
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = 0.0 + (cx - m0 * (cx + tx) - m1 * (cy + ty))
    m5 = 0.0 + (cy - m3 * (cx + tx) - m4 * (cy + ty))
    return np.stack([np.stack([m0, m1, m2], -1), np.stack([m3, m4, m5], -1)], 1).astype(np.float32)


def _shear_angle(v: np.ndarray) -> np.ndarray:
    """atan(v) through degrees and back, as torchvision's RandAugment passes it."""
    return np.deg2rad(np.rad2deg(np.arctan(v)))


def geometry(name: str, v: np.ndarray, height: int, width: int) -> np.ndarray:
    """The (N, 2, 3) float32 inverse matrices of geometric op ``name`` for host values ``v`` (float64):
    ShearX/ShearY (factor, about the top-left corner as RandAugment shears), TranslateX/TranslateY
    (pixels), Rotate (degrees counter-clockwise about the centre)."""
    v = np.asarray(v, dtype=np.float64)
    z = np.zeros_like(v)
    corner = (-width * 0.5, -height * 0.5)
    if name == "ShearX":
        return inverse_affine(z, (z, z), (_shear_angle(v), z), corner)
    if name == "ShearY":
        return inverse_affine(z, (z, z), (z, _shear_angle(v)), corner)
    if name == "TranslateX":
        return inverse_affine(z, (v, z), (z, z), (0.0, 0.0))
    if name == "TranslateY":
        return inverse_affine(z, (z, v), (z, z), (0.0, 0.0))
    if name == "Rotate":
        return inverse_affine(np.radians(-np.remainder(v, 360.0)), (z, z), (z, z), (0.0, 0.0))
    raise ValueError(f"no geometric op {name!r}")


def warp(images: torch.Tensor, theta: torch.Tensor, fill: Sequence[float] | None = None) -> torch.Tensor:
    """``images`` resampled (nearest) through per-sample inverse matrices ``theta`` (N, 2, 3) on
    torchvision's grid (pixel centres, normalised by half the size), outside pixels ``fill``.

    ``grid_sample``'s nearest sampling as a gather: each output pixel's source index is the grid point
    unnormalised as ``grid_sample`` does it (``((g + 1) * size - 1) / 2``, rounded half to even), so the
    uint8 pixels are copied, never converted to float and back.
    """
    n, c, h, w = images.shape
    device = images.device
    base = torch.empty(1, h, w, 3, device=device)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2) / constant([0.5 * w, 0.5 * h], device)
    grid = base.view(1, h * w, 3).expand(n, -1, -1).bmm(scaled)  # (n, h*w, 2), normalised to [-1, 1]
    x = torch.round(((grid[..., 0] + 1) * w - 1) / 2)
    y = torch.round(((grid[..., 1] + 1) * h - 1) / 2)
    inside = (x >= 0) & (x <= w - 1) & (y >= 0) & (y <= h - 1)
    index = (y.clamp(0, h - 1) * w + x.clamp(0, w - 1)).long()
    out = images.reshape(n, c, h * w).gather(2, index.unsqueeze(1).expand(n, c, h * w))
    fills = constant([min(max(round(f), 0), 255) for f in (fill if fill is not None else [0])], device, torch.uint8)
    out = torch.where(inside.unsqueeze(1), out, fills.view(1, -1, 1).expand(n, c, 1))
    return out.view(n, c, h, w)


def _geometric(name: str) -> Callable:
    def op(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
        theta = geometry(name, v.detach().cpu().double().numpy(), *images.shape[-2:])
        return warp(images, torch.from_numpy(theta).to(images.device), fill)

    op.__name__ = name
    op.__doc__ = f"{name} with per-sample values ``v`` (read on the host: the executor passes matrices instead)."
    return op


# --- color ------------------------------------------------------------------------------------


def grayscale(images: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) float luma, floored as torchvision floors it for uint8 images."""
    x = images.float()
    if x.shape[1] == 1:
        return x
    return (x[:, 0] * _GRAY[0] + x[:, 1] * _GRAY[1] + x[:, 2] * _GRAY[2]).unsqueeze(1).floor_()


def blend(images: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``images * factor + other * (1 - factor)``, per-sample factors, truncated to uint8."""
    f = _per_sample(factor)
    return _to_uint8(images.float() * f + other * (1.0 - f))


def brightness(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    return _to_uint8(images.float() * _per_sample(v))


def saturation(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """torchvision's ``adjust_saturation`` (RandAugment's Color); grayscale images unchanged."""
    if images.shape[1] == 1:
        return images
    return blend(images, grayscale(images), v)


def contrast(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    mean = grayscale(images).mean(dim=(1, 2, 3), keepdim=True)
    return blend(images, mean, v)


def sharpness(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """Blend with the 3x3 smoothed image (1s around a 5, over 13) inside a one-pixel border.

    The smoothing is a separable 3x3 box sum plus 4x the centre (a depthwise ``conv2d`` is several
    times slower on a CPU); its float rounding differs from the convolution's, so a rounded value can
    fall one level apart (within the 1/255 the tests allow).
    """
    n, c, h, w = images.shape
    if h <= 2 or w <= 2:
        return images
    x = images.float()
    rows = x[..., :-2] + x[..., 1:-1] + x[..., 2:]
    box = rows[..., :-2, :] + rows[..., 1:-1, :] + rows[..., 2:, :]
    inner_x = x[..., 1:-1, 1:-1]
    blurred = box.add_(inner_x, alpha=4.0).div_(13.0).round_()
    out = x.clone()
    inner = out[..., 1:-1, 1:-1]
    inner.add_((blurred - inner) * (1.0 - _per_sample(v)))
    return _to_uint8(out)


def hue(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """torchvision's ``adjust_hue`` with a hue shift ``v`` in [-0.5, 0.5] per sample."""
    if images.shape[1] == 1:
        return images
    x = images.float() / 255.0
    maxc, minc = x.amax(1), x.amin(1)
    r, g, _ = x.unbind(1)
    eqc = maxc == minc
    rng = maxc - minc
    ones = torch.ones_like(maxc)
    s = rng / torch.where(eqc, ones, maxc)
    rc, gc, bc = ((maxc.unsqueeze(1) - x) / torch.where(eqc, ones, rng).unsqueeze(1)).unbind(1)
    neq_r, eq_g = maxc != r, maxc == g
    h = (bc - gc) * ~neq_r + (rc + 2.0 - bc) * (eq_g & neq_r) + (gc + 4.0 - rc) * (neq_r & ~eq_g)
    h = (h / 6.0 + 1.0).fmod(1.0)
    h = (h + v.float().view(-1, 1, 1)).remainder(1.0)
    h6 = h * 6
    i = torch.floor(h6)
    f = h6 - i
    i = i.to(torch.int64).remainder(6)
    q = ((1.0 - s * f) * maxc).clamp(0.0, 1.0)
    t = ((1.0 - s + s * f) * maxc).clamp(0.0, 1.0)
    p = ((1.0 - s) * maxc).clamp(0.0, 1.0)
    vpqt = torch.stack((maxc, p, q, t), 1)
    select = constant([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], images.device, torch.int64)
    rgb = vpqt.gather(1, select[:, i].movedim(0, 1))
    return rgb.mul_(255.0 + 1.0 - 1e-3).to(torch.uint8)  # torchvision's to_dtype(uint8, scale=True)


def posterize(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """Keep the top ``v`` bits of each channel (0 to 8)."""
    drop = (8 - v.round()).clamp(0, 8).to(torch.uint8).view(-1, 1, 1, 1)
    return (images >> drop) << drop


def solarize(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """Invert every pixel at or above the threshold ``v`` (0-255; above 255 nothing)."""
    return torch.where(images.float() >= _per_sample(v), 255 - images, images)


def solarize_add(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """timm's SolarizeAdd: add ``v`` (clipped at 255) to every pixel below 128."""
    added = (images.float() + _per_sample(v)).clamp_(0, 255).to(torch.uint8)
    return torch.where(images < 128, added, images)


def _no_parameter(name: str) -> Callable:
    def op(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        return getattr(TF, name)(images)

    op.__name__ = name
    return op


def autocontrast(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    """torchvision's ``autocontrast`` (each channel stretched to 0-255), with ``torch.where`` where torchvision
    assigns through a boolean mask (a host sync on a GPU)."""
    x = images.float()
    low, high = x.amin(dim=(-2, -1), keepdim=True), x.amax(dim=(-2, -1), keepdim=True)
    flat = high == low
    inv_scale = torch.where(flat, torch.ones_like(high), (high - low).mul_(1.0 / 255))
    low = torch.where(flat, torch.zeros_like(low), low)
    return x.sub_(low).div_(inv_scale).clamp_(0, 255).to(torch.uint8)


def identity(images: torch.Tensor, v: torch.Tensor, fill=None) -> torch.Tensor:
    return images


OPS: dict[str, Callable] = {
    "Identity": identity,
    **{name: _geometric(name) for name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")},
    "Brightness": brightness,
    "Color": saturation,
    "Contrast": contrast,
    "Sharpness": sharpness,
    "Posterize": posterize,
    "Solarize": solarize,
    "SolarizeAdd": solarize_add,
    "AutoContrast": autocontrast,
    "Equalize": _no_parameter("equalize"),
    "Invert": _no_parameter("invert"),
    "Hue": hue,
}
GEOMETRIC = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})


def erase(images: torch.Tensor, boxes: torch.Tensor, value: torch.Tensor | None = None) -> torch.Tensor:
    """Each sample's box (top, left, height, width; a height of 0: none) set to ``value``
    (a tensor broadcast to the batch, e.g. per-pixel noise) or 0, as torchvision's ``erase``."""
    n, _, h, w = images.shape
    boxes = boxes.to(images.device, non_blocking=True)  # drawn on the host: the step need not wait for it
    rows = torch.arange(h, device=images.device).view(1, h, 1)
    cols = torch.arange(w, device=images.device).view(1, 1, w)
    top, left, bh, bw = (boxes[:, k].view(n, 1, 1) for k in range(4))
    inside = (rows >= top) & (rows < top + bh) & (cols >= left) & (cols < left + bw)
    fill = torch.zeros((), dtype=images.dtype, device=images.device) if value is None else value.to(images.dtype)
    # (a 0-d tensor, made on the device: no copy)
    return torch.where(inside.unsqueeze(1), fill, images)
