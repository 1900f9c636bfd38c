"""What a training run prints: a live line per phase on a terminal, one summary line per epoch.

On a terminal (``trainer.progress_bar: true``) one line is redrawn in place while an epoch
trains or evaluates::

    train epoch 3/12 ━━━━━━━━━━━━━━━━━━━━━  45/100  loss 0.1234  eval top1 0.9312  lr 1.20e-03  1,234 img/s  ETA 0:04:10

It always fits the terminal's width: the bar shrinks or goes, then the labels shorten, then
the learning rate, the speed, the monitored metric and the ETA go, in that order; the epoch, the
batch counter and the loss stay.  The epoch table, too, drops columns on a narrow terminal
(train metrics other than top-1 first; the loss and the monitored metric stay).  A start line
names the run directory, the data, the device and the precision as soon as training starts.  Epochs count from 1,
as the final ``done: N epochs`` does.  The live line's loss is the running mean of the epoch so far,
read back at the epoch's first batch and then every ``log_interval`` batches (never an earlier
epoch's); beside it the monitored metric of the last evaluation, labelled ``eval``.  When the
epoch (and its evaluation) ends, the live line is replaced by a summary line that stays, whose
loss (the epoch's mean), images/s and time are the run's history's, as history.csv has them
(after a resume inside the epoch, they cover the whole epoch)::

    epoch  3/12  loss 0.1234  train top1 0.9312  eval loss 0.2010 top1 0.9300  lr 1.20e-03  1,234 img/s  12.3s

When standard output is not a terminal (CI, ``| tee``, SLURM logs) only the summary lines
are written, plainly, with no carriage returns.  Only the process of global rank 0 prints.
The engine logs every batch's loss as a device tensor; it is read back only at each epoch's
first batch, every ``read_every`` batches (``trainer.log_interval``) and at each epoch's end, so
the live line makes no other step wait for the device.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
import shutil
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from composer.core import State, TimeUnit
from composer.loggers import Logger, LoggerDestination
from composer.utils import dist

if TYPE_CHECKING:
    from dlrecipes.records.history import RunHistory


CLEAR_LINE = "\r\x1b[K"
SILENCED = contextvars.ContextVar("dlrecipes_report_silenced", default=False)  # see silenced()


@contextlib.contextmanager
def silenced():
    """No run report inside the block (``dlrecipes.train(..., quiet=True)``)."""
    token = SILENCED.set(True)
    try:
        yield
    finally:
        SILENCED.reset(token)


# Warnings every run of a correct recipe can print, hidden unless `dlrecipes train --verbose`:
# (message start, why it is harmless)
HARMLESS_WARNINGS = (
    ("Cannot split tensor of length", "Composer: the last batch is smaller than the microbatch size"),
    ("DataloaderNumBatchesWarning", "Composer: train_subset_num_batches is larger than the epoch"),
    ("Specifying the ProgressBarLogger via `loggers`", "Composer: our terminal output is a logger"),
)


def hide_harmless_warnings() -> None:
    """Ignore :data:`HARMLESS_WARNINGS` (call inside ``warnings.catch_warnings()``)."""
    import warnings

    for message, _ in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=f"{message}.*")


def _number(value: Any) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(value):
        return "nan"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "-:--:--"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _short_number(value: Any) -> str:
    text = _number(value)
    return text[:-1] if re.fullmatch(r"-?\d\.\d{4}", text) else text


def _speed(per_second: float) -> tuple[str, str]:
    # padded, so that the line keeps its layout as the numbers change
    short = f"{per_second / 1000:>5.1f}k/s" if per_second >= 1000 else f"{per_second:>5.0f}/s"
    return f"{per_second:>6,.0f} img/s", short


def fit_line(
    head: tuple[str, str],
    counter: str,
    fields: list[tuple[str, str]],
    progress: float | None,
    width: int,
    unicode: bool = True,
    drop: Sequence[int] = (),
) -> str:
    """One live line no wider than ``width - 1``: the head, a bar if there is room, the counter, the fields.

    ``head`` and each field come as (full text, short text). The bar gives way first, then the
    gaps, then the full texts; then the fields at the indices ``drop`` names, in that order.
    """
    limit = max(width - 1, 20)
    plain = ""
    for form, gap in ((0, "  "), (0, " "), (1, " ")):
        tail = gap.join(field[form] for field in fields)
        plain = f"{head[form]} {counter}{gap}{tail}"
        room = limit - len(plain) - 1
        if progress is not None and form == 0 and room >= 10:
            cells = min(room, 40)
            done = int(round(cells * min(max(progress, 0.0), 1.0)))
            full, empty = ("━", "╺") if unicode else ("#", "-")
            bar = full * done + (empty if done < cells else "") + " " * max(cells - done - 1, 0)
            return f"{head[form]} {bar} {counter}{gap}{tail}"
        if len(plain) <= limit:
            return plain
    kept = list(range(len(fields)))
    for index in drop:
        kept.remove(index)
        plain = " ".join([f"{head[1]} {counter}", *(fields[i][1] for i in kept)])
        if len(plain) <= limit:
            return plain
    return plain[:limit]


# The epoch table's columns in the order they give way on a narrow terminal (the rest, and the monitored
# metric, always stay): first the train metrics other than top-1, then eval metrics other than loss and the
# monitored one, then learning rate, speed, train top-1, time and eval loss.
def _drop_rank(column: str, monitored: str) -> int:
    if column in ("epoch", "loss", f"eval {monitored}"):
        return -1
    order = ("train", "eval", "lr", "img/s", "train top1", "time", "eval loss")
    for rank, prefix in reversed(list(enumerate(order))):
        if column == prefix or (rank < 2 and column.startswith(prefix + " ")):
            return len(order) - rank
    return len(order) + 1  # anything else (a plugin's column) goes first


class TerminalReport(LoggerDestination):
    """Live progress on a terminal and one summary line per epoch (see the module docstring)."""

    def __init__(
        self,
        live: bool = True,
        monitor: str | None = None,
        stream: TextIO | None = None,
        refresh_s: float = 0.1,
        read_every: int = 1,
        start_line: str | None = None,
        history: RunHistory | None = None,
    ):
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.live = live and self.tty
        self.monitor = monitor
        self.refresh_s = refresh_s
        self.read_every = max(1, int(read_every))
        self._unread_loss: Any = None  # the latest loss as logged (a device tensor), read every read_every batches
        self._loss_due = True  # read the loss at the next batch: the first of an epoch (or of a resumed run)
        encoding = (getattr(self.stream, "encoding", None) or "").lower()
        self.unicode = encoding.replace("-", "") == "utf8"
        self.values: dict[str, Any] = {}
        self.eval_values: dict[str, Any] = {}
        self._last_draw = 0.0
        self._drawn = False
        self._epoch_start = time.perf_counter()
        self._epoch_seconds = 0.0
        self._epoch_samples = 0
        self._epoch_ended = False
        self._eval_pending = False
        self._epoch_train_metrics: dict[str, Any] = {}
        self._header: list[str] = []
        self._fit_ended = False
        self._widths: list[int] = []
        self._shown: list[tuple[str, int]] = []  # the columns of the header printed last
        self.start_line = start_line
        self.history = history  # the run's RunHistory (given by the builder): the epoch table's loss is its mean

    # --- values the engine and Composer log --------------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        for key, value in metrics.items():
            if key.startswith("metrics/eval/"):
                self.eval_values[key.removeprefix("metrics/eval/")] = value
            elif key.startswith("metrics/train/"):
                self._epoch_train_metrics[key.removeprefix("metrics/train/")] = value
            elif key == "loss/train/total":
                self._unread_loss = value

    # --- events -------------------------------------------------------------------------------

    def _printing(self) -> bool:
        return dist.get_global_rank() == 0 and not SILENCED.get()

    def fit_start(self, state: State, logger: Logger) -> None:
        if self.start_line and self._printing():  # at once, before data loading or compilation can take a while
            line = self.start_line
            if self.tty and len(line) > self._width() - 1:  # one part per line on a narrow terminal
                line = line.replace(" | ", "\n  ")
            self._print(line)

    def epoch_start(self, state: State, logger: Logger) -> None:
        self._epoch_start = time.perf_counter()
        self._epoch_ended = False
        self.values.pop("loss", None)  # never the previous epoch's
        self._loss_due = True
        self._eval_pending = False
        self._epoch_train_metrics = {}
        self._epoch_samples = 0

    def _read_loss(self, state: State) -> None:
        """The epoch's running mean loss, as the run's history keeps it (it has seen this batch: callbacks run
        before loggers); without a history, the latest loss logged."""
        running = self.history.epoch_train_loss(int(state.timestamp.batch)) if self.history is not None else None
        if running is not None:
            self.values["loss"], self._unread_loss = running, None
        elif self._unread_loss is not None:
            self.values["loss"], self._unread_loss = float(self._unread_loss), None

    def batch_end(self, state: State, logger: Logger) -> None:
        self._epoch_samples = int(state.timestamp.sample_in_epoch)  # host numbers: no device read-back
        if self._loss_due or int(state.timestamp.batch) % self.read_every == 0:
            self._read_loss(state)
            self._loss_due = False
        if self.live and self._printing() and time.perf_counter() - self._last_draw >= self.refresh_s:
            self._draw(self._train_line(state))

    def epoch_end(self, state: State, logger: Logger) -> None:
        self._read_loss(state)
        self._epoch_seconds = time.perf_counter() - self._epoch_start
        self._epoch_ended = True

    def eval_start(self, state: State, logger: Logger) -> None:
        self._eval_start = time.perf_counter()

    def eval_batch_end(self, state: State, logger: Logger) -> None:
        if self.live and self._printing() and time.perf_counter() - self._last_draw >= self.refresh_s:
            self._draw(self._eval_line(state))

    def eval_end(self, state: State, logger: Logger) -> None:
        if self._epoch_ended:  # the evaluation at the end of an epoch goes into that epoch's line
            self._eval_pending = True
            return
        if self._printing():  # one during an epoch (an eval_interval in batches), or after the last step
            epoch = self._epoch_label(state, done=self._fit_ended)
            self._print(f"eval at epoch {epoch} batch {int(state.timestamp.batch)}: " + self._eval_fields())

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        if self._printing():
            self._print(self._epoch_summary(state))
        self._epoch_ended = False

    def fit_end(self, state: State, logger: Logger) -> None:
        self._read_loss(state)
        self._fit_ended = True  # Composer may still evaluate once, after the last step
        self._clear()

    def close(self, state: State, logger: Logger) -> None:
        self._clear()  # a stop or an error ends the run mid-line: its message then starts on a line of its own

    # --- lines --------------------------------------------------------------------------------

    def _max_epochs(self, state: State) -> int | None:
        max_duration, per_epoch = state.max_duration, state.dataloader_len
        if max_duration is None:
            return None
        if max_duration.unit == TimeUnit.EPOCH:
            return int(max_duration.value)
        if max_duration.unit == TimeUnit.BATCH and per_epoch:
            return math.ceil(int(max_duration.value) / int(per_epoch))
        return None

    def _epoch_label(self, state: State, done: bool) -> str:
        total = self._max_epochs(state)
        number = int(state.timestamp.epoch) + (0 if done else 1)
        if total is None:
            return str(number)
        return f"{number:>{len(str(total))}}/{total}"

    def _lr(self, state: State) -> float | None:
        from dlrecipes.records.history import run_lr  # the value history.csv records

        return run_lr(state)

    def _monitored(self) -> tuple[str, Any]:
        """``checkpoint.monitor``'s last value; without one, the first metric evaluation logs (loss last)."""
        name = self.monitor or next((k for k, _ in self._eval_items() if k != "loss"), "loss")
        return name, self.eval_values.get(name)

    def _train_line(self, state: State) -> str:
        batch, per_epoch = int(state.timestamp.batch_in_epoch), state.dataloader_len
        total_batches = int(per_epoch) if per_epoch is not None else None
        elapsed = time.perf_counter() - self._epoch_start
        samples = int(state.timestamp.sample_in_epoch)
        speed = samples / elapsed if elapsed > 0 else 0.0
        eta = float("nan")
        if total_batches and batch:
            epochs = self._max_epochs(state)
            left = total_batches - batch
            if epochs is not None:
                left += (epochs - int(state.timestamp.epoch) - 1) * total_batches
            eta = left * elapsed / batch
        name, value = self._monitored()
        loss, lr = self.values.get("loss"), self._lr(state)
        fields = [
            (f"loss {_number(loss)}", f"loss {_short_number(loss)}"),
            (f"eval {name} {_number(value)}", f"eval {name} {_short_number(value)}"),  # the last evaluation's
            (f"lr {lr:.2e}" if lr is not None else "lr -", f"lr {lr:.1e}" if lr is not None else "lr -"),
            _speed(speed),
            (f"ETA {_duration(eta)}", _duration(eta)),
        ]
        counter = f"{batch:>{len(str(total_batches))}}/{total_batches}" if total_batches else str(batch)
        progress = batch / total_batches if total_batches else None
        epoch = self._epoch_label(state, done=False)
        return fit_line(
            (f"train epoch {epoch}", f"ep {epoch.strip()}"),
            counter,
            fields,
            progress,
            self._width(),
            self.unicode,
            drop=(2, 3, 1, 4),
        )  # lr, speed, the monitored metric, ETA; loss stays

    def _eval_line(self, state: State) -> str:
        batch, total = int(state.eval_timestamp.batch), state.dataloader_len
        elapsed = time.perf_counter() - getattr(self, "_eval_start", time.perf_counter())
        eta = (int(total) - batch) * elapsed / batch if total and batch else float("nan")
        speed = int(state.eval_timestamp.sample) / elapsed if elapsed > 0 else 0.0
        fields = [_speed(speed), (f"ETA {_duration(eta)}", _duration(eta))]
        counter = f"{batch:>{len(str(int(total)))}}/{int(total)}" if total else str(batch)
        epoch = self._epoch_label(state, done=self._epoch_ended)
        return fit_line(
            (f"eval  epoch {epoch}", f"eval {epoch.strip()}"),
            counter,
            fields,
            batch / int(total) if total else None,
            self._width(),
            self.unicode,
            drop=(0, 1),
        )

    def _epoch_columns(self, state: State) -> dict[str, str]:
        """This epoch's summary: column header -> value."""
        history = self.history  # the epoch's mean loss, as history.csv has it (not the last batch's)
        loss = history.epoch_train_loss(int(state.timestamp.batch)) if history is not None else None
        columns = {
            "epoch": self._epoch_label(state, done=True),
            "loss": _number(loss if loss is not None else self.values.get("loss")),
        }
        columns.update({f"train {k}": _number(v) for k, v in self._epoch_train_metrics.items()})
        if self._eval_pending:
            columns.update({f"eval {k}": _number(v) for k, v in self._eval_items()})
        if history is not None:  # history.csv's rate: over the whole epoch, also after a resume inside it
            seconds, speed = history.epoch_train_seconds(), history.epoch_images_per_sec(state)
        else:
            seconds = self._epoch_seconds
            speed = self._epoch_samples / seconds if seconds > 0 else 0.0
        lr = self._lr(state)
        columns.update(
            {
                "lr": f"{lr:.2e}" if lr is not None else "-",
                "img/s": f"{speed:,.0f}" if math.isfinite(speed) else "-",
                "time": f"{seconds:.1f}s",
            }
        )
        self._eval_pending = False
        return columns

    def _epoch_summary(self, state: State) -> str:
        """One aligned row per epoch, under a header printed again only when the columns change. On a
        terminal narrower than the row, columns give way by :func:`_drop_rank`."""
        columns = self._epoch_columns(state)
        lines = []
        if not set(columns) <= set(self._header):  # a column not seen before (e.g. the first evaluation)
            self._header = [*self._header, *(name for name in columns if name not in self._header)]
            self._header.sort(key=lambda name: list(columns).index(name) if name in columns else len(columns))
            self._widths = [
                max(len(name), len(columns.get(name, "")), 7 if name != "epoch" else 0) for name in self._header
            ]
        shown = self._fitting_columns()
        if shown != self._shown:
            self._shown = shown
            lines.append("  ".join(name.ljust(w) for name, w in shown).rstrip())
        lines.append("  ".join(columns.get(name, "-").ljust(w) for name, w in shown).rstrip())
        return "\n".join(lines)

    def _fitting_columns(self) -> list[tuple[str, int]]:
        """The header's columns (name, width) that fit the terminal; all of them when output is not a terminal."""
        shown = list(zip(self._header, self._widths))
        if not self.tty:
            return shown
        monitored = self._monitored()[0]
        limit = self._width() - 1
        while sum(w for _, w in shown) + 2 * (len(shown) - 1) > limit:
            rank, name, width = max((_drop_rank(name, monitored), name, width) for name, width in shown)
            if rank < 0:
                break
            shown.remove((name, width))
        return shown

    def _eval_items(self) -> list[tuple[str, Any]]:
        return sorted(self.eval_values.items(), key=lambda kv: kv[0] != "loss")

    def _eval_fields(self) -> str:
        return "  ".join(f"{k} {_number(v)}" for k, v in self._eval_items())

    # --- output -------------------------------------------------------------------------------

    def _width(self) -> int:
        return shutil.get_terminal_size().columns  # $COLUMNS, else the terminal's width (read at every draw)

    def _draw(self, line: str) -> None:
        self.stream.write(CLEAR_LINE + line)
        self.stream.flush()
        self._drawn = True
        self._last_draw = time.perf_counter()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
            self._drawn = False

    def _print(self, line: str) -> None:
        self._clear()
        self.stream.write(line + "\n")
        self.stream.flush()
        self._last_draw = 0.0  # redraw the live line at the next batch
