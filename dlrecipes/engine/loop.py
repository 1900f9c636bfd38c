"""The loop: Composer's, with the end of the data, the ranks' batch plans and the samples and time across ranks
counted on the host."""

from __future__ import annotations

import datetime
import itertools
import warnings
from collections.abc import Iterable
from typing import Any

from composer.core import Event
from composer.trainer.trainer import TrainerMode
from composer.utils import reproducibility
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from dlrecipes.engine.counts import QuickTimestamp, quick_counts


def batch_plan(loader: Iterable[Any], length: int | None) -> list[float] | None:
    """Four numbers that fix how many batches this rank's loader gives and the size of each, or None.

    Known for a map-style DataLoader cutting its sampler with a BatchSampler (its sampler's length,
    batch size, drop_last and the number of batches taken) and for loaders that declare
    ``fixed_batches = True`` (dlrecipes' device, tensor-cache and FFCV loaders: batch ``i`` holds
    ``min(batch_size, num_samples - i * batch_size)`` samples).
    """
    count = -1.0 if length is None else float(length)
    if getattr(loader, "fixed_batches", False):
        return [float(loader.num_samples), float(loader.batch_size), 0.0, count]
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    batches = loader.batch_sampler
    if type(batches) is not BatchSampler:
        return None
    try:
        return [float(len(batches.sampler)), float(batches.batch_size), float(batches.drop_last), count]
    except TypeError:  # a sampler without a length
        return None


class Loop:
    """Composer's loop with host-side counts (a mixin of :class:`dlrecipes.engine.trainer.Trainer`)."""

    # -- the loop itself stays Composer's; its timestamp and batch counting get cheaper --
    def _train_loop(self) -> None:
        """Composer's loop, with the cheaper timestamp and batch counts (and no warning for a run resumed after its
        epoch's last batch).

        Replaces ``composer.trainer.trainer.Trainer._train_loop`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_training_is_bit_identical_to_composers_trainer``.
        """
        self.state.timestamp = QuickTimestamp.of(self.state.timestamp)
        if self._train_data_spec is not None:
            quick_counts(self._train_data_spec)
        if not self._resumed_at_an_epochs_end():
            return super()._train_loop()
        with warnings.catch_warnings():  # its epoch has no batch left, only its evaluation: not a broken loader
            warnings.filterwarnings("ignore", message="No batches were trained for global rank")
            return super()._train_loop()

    def _resumed_at_an_epochs_end(self) -> bool:
        """Whether this run resumes from a stop after its epoch's last batch (the epoch's end not yet run)."""
        done, length = int(self.state.timestamp.batch_in_epoch), self.state.dataloader_len
        return done > 0 and length is not None and done >= int(length)

    def _agree_on_batches(self, mode: TrainerMode) -> bool:
        """Whether every rank's loader gives the same number of batches of the same sizes (asked once
        per epoch or evaluation, by every rank at the same point)."""
        if self._host.world_size == 1:
            same = True
        else:
            plan = batch_plan(self.state.dataloader, self.state.dataloader_len)
            mine = [1.0, *plan] if plan is not None else [0.0] * 5
            reduced = self._host.max(mine + [-v for v in mine])  # maxima and minima in one reduction
            same = reduced[0] == 1.0 and -reduced[5] == 1.0 and all(reduced[i] == -reduced[i + 5] for i in range(5))
        self._same_batches[mode] = same
        return same

    def _equal_on_every_rank(self) -> bool:
        """Whether this epoch's training batches are alike on every rank (no per-batch reductions)."""
        return self._host.world_size == 1 or self._same_batches.get(TrainerMode.TRAIN, False)

    # -- the end of the data: Composer all-reduces a device flag and reads it every batch --
    def _iter_dataloader(self, trainer_mode: TrainerMode):
        """The batches of this epoch or evaluation; the end of the data asked of every rank on the host, and only
        when their batch plans differ (Composer all-reduces a device flag and reads it back every batch).

        Replaces ``composer.trainer.trainer.Trainer._iter_dataloader`` (Composer 0.32.1);
        guarded by ``tests/test_engine_ranks.py::test_uneven_per_rank_data_trains_the_shorter_length_on_every_rank``.
        """
        loader = self.state.dataloader
        assert loader is not None
        length = self.state.dataloader_len
        resumed = trainer_mode == TrainerMode.TRAIN and "train" in self.state.dataset_resumption
        if resumed and length is not None:  # the dataset starts where the checkpoint was: only the rest is left
            length = max(0, int(length) - int(self.state.timestamp.batch_in_epoch))
        iterator = iter(loader) if length is None else itertools.islice(loader, int(length))
        if resumed:
            self._restore_random_state_inside_the_epoch()
        agree = not self._agree_on_batches(trainer_mode)  # ranks may run out at different batches: ask them all
        while True:
            if trainer_mode == TrainerMode.TRAIN:
                self.engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch, finished = next(iterator), 0.0
            except StopIteration:
                if trainer_mode == TrainerMode.TRAIN:
                    self.engine.run_marker_only_event(Event.AFTER_DATALOADER)
                batch, finished = None, 1.0
            if agree:
                finished = self._host.max([finished])[0]  # any rank out of data: every rank stops
            if finished:
                return
            yield batch

    def _restore_random_state_inside_the_epoch(self) -> None:
        """A checkpoint's random state, for a run resumed inside an epoch by a dataset that resumes itself
        (``dlrecipes.data.order``; Composer's ``dataset_resumption``): Composer restores it only at an epoch's
        start or as it spins the loader, so here, with the epoch's iterator made as the uninterrupted run had
        it (making it draws the workers' seed), before the first batch is trained."""
        if self._rng_state is not None and int(self.state.timestamp.batch_in_epoch) > 0:
            reproducibility.load_rng_state(self._rng_state)
            self._rng_state = None

    # -- samples and wall time: Composer reduces on the device and reads three values --
    def _accumulate_time_across_ranks(self, num_samples, num_tokens: int, batch_time: datetime.timedelta):
        """The batch's samples, tokens and time summed over ranks on the host (none at all when the ranks' batch
        plans agree); Composer reduces them on the device and reads three values back.

        Replaces ``composer.trainer.trainer.Trainer._accumulate_time_across_ranks`` (Composer 0.32.1);
        guarded by ``tests/test_engine_ranks.py::test_equal_shards_take_no_host_reduction_in_a_steady_step``.
        """
        # a training batch's (the evaluation loop calls this too, in eval mode): Composer's per-batch metrics call
        # comes next, and the epoch-end one is told apart from it
        self._in_batch = self.state.model.training
        if self._host.world_size == 1:
            return num_samples, num_tokens, batch_time
        if self._equal_on_every_rank() and not num_tokens and isinstance(num_samples, int):
            return num_samples * self._host.world_size, 0, batch_time  # each rank's own clock
        seconds = batch_time.total_seconds() if self._host.rank == 0 else 0.0
        samples, tokens, seconds = self._host.sum([float(num_samples), float(num_tokens), seconds])
        if abs(samples - round(samples)) > 1e-4 or abs(tokens - round(tokens)) > 1e-4:
            raise ValueError("The sums of samples and tokens across ranks should each be integers.")
        return int(round(samples)), int(round(tokens)), datetime.timedelta(seconds=seconds)
