"""Every run's record: ``history.csv`` (one row per epoch), ``summary.json`` and PNG plots.

:class:`RunHistory` is added to every run.  It keeps the per-batch training loss on the
device (no synchronisation per batch) and writes a row after each epoch's evaluation;
at the end it writes the summary that ``dlrecipes compare`` reads and draws the plots.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from dlrecipes.core.devices import gpu_available, on_gpu
from dlrecipes.core.secrets import redact
from dlrecipes.records.layout import RunDir

HISTORY_COLUMNS = (
    "epoch",
    "step",
    "lr",
    "train_loss",
    "eval_loss",
    "eval_top1",
    "eval_top5",
    "images_per_sec",
    "elapsed_sec",
)
# Multi-output models (a recipe's task:) add a column per output after these: train_<output>/loss
# (its unweighted training loss) and eval_<output>/<metric>; train_loss and eval_loss are the weighted totals.
_STANDARD_EVAL_METRICS = ("loss", "top1", "top5")


def higher_is_better(metric: str) -> bool:
    """Losses and errors shrink, scores grow (``digit/loss``, ``value/mse`` vs ``digit/top1``, ``macro_f1``)."""
    return metric.rsplit("/", 1)[-1] not in ("loss", "mse", "mae")


def peak_memory_mb(device: str) -> float:
    """Peak CUDA memory allocated (GPU) or the process's peak resident memory (CPU), in MiB."""
    if on_gpu(device) and gpu_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class RunHistory(Callback):
    def __init__(
        self,
        run_dir: Path | RunDir,
        recipe: dict[str, Any],
        device: str,
        plots: bool = True,
        provenance: dict[str, Any] | None = None,
    ):
        self.run = RunDir(run_dir)  # where each of the run's files goes
        self.run_dir = self.run.path
        self.provenance = provenance or {}  # what made the run (records.provenance), in summary.json
        self.plots = plots  # loss.png, accuracy.png and lr.png at the end
        self.recipe = recipe
        self.device = device
        self.rows: list[dict[str, Any]] = []
        self._loss_sum: torch.Tensor | None = None
        self._output_loss_sums: dict[str, torch.Tensor] = {}  # per output, for multi-output models
        self._loss_batches = 0
        self._sample_start = 0
        self._state: State | None = None  # the run's, read when a checkpoint asks for state_dict()
        self._resumed_epoch: dict[str, Any] | None = None  # the first part of an epoch a checkpoint cut
        self._train_seconds = 0.0
        self._epoch_start = 0.0
        self._fit_start = time.perf_counter()
        self._elapsed_before = 0.0  # from an earlier (resumed) part of the run
        self._closed = False
        self._evaluated = False  # an evaluation since the last row (a row never repeats an earlier one's)
        self.status = "finished"  # how the run ended (dlrecipes.fit sets it when training raises)
        self.reason = ""
        self.wall_time_sec: float | None = None  # the run's time, set at close: summary.json's and the done line's

    @property
    def path(self) -> Path:
        return self.run.history

    def fit_start(self, state: State, logger: Logger) -> None:
        self._fit_start, self._state = time.perf_counter(), state
        self._say_if_the_order_changes(state)
        # a resumed run starts inside an epoch without EPOCH_START: its first row counts from here
        self._epoch_start, self._sample_start = self._fit_start, int(state.timestamp.sample)
        part, self._resumed_epoch = self._resumed_epoch, None
        if part and part["step"] == int(state.timestamp.batch) and int(state.timestamp.batch_in_epoch) > 0:
            # resumed inside an epoch: its row covers the whole epoch, the batches before the stop included
            on_device = lambda value: state.device.tensor_to_device(torch.tensor(value))  # noqa: E731
            self._loss_sum = on_device(part["loss_sum"]) if part["loss_sum"] is not None else None
            self._loss_batches = part["loss_batches"]
            self._output_loss_sums = {k: on_device(v) for k, v in part["output_loss_sums"].items()}
            self._epoch_start -= part["seconds"]
            self._sample_start -= part["samples"]
        if self.path.exists() and int(state.timestamp.batch) > 0:  # resumed: keep the rows already written
            with open(self.path) as f:
                # rows up to the start of the epoch it resumes in (a run that ended inside this epoch wrote a row
                # for its part of it: the finished epoch's row replaces it)
                epoch_began = int(state.timestamp.batch) - int(state.timestamp.batch_in_epoch)
                self.rows = [r for r in csv.DictReader(f) if int(r["step"]) <= epoch_began]
            if part and part["step"] == int(state.timestamp.batch):
                self._elapsed_before = part["elapsed"]  # the run's time up to its checkpoint
            elif self.rows:
                self._elapsed_before = float(self.rows[-1]["elapsed_sec"])

    def epoch_start(self, state: State, logger: Logger) -> None:
        self._epoch_start = time.perf_counter()
        self._sample_start = int(state.timestamp.sample)  # Composer counts samples over all ranks

    def batch_end(self, state: State, logger: Logger) -> None:
        loss = state.loss
        if isinstance(loss, dict):  # a multi-output model: its outputs' losses and their weighted "total"
            for name, value in loss.items():
                if name != "total" and isinstance(value, torch.Tensor):
                    value = value.detach().float()
                    previous = self._output_loss_sums.get(name)
                    self._output_loss_sums[name] = value if previous is None else previous + value
            loss = loss["total"] if "total" in loss else sum(loss.values())
        if isinstance(loss, (list, tuple)):
            loss = sum(loss)
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float()
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._loss_batches += 1

    def state_dict(self) -> dict[str, Any]:
        """The epoch so far, for a checkpoint written inside it (a signal's, or one every N batches): the resumed
        run's row for that epoch then has the mean loss and the rate of all its batches, not only the last ones."""
        timestamp = self._state.timestamp if self._state is not None else None
        return {
            "step": int(timestamp.batch) if timestamp is not None else -1,
            "loss_sum": None if self._loss_sum is None else float(self._loss_sum.sum()),
            "loss_batches": self._loss_batches,
            "output_loss_sums": {k: float(v.sum()) for k, v in self._output_loss_sums.items()},
            "seconds": time.perf_counter() - self._epoch_start,
            "samples": int(timestamp.sample) - self._sample_start if timestamp is not None else 0,
            "elapsed": self._elapsed_before + time.perf_counter() - self._fit_start,
            "world_size": dist.get_world_size(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resumed_epoch = dict(state) if state.get("loss_batches") else None  # used by fit_start
        self._trained_on = state.get("world_size")

    _trained_on = None  # processes the checkpoint's run trained on (None: not resumed, or not recorded)

    def _say_if_the_order_changes(self, state: State) -> None:
        """One line, before a resumed run trains, where its loader cannot continue the order on this number of
        processes (the torch loader's global order can: its dataset resumes itself, Composer's dataset_resumption)."""
        world = dist.get_world_size()
        if self._trained_on in (None, world) or state.dataset_resumption.get("train") or dist.get_global_rank():
            return
        t, name = self.recipe.get("trainer", {}), self.recipe.get("dataset", {}).get("name")
        loader = "FFCV's loader" if name == "ffcv" else f"trainer.loader={t.get('loader', 'torch')}"
        other = "" if name == "ffcv" else " (trainer.loader=torch continues on any number)"
        print(
            f"note: this run trained on {self._trained_on} processes and resumes on {world}: {loader} orders "
            f"samples by process, so from here they differ from an uninterrupted run's (in the resumed epoch some "
            f"repeat or are left out); resume on {self._trained_on} processes to continue exactly{other}",
            flush=True,
        )

    def epoch_end(self, state: State, logger: Logger) -> None:
        self._train_seconds = time.perf_counter() - self._epoch_start

    def eval_end(self, state: State, logger: Logger) -> None:
        self._evaluated = True

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        self._add_row(state)

    def epoch_images_per_sec(self, state: State) -> float:
        """The training rate of the epoch that just ended, as history.csv records it: over the whole epoch, also
        when the run resumed inside it (the part before the checkpoint counted from its own time)."""
        samples = int(state.timestamp.sample) - self._sample_start
        return samples / self._train_seconds if samples and self._train_seconds else math.nan

    def epoch_train_seconds(self) -> float:
        """The training time of the epoch that just ended (its part before a resume included)."""
        return self._train_seconds

    def epoch_train_loss(self, step: int) -> float | None:
        """The mean training loss of the epoch that ends at ``step`` (read once; what history.csv records)."""
        if self.rows and int(self.rows[-1]["step"]) == step:
            return float(self.rows[-1]["train_loss"])
        if self._loss_batches and self._loss_sum is not None:
            return (self._loss_sum / self._loss_batches).item()
        return None

    def _add_row(self, state: State) -> None:
        if self._loss_batches == 0:
            return
        metrics = state.eval_metric_values if self._evaluated else {}  # no evaluation since the last row: none
        lr = run_lr(state)
        lr = float("nan") if lr is None else lr
        row = {
            "epoch": int(state.timestamp.epoch),
            "step": int(state.timestamp.batch),
            "lr": lr,
            **group_lrs(state),
            "train_loss": (self._loss_sum / self._loss_batches).item(),
            "eval_loss": float(metrics.get("loss", math.nan)),
            "eval_top1": float(metrics.get("top1", math.nan)),
            "eval_top5": float(metrics.get("top5", math.nan)),
            "images_per_sec": self.epoch_images_per_sec(state),
            "elapsed_sec": self._elapsed_before + time.perf_counter() - self._fit_start,
        }
        for name, total in self._output_loss_sums.items():
            row[f"train_{name}/loss"] = (total / self._loss_batches).item()
        for name, value in metrics.items():
            if name not in _STANDARD_EVAL_METRICS:
                row[f"eval_{name}"] = float(value)
        self.rows.append(row)
        self._loss_sum, self._loss_batches, self._output_loss_sums = None, 0, {}
        self._evaluated = False
        if dist.get_global_rank() == 0:
            self.write_csv()

    def write_csv(self) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns())
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.path)

    def columns(self) -> list[str]:
        """The standard columns, then those of multi-output models in the order they first appeared."""
        columns = list(HISTORY_COLUMNS)
        for row in self.rows:
            columns += [key for key in row if key not in columns]
        return columns

    def close(self, state: State, logger: Logger) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loss_batches and self.status == "finished":
            # a run that ended inside an epoch (max_duration in batches). A stopped or failed one gets no row for
            # its unfinished epoch: --resume trains that epoch again and writes its row once.
            self._train_seconds = time.perf_counter() - self._epoch_start
            self._add_row(state)
        self.wall_time_sec = self._wall_time()
        if dist.get_global_rank() != 0 or (not self.rows and self.status == "finished"):
            return
        self.write_summary(state)  # also for a run stopped or failed in its first epoch: it says how it ended
        from dlrecipes.records.plots import plot_history

        if self.rows and self.plots:
            plot_history(self.run_dir)

    def _wall_time(self) -> float:
        """The run's time, its earlier (resumed) parts included: at its last row, or now without a row. A resume
        of a finished run trains nothing: its time is the one history.csv already has."""
        if self._state is None and self.path.exists():  # never started: nothing was left to train
            with open(self.path) as f:
                rows = list(csv.DictReader(f))
            if rows:
                return float(rows[-1]["elapsed_sec"])
        if self.rows:
            return float(self.rows[-1]["elapsed_sec"])
        return self._elapsed_before + time.perf_counter() - self._fit_start

    def write_summary(self, state: State) -> None:
        top1 = [float(r["eval_top1"]) for r in self.rows if not math.isnan(float(r["eval_top1"]))]
        rates = [float(r["images_per_sec"]) for r in self.rows if not math.isnan(float(r["images_per_sec"]))]
        t = self.recipe.get("trainer", {})
        summary = {
            "status": self.status,  # finished, stopped (a signal; --resume continues it), diverged or failed
            **({"reason": self.reason} if self.reason else {}),
            "recipe": self.recipe.get("name"),
            "run": self.run_dir.name,
            "model": self.recipe.get("model", {}).get("name"),
            "dataset": self.recipe.get("dataset", {}).get("name"),
            "precision": t.get("precision"),
            "batch_size": t.get("batch_size"),
            "microbatch": t.get("device_train_microbatch_size"),
            "device": self.device,
            "world_size": dist.get_world_size(),
            "epochs": int(state.timestamp.epoch),
            "batches": int(state.timestamp.batch),
            "wall_time_sec": self.wall_time_sec if self.wall_time_sec is not None else self._wall_time(),
            "images_per_sec": sum(rates) / len(rates) if rates else None,
            "peak_memory_mb": peak_memory_mb(self.device),
            "best_top1": max(top1) if top1 else None,
            "final_top1": top1[-1] if top1 else None,
            **({"provenance": self.provenance} if self.provenance else {}),
        }
        per_output = [c for c in self.columns() if c.startswith("eval_") and c not in HISTORY_COLUMNS]
        if per_output:  # multi-output models: best and final value of every eval_<output>/<metric>
            best, final = {}, {}
            for column in per_output:
                values = [float(r[column]) for r in self.rows if r.get(column) not in (None, "")]
                values = [v for v in values if not math.isnan(v)]
                if values:
                    name = column.removeprefix("eval_")
                    best[name] = max(values) if higher_is_better(name) else min(values)
                    final[name] = values[-1]
            summary["best_metrics"], summary["final_metrics"] = best, final
        from dlrecipes.records.checkpoints import atomic_write

        text = (
            json.dumps(redact(summary), indent=2) + "\n"
        ).encode()  # whole or absent: `dlrecipes runs` reads it any time
        atomic_write(self.run.summary, lambda f: f.write(text))


def run_lr(state: State) -> float | None:
    """The learning rate a run shows on the terminal and records in history.csv: that of the parameters trained at
    the recipe's ``optimizer.lr`` (the group whose starting rate is the optimizer's own), as scheduled now. Other
    groups run at multiples of it (norm and bias scaling, ``finetune.head_lr``); the last group stands in where
    none starts at the optimizer's rate."""
    if not state.optimizers:
        return None
    optimizer = state.optimizers[0]
    base, groups = optimizer.defaults.get("lr"), optimizer.param_groups
    group = next((g for g in groups if float(g.get("initial_lr", g["lr"])) == float(base)), None) if base else None
    return float((group or groups[-1])["lr"])


def group_lrs(state: State) -> dict[str, float]:
    """The rate of each parameter group that does not train at the rate ``lr`` shows (``finetune.head_lr``, layer-wise
    decay, ``optimizer.norm_lr_scale``), as scheduled now, under ``lr/<the group's name>`` (history.csv's columns
    after ``lr``); empty when every group trains at that rate."""
    if not state.optimizers:
        return {}
    groups, shown = state.optimizers[0].param_groups, run_lr(state)
    rates: dict[str, float] = {}
    for index, group in enumerate(groups):
        if float(group["lr"]) != shown:
            rates.setdefault(f"lr/{group_name(group, index)}", float(group["lr"]))
    return rates


def group_name(group: dict, index: int) -> str:
    """A parameter group's name from what made it: ``head`` (``finetune.head_lr``), ``block<N>`` (layer-wise decay's
    block N, input first), ``norms`` (batch norms' scaled rate), ``muon``; joined by ``-`` where several made it;
    ``group<index>`` where none did."""
    parts = [
        *(["head"] if group.get("finetune_head") else []),
        *([f"block{group['layerwise_block']}"] if "layerwise_block" in group else []),
        *(["norms"] if group.get("norms") else []),
        *(["muon"] if group.get("use_muon") else []),
    ]
    return "-".join(parts) or f"group{index}"
