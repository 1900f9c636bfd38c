"""The loop's counters, made cheaper: the timestamp's step to the next batch and an (inputs, targets) batch's size."""

from __future__ import annotations

import copyreg
import datetime
from typing import TYPE_CHECKING, Any

import torch
from composer.core import Batch, Time, Timestamp, TimeUnit

if TYPE_CHECKING:
    from composer.core import DataSpec


def _time(value: int, unit: TimeUnit) -> Time:
    """A Time without its constructor's conversions and checks (the value is a counter already)."""
    made = Time.__new__(Time)
    made._value, made._unit = value, unit
    return made


class QuickTimestamp(Timestamp):
    """Composer's Timestamp with a cheaper step to the next batch.

    Composer's ``to_next_batch`` adds ``Time`` objects and rebuilds the timestamp through its
    validating constructor, about 19 ``Time`` objects and 25 us per batch; this one makes the
    same values directly (``tests/test_engine.py`` compares the two).  Copies stay this class;
    pickled (a callback keeping ``state.timestamp``, a deep copy of the state) it becomes
    Composer's own Timestamp, so the pickle loads without dlrecipes.
    """

    # Composer keys checkpointed objects by class qualname: checkpoints must keep saying "Timestamp"
    __qualname__ = "Timestamp"

    @classmethod
    def of(cls, timestamp: Timestamp) -> QuickTimestamp:
        made = Timestamp.__new__(cls)
        made.__dict__.update(timestamp.__dict__)
        return made

    def __reduce_ex__(self, protocol: Any):
        # copyreg's own rebuilder: Timestamp.__new__, then these fields; the pickle names no dlrecipes class
        return copyreg._reconstructor, (Timestamp, object, None), dict(self.__dict__)

    def copy(self, *args: Any, **kwargs: Any) -> QuickTimestamp:
        return QuickTimestamp.of(super().copy(*args, **kwargs))

    def to_next_batch(self, samples: Any = 0, tokens: Any = 0, duration: datetime.timedelta | None = None):
        """Replaces ``composer.core.time.Timestamp.to_next_batch`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_the_quick_timestamp_counts_as_composers``."""
        if type(samples) is not int or type(tokens) is not int:  # Time or float counts: Composer's arithmetic
            return super().to_next_batch(samples, tokens, duration)
        duration = datetime.timedelta(seconds=0) if duration is None else duration
        made = QuickTimestamp.of(self)
        made._batch = _time(self._batch._value + 1, TimeUnit.BATCH)
        made._batch_in_epoch = _time(self._batch_in_epoch._value + 1, TimeUnit.BATCH)
        made._sample = _time(self._sample._value + samples, TimeUnit.SAMPLE)
        made._sample_in_epoch = _time(self._sample_in_epoch._value + samples, TimeUnit.SAMPLE)
        made._token = _time(self._token._value + tokens, TimeUnit.TOKEN)
        made._token_in_epoch = _time(self._token_in_epoch._value + tokens, TimeUnit.TOKEN)
        made._token_in_iteration = _time(self._token_in_iteration._value + tokens, TimeUnit.TOKEN)
        made._total_wct = self._total_wct + duration
        made._iteration_wct = self._iteration_wct + duration
        made._epoch_wct = self._epoch_wct + duration
        made._batch_wct = duration
        return made


def quick_counts(spec: DataSpec) -> None:
    """Give a DataSpec that uses Composer's default counting a shortcut for (inputs, targets) pairs.

    Composer's defaults walk the batch with ``isinstance`` checks against typing generics, five
    times per batch in its loop and ours; for a pair of tensors of one length the answer is that
    length (samples) and 0 (tokens, when the dataset has no ``max_seq_len``), as they compute.
    """
    if getattr(spec, "quick_counts", False):
        return
    spec.quick_counts = True
    default_samples = spec._default_get_num_samples_in_batch
    if spec.get_num_samples_in_batch == default_samples:

        def samples(batch: Batch) -> int:
            if type(batch) in (tuple, list) and len(batch) == 2:
                x, y = batch
                if type(x) is torch.Tensor and type(y) is torch.Tensor and x.shape[0] == y.shape[0]:
                    return x.shape[0]
            return default_samples(batch)

        spec.get_num_samples_in_batch = samples
    default_tokens = spec._default_get_num_tokens_in_batch
    if spec._get_num_tokens_in_batch == default_tokens and not hasattr(
        getattr(spec.dataloader, "dataset", None), "max_seq_len"
    ):
        spec._get_num_tokens_in_batch = lambda batch: 0 if type(batch) in (tuple, list) else default_tokens(batch)
