"""The text log every run writes: ``<run dir>/train-rank<N>.log``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from composer.loggers import FileLogger

from dlrecipes.core.secrets import redact_text
from dlrecipes.loggers.read_back import ReadsAtInterval

if TYPE_CHECKING:
    from composer.core import State
    from composer.loggers import Logger


MICROBATCH_KEY = "trainer/device_train_microbatch_size"
# terminal control sequences: colours, clearing the line, moving the cursor (CSI ...), and the short ESC forms
_ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


class RunLogFile(ReadsAtInterval, FileLogger):
    """Composer's text log without the per-batch counters: ``time/*`` (every line names its batch)
    and the microbatch size unless it changed (auto microbatching).  Every batch's loss is
    written; the values are read back from the device every ``read_every`` batches.

    What the run prints is captured as plain lines, as piped output has them: secrets redacted
    (:func:`dlrecipes.core.secrets.redact_text`), without escape codes, and of a line redrawn in
    place (``\\r``, the terminal's live line) only what stayed on the screen; a line still being
    redrawn when the log closes is left out."""

    _microbatch: Any = None

    def __init__(self, *args: Any, read_every: int = 1, **kwargs: Any):
        self._partial: dict[str, tuple[str, bool]] = {}  # per stream: the unfinished line, whether it was redrawn
        super().__init__(*args, **kwargs)
        self.read_every = max(1, int(read_every))

    def init(self, state: State, logger: Logger) -> None:
        """Composer's logger opens its file anew (``w+``): a resumed run appends instead, after what the run's
        earlier parts wrote (here, or brought back from its bucket)."""
        import os

        del logger
        self._is_newline = True
        self._run_name = state.run_name
        if self.file is not None:
            raise RuntimeError("the run's log file is already open")
        os.makedirs(os.path.dirname(self.filename) or ".", exist_ok=True)
        self.file = open(self.filename, "a+", buffering=self.buffer_size)
        self._flush_queue()

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        kept = {k: v for k, v in metrics.items() if not k.startswith("time/") or k == "time/epoch"}
        micro = kept.pop(MICROBATCH_KEY, None)
        if micro is not None and micro != self._microbatch:
            kept[MICROBATCH_KEY] = self._microbatch = micro
        if kept:
            super().log_metrics(kept, step)

    def write(self, prefix: str, s: str) -> None:
        """Whole lines only, each as it stayed on the screen (what follows its last carriage return)."""
        text, redrawn = self._partial.get(prefix, ("", False))
        *lines, rest = (text + _ESCAPE.sub("", s)).split("\n")
        for line in lines:
            redrawn = redrawn or "\r" in line
            line = line.rsplit("\r", 1)[-1]
            if line or not redrawn:  # a line cleared for the next one's text is no line
                super().write(prefix, redact_text(line) + "\n")
            redrawn = False
        redrawn = redrawn or "\r" in rest
        self._partial[prefix] = (rest.rsplit("\r", 1)[-1], redrawn)  # only the last drawing is kept

    def close(self, state: State, logger: Logger) -> None:
        for prefix, (text, redrawn) in list(self._partial.items()):
            if text and not redrawn:  # output that did not end its line: kept
                super().write(prefix, redact_text(text) + "\n")
        self._partial = {}
        super().close(state, logger)
