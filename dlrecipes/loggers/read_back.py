"""Loggers that read device values back in batches: every batch's loss, no step waiting for it.

The engine logs every batch's loss (and the running train metrics) as 0-d tensors on the
training device, as Composer logs metrics.  A destination that formats or uploads each value
at once would read it back from the GPU after every step and make the next step wait.  With
:class:`ReadsAtInterval` in front of it, a destination keeps what it is given, in order, and
every ``read_every`` batches (and at each epoch's and evaluation's end, before any other kind of
record, and at the end) reads all the queued tensors back in one transfer per device and passes
them on with their own steps.  The destination still receives every value and every step.
Algorithm traces (Composer logs one each time an algorithm runs: every batch, with label
smoothing or EMA) hold no device values; they wait in the same queue, in their place.
"""

from __future__ import annotations

from typing import Any

import torch
from composer.core import State
from composer.loggers import Logger


def read_back(values: list[Any]) -> list[Any]:
    """One-element tensors as Python numbers, read with one transfer per device and dtype; the rest as given."""
    groups: dict[tuple, list[int]] = {}
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            groups.setdefault((value.device, value.dtype), []).append(i)
    read = list(values)
    for indices in groups.values():
        numbers = torch.stack([values[i].detach().reshape(()) for i in indices]).tolist()
        for i, number in zip(indices, numbers):
            read[i] = number
    return read


_TRACES = object()  # the step of a queued trace record


class ReadsAtInterval:
    """Mixin for a LoggerDestination: queue ``log_metrics`` and pass it on every ``read_every`` batches.

    Put it first among the bases (``class X(ReadsAtInterval, SomeLogger)``) and keep the
    destination's class name (``__qualname__``), which Composer's checkpoints file it under.
    """

    read_every = 1

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.__dict__.setdefault("_unread", []).append((step, dict(metrics)))

    def log_traces(self, traces: dict[str, Any]) -> None:
        # queued in order with the metrics, not a reason to read them back before the interval
        self.__dict__.setdefault("_unread", []).append((_TRACES, dict(traces)))

    def write_unread(self) -> None:
        """Pass the queued metrics (and traces, in their place) on, with every tensor read back now."""
        queued = self.__dict__.get("_unread")
        if not queued:
            return
        self._unread = []
        flat = [value for step, metrics in queued if step is not _TRACES for value in metrics.values()]
        values = iter(read_back(flat))
        for step, metrics in queued:
            if step is _TRACES:
                super().log_traces(metrics)  # type: ignore[misc]
            else:
                super().log_metrics({name: next(values) for name in metrics}, step)  # type: ignore[misc]

    # what other records a destination gets must not overtake the queued metrics
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self.write_unread()
        super().log_hyperparameters(hyperparameters)  # type: ignore[misc]

    def log_table(self, *args: Any, **kwargs: Any) -> None:
        self.write_unread()
        super().log_table(*args, **kwargs)  # type: ignore[misc]

    def log_images(self, *args: Any, **kwargs: Any) -> None:
        self.write_unread()
        super().log_images(*args, **kwargs)  # type: ignore[misc]

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) % self.read_every == 0:
            self.write_unread()
        super().batch_end(state, logger)  # type: ignore[misc]

    def epoch_end(self, state: State, logger: Logger) -> None:
        self.write_unread()
        super().epoch_end(state, logger)  # type: ignore[misc]

    def eval_end(self, state: State, logger: Logger) -> None:
        self.write_unread()
        super().eval_end(state, logger)  # type: ignore[misc]

    def fit_end(self, state: State, logger: Logger) -> None:
        self.write_unread()
        super().fit_end(state, logger)  # type: ignore[misc]

    def close(self, state: State, logger: Logger) -> None:
        try:
            self.write_unread()
        finally:
            super().close(state, logger)  # type: ignore[misc]
