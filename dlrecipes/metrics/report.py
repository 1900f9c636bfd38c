"""The confusion matrix and per-class accuracy of the best checkpoint, as CSV and PNG.

:class:`ClassReport` updates a confusion matrix from every evaluation (micro)batch's outputs
(on the device, no read-back; the samples Composer's metrics count), computes it once per
evaluation, keeps the one of the evaluation at which ``best.pt`` was saved (the last evaluation
when no metric is monitored), and at the end of training writes under ``<run dir>/report/``:

- ``confusion_matrix.csv`` / ``.png``: rows are true classes, columns predicted classes;
- ``per_class_accuracy.csv`` / ``.png``: each class's correct, total and accuracy (its recall);
- ``report.json``: which evaluation they come from.

(Written at the end of training, and again if Composer evaluates once more after the last step.)

The kept matrix travels in checkpoints, so a resumed run still reports its best evaluation.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist
from torch.utils.data import DataLoader, DistributedSampler

from dlrecipes.records.checkpoints import atomic_write


class ClassReport(Callback):
    def __init__(
        self,
        folder: Path,
        num_classes: int,
        class_names: Sequence[str] | None,
        tables: Sequence[str],
        best=None,
        plots: bool = True,
    ):
        from torchmetrics.classification import MulticlassConfusionMatrix

        self.folder = Path(folder)  # where the report goes at the fit's end (a run's: RunDir.report)
        names = list(class_names or [])
        self.class_names = names if len(names) == num_classes else [str(i) for i in range(num_classes)]
        self.tables = list(tables)
        self.plots = plots  # each table's PNG beside its CSV
        self.best = best  # the BestCheckpoint callback, when a metric is monitored
        # no input checks: they read the batch back from the device (torch.unique) at every update
        self.matrix = MulticlassConfusionMatrix(num_classes=num_classes, validate_args=False)
        self.kept: dict | None = None
        self.fit_ended = False
        self._batches = 0
        self._left_in_batch = 0

    def eval_start(self, state: State, logger: Logger) -> None:
        self.matrix.reset()
        self._batches = 0

    def eval_batch_start(self, state: State, logger: Logger) -> None:
        self._batches += 1
        self._left_in_batch = len(state.batch[1])

    def eval_after_forward(self, state: State, logger: Logger) -> None:
        """Each (micro)batch's outputs, as Composer's metrics see them (per microbatch: at the end of
        a batch only its last microbatch's outputs are left)."""
        outputs, targets = state.outputs, state.batch[1]
        self._left_in_batch -= len(targets)
        if self._padding_only(state, len(targets)):
            return
        if self.matrix.device != outputs.device:
            self.matrix = self.matrix.to(outputs.device)
        self.matrix.update(outputs.detach(), targets)

    def _padding_only(self, state: State, size: int) -> bool:
        """A DistributedSampler's padding sample alone in the last microbatch: Composer leaves it out of
        its metrics (it trims padding from larger ones before the forward pass), and so does the report."""
        loader = state.dataloader
        sampler = getattr(loader, "sampler", None)
        if not isinstance(loader, DataLoader) or not isinstance(sampler, DistributedSampler) or loader.drop_last:
            return False
        padding = sampler.total_size - len(sampler.dataset)
        on_padded_rank = padding > 0 and dist.get_global_rank() >= dist.get_world_size() - padding
        return on_padded_rank and size == 1 and self._left_in_batch <= 0 and self._batches == len(loader)

    def eval_end(self, state: State, logger: Logger) -> None:
        counts = self.matrix.compute()  # every rank: the counts are summed over processes here
        batch = int(state.timestamp.batch)
        if self.best is None or self.best.saved_at_batch == batch:
            self.kept = {"matrix": counts.cpu().tolist(), "epoch": int(state.timestamp.epoch), "batch": batch}
            if self.best is not None:
                self.kept.update(monitor=self.best.monitor, value=self.best.best)
            if self.fit_ended:  # Composer's evaluation after the last step (an eval_interval not ending on it)
                self.fit_end(state, logger)

    def fit_end(self, state: State, logger: Logger) -> None:
        self.fit_ended = True
        if self.kept is not None and dist.get_global_rank() == 0:
            write_report(self.folder, self.kept, self.class_names, self.tables, self.plots)

    def state_dict(self) -> dict:
        return {"kept": self.kept}

    def load_state_dict(self, state: dict) -> None:
        self.kept = state.get("kept")


def _csv_bytes(rows: list[list]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def write_report(folder: Path, kept: dict, names: list[str], tables: Sequence[str], plots: bool = True) -> list[Path]:
    """Write the requested tables (``confusion_matrix``, ``per_class_accuracy``) as CSV, and as PNG with ``plots``."""
    folder.mkdir(parents=True, exist_ok=True)
    matrix = kept["matrix"]
    written = []
    if "confusion_matrix" in tables:
        rows = [["true \\ predicted", *names]] + [[names[i], *row] for i, row in enumerate(matrix)]
        atomic_write(folder / "confusion_matrix.csv", lambda f: f.write(_csv_bytes(rows)))
        written.append(folder / "confusion_matrix.csv")
        if plots:
            _plot_matrix(folder / "confusion_matrix.png", matrix, names)
            written.append(folder / "confusion_matrix.png")
    if "per_class_accuracy" in tables:
        per_class = [(names[i], row[i], sum(row)) for i, row in enumerate(matrix)]
        rows = [["class", "correct", "total", "accuracy"]] + [
            [name, correct, total, f"{correct / total:.6f}" if total else ""] for name, correct, total in per_class
        ]
        atomic_write(folder / "per_class_accuracy.csv", lambda f: f.write(_csv_bytes(rows)))
        written.append(folder / "per_class_accuracy.csv")
        if plots:
            _plot_accuracy(folder / "per_class_accuracy.png", per_class)
            written.append(folder / "per_class_accuracy.png")
    info = {k: v for k, v in kept.items() if k != "matrix"}
    atomic_write(folder / "report.json", lambda f: f.write((json.dumps(info, indent=2) + "\n").encode()))
    return written


def _plot_matrix(path: Path, matrix: list[list[int]], names: list[str]) -> None:
    from dlrecipes.records.plots import new_figure

    n = len(names)
    side = min(4 + 0.35 * n, 16)
    fig = new_figure(figsize=(side, side), dpi=100)
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if n <= 40:
        ax.set_xticks(range(n), names, rotation=90)
        ax.set_yticks(range(n), names)
    if n <= 15:
        top = max(max(row) for row in matrix) or 1
        for i, row in enumerate(matrix):  # inside the axes: left out of tight_layout's measuring (a third of the time)
            for j, count in enumerate(row):
                ax.text(
                    j,
                    i,
                    str(count),
                    ha="center",
                    va="center",
                    color="white" if count > top / 2 else "black",
                    in_layout=False,
                )
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title("confusion matrix")
    fig.tight_layout()
    fig.savefig(path)


def _plot_accuracy(path: Path, per_class: list[tuple[str, int, int]]) -> None:
    from dlrecipes.records.plots import new_figure

    n = len(per_class)
    fig = new_figure(figsize=(6, min(2 + 0.25 * n, 24)), dpi=100)
    ax = fig.subplots()
    accuracy = [correct / total if total else 0.0 for _, correct, total in per_class]
    ax.barh(range(n), accuracy, color="tab:blue")
    if n <= 100:
        ax.set_yticks(range(n), [name for name, _, _ in per_class])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("accuracy")
    ax.set_title("per-class accuracy")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def report_tables(metrics: dict) -> list[str]:
    """The report tables a recipe's ``metrics:`` asks for."""
    from dlrecipes import registry

    return [name for name in metrics if registry.metrics.get(name).metadata.get("report")]


__all__ = ["ClassReport", "write_report", "report_tables"]
