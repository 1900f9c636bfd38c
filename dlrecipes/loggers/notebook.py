"""What a training run shows in a notebook cell (Jupyter, Colab, VS Code): the terminal report's content,
drawn for the cell.

- The live line becomes a progress display updated in place: an ipywidgets progress bar with the line's
  fields beside it, or, where ipywidgets is missing, a text display replaced at each refresh.
- The epoch table is an HTML table that grows by one row per epoch, in place.
- The start line and evaluations inside an epoch are printed as text, as the piped CLI prints them.

Nothing written contains a carriage return or an escape code.  Only global rank 0 shows anything.
"""

from __future__ import annotations

import re
import time
from html import escape
from typing import Any

from composer.core import State
from composer.loggers import Logger

from dlrecipes.loggers.terminal import TerminalReport

BAR = re.compile(r" [━╺ ]+ (?=\S)")  # the text bar the live line draws between its head and its counter


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel behind it, not a terminal IPython)."""
    import sys

    if "IPython" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_report(**kwargs: Any) -> TerminalReport:
    """The run's report for where it is shown: a notebook cell (:class:`NotebookReport`), else the terminal or a
    pipe (:class:`TerminalReport`)."""
    return NotebookReport(**kwargs) if in_notebook() else TerminalReport(**kwargs)


class Progress:
    """A display that updates in place: an ipywidgets bar and label, else a text display."""

    def __init__(self) -> None:
        from IPython.display import display

        try:
            import ipywidgets
        except ImportError:
            ipywidgets = None
        self.widget = None
        if ipywidgets is not None:
            self.bar = ipywidgets.FloatProgress(value=0.0, min=0.0, max=1.0, layout={"width": "30%"})
            self.label = ipywidgets.Label(value="")
            self.widget = ipywidgets.HBox([self.bar, self.label])
            display(self.widget)
        else:
            self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def show(self, line: str, progress: float | None) -> None:
        if self.widget is not None:
            self.label.value = BAR.sub(" ", line, count=1)
            if progress is not None:
                self.bar.value = min(max(progress, 0.0), 1.0)
        else:
            self.handle.update({"text/plain": line}, raw=True)

    def finish(self, line: str) -> None:
        self.show(line, 1.0)
        if self.widget is not None:
            self.bar.bar_style = "success"


class NotebookReport(TerminalReport):
    """:class:`TerminalReport` for a notebook cell (see the module docstring)."""

    def __init__(self, live: bool = True, **kwargs: Any):
        super().__init__(live=live, **kwargs)
        self.live = live  # a cell always redraws in place
        self.tty = False  # every column of the epoch table (a cell has no width to fit)
        self.unicode = True
        self._progress: Progress | None = None
        self._fraction: float | None = None
        self._table: Any = None
        self._rows: list[dict[str, str]] = []
        self._columns: list[str] = []

    def _width(self) -> int:
        return 160

    def _train_line(self, state: State) -> str:
        total = state.dataloader_len
        self._fraction = int(state.timestamp.batch_in_epoch) / int(total) if total else None
        return super()._train_line(state)

    def _eval_line(self, state: State) -> str:
        total = state.dataloader_len
        self._fraction = int(state.eval_timestamp.batch) / int(total) if total else None
        return super()._eval_line(state)

    def _draw(self, line: str) -> None:
        if self._progress is None:
            self._progress = Progress()
        self._progress.show(line, self._fraction)
        self._last_draw = time.perf_counter()

    def _clear(self) -> None:
        pass  # the progress display stays where it is, with its last line

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        if self._printing():
            self._add_row(self._epoch_columns(state))
        self._epoch_ended = False

    def fit_end(self, state: State, logger: Logger) -> None:
        super().fit_end(state, logger)
        if self._progress is not None and self._printing():
            self._progress.finish(f"done: {int(state.timestamp.epoch)} epochs, {int(state.timestamp.batch)} batches")

    def _add_row(self, columns: dict[str, str]) -> None:
        from IPython.display import HTML, display

        self._rows.append(columns)
        self._columns += [name for name in columns if name not in self._columns]
        head = "".join(f"<th>{escape(name)}</th>" for name in self._columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(row.get(name, '-'))}</td>" for name in self._columns) + "</tr>"
            for row in self._rows
        )
        table = HTML(f"<table class='dlrecipes-epochs'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        if self._table is None:
            self._table = display(table, display_id=True)
        else:
            self._table.update(table)
