"""The training order of a map-style dataset: one global order per epoch, the same on any number of processes.

Each epoch's order is a permutation of the dataset drawn from the recipe's seed and the epoch alone
(:func:`epoch_order`; for a dataset streamed in shards, the shards in a random order and the samples shuffled
within a window of a few shards, so that a process reads a few shards at a time). Global batch ``k`` is positions
``k*B .. (k+1)*B`` of it (``B`` the recipe's ``trainer.batch_size``), and process ``r`` of ``W`` takes the ``r``-th
of its ``W`` equal parts: every step trains the same samples whatever the number of processes.

Each sample's random augmentation is seeded by the seed, the epoch and the sample's index
(:func:`sample_seed`), not by the DataLoader worker that happens to load it: a crop or flip does not depend on
the number of workers or processes either. The key the sampler hands the dataset carries the epoch too, for a
dataset whose samples depend on it (``sample_in_epoch``: the alternating flips of
:class:`~dlrecipes.data.tensor_dataset.TransformedTensorDataset`).

A checkpoint records how far into its epoch the run was (Composer asks the train loader's dataset for
``state_dict(num_samples, from_beginning)``: :class:`OrderedSamples`); a resumed run starts its epoch's order
there, on the same number of processes or another that divides the batch, without loading the batches it
skips. Composer then knows the dataset resumes itself (``state.dataset_resumption``) and does not spin the
loader; the engine restores the checkpoint's random state where the uninterrupted run had it
(:mod:`dlrecipes.engine`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, get_worker_info
from torchvision.datasets import VisionDataset

ORDER = "global-v1"  # what a checkpoint's data position means; a resume from another kind starts its epoch over
SHARD_WINDOW = 4  # shards whose samples are shuffled together


def epoch_order(length: int, seed: int, epoch: int, shard_sizes: Sequence[int] | None = None) -> np.ndarray:
    """Epoch ``epoch``'s permutation of ``range(length)``, from ``seed`` and ``epoch`` only.

    With ``shard_sizes`` (samples per shard, in index order, summing to ``length``): the shards in a random
    order, then the samples of each run of :data:`SHARD_WINDOW` consecutive shards (in that order) shuffled
    together."""
    rng = np.random.default_rng([seed, epoch])
    if not shard_sizes:
        return rng.permutation(length)
    if sum(shard_sizes) != length:
        raise ValueError(f"shard sizes add up to {sum(shard_sizes)}, not the dataset's {length} samples")
    starts = np.concatenate([[0], np.cumsum(shard_sizes)[:-1]]).astype(np.int64)
    shards = rng.permutation(len(shard_sizes))
    parts = []
    for first in range(0, len(shards), SHARD_WINDOW):
        window = shards[first : first + SHARD_WINDOW]
        indices = np.concatenate([np.arange(starts[s], starts[s] + shard_sizes[s]) for s in window])
        parts.append(rng.permutation(indices))
    return np.concatenate(parts) if parts else np.arange(0)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of sample ``index``'s augmentation in ``epoch`` (a 63-bit mix of the three)."""
    return ((seed * 1_000_003 + epoch) * 998_244_353 + index) % (2**63)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's, Python's and NumPy's global random state seeded with ``seed`` inside. In the training process
    (``num_workers: 0``) they are put back after, so that loading a sample leaves the training's own random
    stream (dropout, MixUp) as it was; a DataLoader worker's stream serves only its samples."""
    in_worker = get_worker_info() is not None
    saved = None if in_worker else (torch.default_generator.get_state(), random.getstate(), np.random.get_state())
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    try:
        yield
    finally:
        if saved is not None:
            torch.default_generator.set_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])


class GlobalOrderSampler(DistributedSampler):
    """This process's part of each global batch of :func:`epoch_order`, as ``(index, augmentation seed, epoch)``
    keys.

    A ``DistributedSampler`` so that Composer sets its epoch at each epoch's start. Its length is the whole
    epoch's; after :meth:`resume_at` the epoch it names starts at the recorded position (once)."""

    def __init__(
        self,
        length: int,
        global_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        shard_sizes: Sequence[int] | None = None,
    ):
        if global_batch % world_size:
            raise ValueError(f"a global batch of {global_batch} cannot be split in {world_size} equal parts")
        # DistributedSampler's own attributes, which Composer and torch read (no process group needed)
        self.dataset, self.num_replicas, self.rank, self.seed = range(length), world_size, rank, seed
        self.shuffle, self.drop_last, self.epoch = True, True, 0
        self.global_batch, self.shard_sizes = global_batch, list(shard_sizes) if shard_sizes else None
        self.batches = length // global_batch  # full global batches per epoch: the rest is dropped
        self.num_samples = self.batches * (global_batch // world_size)
        self.total_size = self.batches * global_batch
        self._resume: tuple[int, int] | None = None  # (epoch, global position) a checkpoint recorded

    def resume_at(self, epoch: int, position: int) -> None:
        """Start ``epoch`` at global position ``position`` (samples trained in it, by every process together)."""
        if position % self.global_batch:
            raise ValueError(f"position {position} is not a whole number of global batches of {self.global_batch}")
        self._resume = (epoch, position)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        order = epoch_order(len(self.dataset), self.seed, self.epoch, self.shard_sizes)
        start = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            start, self._resume = self._resume[1] // self.global_batch, None
        part = self.global_batch // self.num_replicas
        for k in range(start, self.batches):
            first = k * self.global_batch + self.rank * part
            for index in order[first : first + part].tolist():
                yield index, sample_seed(self.seed, self.epoch, index), self.epoch


class OrderedSamples(Dataset):
    """A dataset read in :class:`GlobalOrderSampler`'s order: each key's sample loaded under its own seed (by the
    dataset's ``sample_in_epoch(index, epoch, run seed)`` where it has one, else ``dataset[index]``), and the
    position in the epoch kept in Composer's checkpoints. Other attributes are the dataset's."""

    def __init__(self, dataset: Dataset, sampler: GlobalOrderSampler):
        self.samples_of, self.sampler = dataset, sampler

    def __len__(self) -> int:
        return len(self.samples_of)

    def __getitem__(self, key: tuple[int, int, int]) -> Any:
        index, seed, epoch = key
        in_epoch = getattr(self.samples_of, "sample_in_epoch", None)
        with seeded(seed):
            return self.samples_of[index] if in_epoch is None else in_epoch(index, epoch, self.sampler.seed)

    def __getattr__(self, name: str) -> Any:
        if name in ("samples_of", "sampler") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.samples_of, name)

    # -- Composer's dataset resumption (State._dataset_state_dict / _load_dataset_state) --
    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        s = self.sampler
        return {
            "order": ORDER,
            "epoch": s.epoch,
            "samples": int(num_samples),
            "world_size": s.num_replicas,
            "global_batch": s.global_batch,
            "seed": s.seed,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Continue the checkpoint's epoch at its position, with this recipe's seed (the same unless changed), on
        any number of processes; a position this order cannot continue is one line (a changed batch size)."""
        if not state or not state.get("samples"):
            return  # saved at an epoch's end or before any batch: the epoch starts at its beginning
        if state.get("global_batch") != self.sampler.global_batch:
            from dlrecipes.errors import RecipeError

            raise RecipeError(
                f"trainer.batch_size: the checkpoint was saved inside epoch {state.get('epoch')} with batches of "
                f"{state.get('global_batch')}; resume with trainer.batch_size={state.get('global_batch')} (the batch "
                "size can change at an epoch's end)"
            )
        self.sampler.resume_at(int(state["epoch"]), int(state["samples"]))


class OrderedVisionSamples(OrderedSamples, VisionDataset):
    """:class:`OrderedSamples` of a torchvision ``VisionDataset``: still one, so that Composer's RandAugment and
    AugMix add their step to its ``transform`` (which is the dataset's)."""

    @property
    def transform(self) -> Any:
        return self.samples_of.transform

    @transform.setter
    def transform(self, value: Any) -> None:
        self.samples_of.transform = value


def ordered(dataset: Dataset, global_batch: int, rank: int, world_size: int, seed: int) -> OrderedSamples:
    """``dataset`` wrapped to be read in the global order (its ``shard_sizes``, if it has them, shape it)."""
    sampler = GlobalOrderSampler(
        len(dataset), global_batch, rank, world_size, seed, getattr(dataset, "shard_sizes", None)
    )
    kind = OrderedVisionSamples if isinstance(dataset, VisionDataset) else OrderedSamples
    return kind(dataset, sampler)
