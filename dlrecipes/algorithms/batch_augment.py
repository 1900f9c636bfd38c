"""Strong augmentation of whole batches on the training device, as a Composer algorithm.

:class:`BatchAugmentation` runs at ``Event.AFTER_DATALOADER``, after the batch reached the device,
so it works with every loader (torch DataLoader, ``device``, ``tensor_cache``, FFCV) and every
dataset that yields normalised image tensors. For each batch it

1. draws the batch's plan on the host (:mod:`.augment_policy`, seeded by the run's seed, the rank
   and the batch's index: the same under a resume) and copies it to the device in one go
   (pinned, without waiting);
2. turns the normalised images back into uint8 (the loader's mean and std, found on the loader);
3. for each layer of the plan and each op, gathers the samples that drew it and applies the op
   once to that sub-batch with their values (:mod:`.batch_ops`): as many op calls per layer as the
   policy has ops, whatever the batch size, and no per-sample Python loop;
4. normalises again, in the batch's dtype and memory format.

Random erasing runs last, on the normalised batch, as torchvision's ``RandomErasing`` after
``Normalize``. Composer's MixUp and CutMix run later (``BEFORE_FORWARD``), on the augmented batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from composer.core import Algorithm, Event, State

import dlrecipes.algorithms.augment_policy as P
from dlrecipes.algorithms.batch_ops import GEOMETRIC, OPS, constant, erase, geometry, warp
from dlrecipes.errors import RecipeError

if TYPE_CHECKING:
    from composer.loggers import Logger


class _Shipped:
    """The plan's arrays on the device: one pinned copy of each, sliced by host offsets."""

    def __init__(self, device: torch.device, **arrays: np.ndarray):
        self.tensors = {}
        for name, array in arrays.items():
            t = torch.from_numpy(np.ascontiguousarray(array))
            if device.type == "cuda":
                t = t.pin_memory()
            self.tensors[name] = t.to(device, non_blocking=True)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def pack_layers(layers: Sequence[tuple[np.ndarray, np.ndarray]], ops: Sequence[str], size: tuple[int, int]):
    """Host-side grouping of ``layers`` (op ids, values) by op: the groups (layer, op name, start, count)
    and the flat index, value and matrix arrays they slice (a geometric op's values are its matrices)."""
    groups, index, values, thetas = [], [], [], []
    start = 0
    for layer, (ids, vals) in enumerate(layers):
        for k, name in enumerate(ops):
            chosen = np.flatnonzero(ids == k)
            if len(chosen) == 0 or name == "Identity":
                continue
            groups.append((layer, name, start, len(chosen)))
            index.append(chosen)
            values.append(vals[chosen])
            thetas.append(geometry(name, vals[chosen], *size) if name in GEOMETRIC else np.zeros((len(chosen), 2, 3)))
            start += len(chosen)
    if not groups:
        return [], np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 2, 3), np.float32)
    return (
        groups,
        np.concatenate(index).astype(np.int64),
        np.concatenate(values),
        np.concatenate(thetas).astype(np.float32),
    )


def apply_layers(
    images: torch.Tensor,
    layers,
    ops: Sequence[str],
    fill: Sequence[float] | None = None,
    shipped: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``images`` (uint8, N C H W) through ``layers`` (per-sample op ids into ``ops`` and values, on the host):
    for each layer, each op once, on the samples that drew it."""
    size = tuple(images.shape[-2:])
    groups, index, values, thetas = pack_layers(layers, ops, size)
    if not groups:
        return images
    dev = _Shipped(images.device, index=index, values=values, thetas=thetas)
    out = images.clone()
    for _, name, start, count in groups:
        idx = dev["index"][start : start + count]
        sub = out[idx]  # (indexing copies a uint8 batch many times faster than index_select on a CPU)
        if name in GEOMETRIC:
            sub = warp(sub, dev["thetas"][start : start + count], fill)
        else:
            sub = OPS[name](sub, dev["values"][start : start + count], fill)
        out.index_copy_(0, idx, sub)
    return out


def augment_uint8(images: torch.Tensor, policy: P.Policy, rng: np.random.Generator) -> torch.Tensor:
    """A uint8 batch through ``policy`` (RandAugment, TrivialAugmentWide or AugMix) with ``rng``'s draws."""
    n, size = images.shape[0], tuple(images.shape[-2:])
    fill = policy.fill if len(policy.fill) in (1, images.shape[1]) else policy.fill[:1]
    if policy.kind != "augmix":
        layers = [P.draw_layer(policy, rng, n, size) for _ in range(policy.num_ops)]
        return apply_layers(images, layers, policy.ops, fill)
    chains, weights, mix = P.draw_chains(policy, rng, n, size)
    dev = _Shipped(images.device, weights=weights.astype(np.float32), mix=mix.astype(np.float32))
    mixed = torch.zeros(images.shape, dtype=torch.float32, device=images.device)
    for c, layers in enumerate(chains):
        chain = apply_layers(images, layers, policy.ops, fill)
        mixed.add_(chain.float() * dev["weights"][:, c].view(-1, 1, 1, 1))
    m = dev["mix"].view(-1, 1, 1, 1)
    return (images.float() * (1.0 - m) + mixed * m).clamp_(0, 255).to(torch.uint8)


def jitter_uint8(images: torch.Tensor, ranges: dict, p: float, rng: np.random.Generator) -> torch.Tensor:
    """Color jitter (torchvision's ``ColorJitter``, a random order per sample) of a uint8 batch."""
    return apply_layers(images, P.draw_jitter(rng, images.shape[0], ranges, p), P.JITTER_OPS)


def _same_layout(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``out`` in ``like``'s dtype and memory format (channels-last batches from FFCV stay so)."""
    last = like.is_contiguous(memory_format=torch.channels_last) and not like.is_contiguous()
    return out.to(like.dtype).contiguous(memory_format=torch.channels_last if last else torch.contiguous_format)


# --- the batch's normalisation --------------------------------------------------------------------


def _mean_std(obj: Any) -> tuple[list[float], list[float]] | None:
    mean, std = getattr(obj, "mean", None), getattr(obj, "std", None)
    if mean is None or std is None or callable(mean) or callable(std):
        return None
    flat = [torch.as_tensor(v, dtype=torch.float64).flatten().tolist() for v in (mean, std)]
    return flat[0], flat[1]


def normalization_of(loader: Any, depth: int = 0) -> tuple[list[float], list[float]] | None:
    """The (mean, std) a loader's images are normalised with, ``(x / 255 - mean) / std``, found on the
    loader (the device loader, the tensor cache, FFCV) or its dataset (a batch augment, a Normalize
    in its transform), or None."""
    if loader is None or depth > 5:
        return None
    if getattr(loader, "augment", "absent") is None and hasattr(loader, "images"):  # device loader, no normalising
        channels = loader.images.shape[1]
        return [0.0] * channels, [1.0 / 255.0] * channels
    found = _mean_std(loader)
    if found is not None:
        return found
    for attribute in ("augment", "batch_augment", "source", "transform", "dataset", "dataloader", "loader"):
        inner = getattr(loader, attribute, None)
        if inner is not None and (found := normalization_of(inner, depth + 1)) is not None:
            return found
    for step in getattr(loader, "transforms", None) or []:
        if (found := normalization_of(step, depth + 1)) is not None:
            return found
    return None


class BatchAugmentation(Algorithm):
    """One batch augmentation (``policy``, ``jitter`` or ``erasing``) at ``Event.AFTER_DATALOADER``."""

    def __init__(
        self,
        name: str,
        policy: P.Policy | None = None,
        jitter: dict | None = None,
        erasing: dict | None = None,
    ):
        self.name = name
        self.policy, self.jitter, self.erasing = policy, jitter, erasing
        self._norm: tuple[torch.Tensor, torch.Tensor] | None = None
        self._noise: torch.Generator | None = None

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        from composer.utils import dist

        batch = state.batch
        images = batch[0]
        rng = P.batch_rng(state.seed or 0, dist.get_global_rank(), int(state.timestamp.batch), self.name)
        out = self.augment(images, rng, lambda: state.dataloader)
        state.batch = (out, *batch[1:]) if isinstance(batch, tuple) else [out, *batch[1:]]

    def augment(self, images: torch.Tensor, rng: np.random.Generator, loader=lambda: None) -> torch.Tensor:
        """The normalised batch ``images`` augmented with ``rng``'s draws (``loader`` tells the normalisation)."""
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            raise RecipeError(
                f"algorithms.{self.name}: augments (N, 1 or 3, H, W) image batches, "
                f"got a batch of shape {tuple(images.shape)}"
            )
        if self.erasing is not None:
            return _same_layout(self._erase(images, rng), images)
        mean, std = self._normalization(images, loader)
        pixels = (images.float() * std + mean).mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)
        if self.policy is not None:
            pixels = augment_uint8(pixels, self.policy, rng)
        else:
            pixels = jitter_uint8(pixels, self.jitter["ranges"], self.jitter["p"], rng)
        return _same_layout((pixels.float() / 255.0 - mean) / std, images)

    def _normalization(self, images: torch.Tensor, loader) -> tuple[torch.Tensor, torch.Tensor]:
        if self._norm is None or self._norm[0].device != images.device:
            found = normalization_of(loader())
            if found is None:
                raise RecipeError(
                    f"algorithms.{self.name}: cannot tell how the training loader normalises its images (no mean "
                    f"and std on {type(loader()).__name__} or its dataset); it needs them to work on pixels"
                )
            c = images.shape[1]
            mean, std = (constant(v if len(v) == c else v[:1] * c, images.device).view(1, c, 1, 1) for v in found)
            self._norm = (mean, std)
        return self._norm

    def _erase(self, images: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        e = self.erasing
        boxes = P.draw_erasing(rng, images.shape[0], tuple(images.shape[-2:]), e["p"], e["scale"], e["ratio"])
        value = None
        if e["value"] == "random":
            if self._noise is None or self._noise.device != images.device:
                self._noise = torch.Generator(device=images.device)
            self._noise.manual_seed(int(rng.integers(0, 2**62)))
            value = torch.empty(images.shape, device=images.device).normal_(generator=self._noise)
        elif e["value"]:
            value = torch.full((), float(e["value"]), device=images.device)
        return erase(images, _Shipped(images.device, boxes=boxes)["boxes"], value)
