"""The text log every run writes: ``<run dir>/train-rank<N>.log``."""

from __future__ import annotations

from typing import Any, Optional

from composer.loggers import FileLogger

from dlrecipes.loggers.read_back import ReadsAtInterval

MICROBATCH_KEY = "trainer/device_train_microbatch_size"


class RunLogFile(ReadsAtInterval, FileLogger):
    """Composer's text log without the per-batch counters: ``time/*`` (every line names its batch)
    and the microbatch size unless it changed (auto microbatching).  Every batch's loss is
    written; the values are read back from the device every ``read_every`` batches."""

    _microbatch: Any = None

    def __init__(self, *args: Any, read_every: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.read_every = max(1, int(read_every))

    def log_metrics(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        kept = {k: v for k, v in metrics.items() if not k.startswith("time/") or k == "time/epoch"}
        micro = kept.pop(MICROBATCH_KEY, None)
        if micro is not None and micro != self._microbatch:
            kept[MICROBATCH_KEY] = self._microbatch = micro
        if kept:
            super().log_metrics(kept, step)
