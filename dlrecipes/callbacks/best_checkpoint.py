"""A callback that keeps the best checkpoint by an evaluation metric."""

from __future__ import annotations

import json
import math
from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from dlrecipes.core.outputs import EVAL_LOSS
from dlrecipes.errors import RecipeError
from dlrecipes.records.checkpoints import atomic_write, save_atomically
from dlrecipes.records.layout import BEST_CHECKPOINT, BEST_INFO
from dlrecipes.records.run_files import file_digest


class BestCheckpoint(Callback):
    """After each evaluation, save ``best.pt`` if ``monitor`` improved (and ``best.json`` saying when, with the
    SHA-256 of the best.pt it describes)."""

    def __init__(self, folder: str | Path, monitor: str = "top1", mode: str = "max"):
        self.folder = Path(folder)
        self.monitor = monitor
        self.mode = mode
        self.best: float | None = None
        self.saved_at_batch: int | None = None  # when best.pt was last written (this process's run)

    def _better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best

    def eval_end(self, state: State, logger: Logger) -> None:
        if self.monitor not in state.eval_metric_values:
            known = ", ".join(sorted(state.eval_metric_values)) or "(none)"
            raise RecipeError(f"checkpoint.monitor: no eval metric named '{self.monitor}'; the model logs: {known}")
        value = float(state.eval_metric_values[self.monitor])
        loss = state.eval_metric_values.get(EVAL_LOSS)
        if not self._better(value) or (loss is not None and not math.isfinite(float(loss))):
            return  # nothing better, or an evaluation of a diverged model
        self.best = value
        self.saved_at_batch = int(state.timestamp.batch)
        path = self.folder / BEST_CHECKPOINT
        save_atomically(state, path)
        if dist.get_global_rank() == 0:
            info = {
                "monitor": self.monitor,
                "value": value,
                "epoch": int(state.timestamp.epoch),
                "batch": int(state.timestamp.batch),
                "sha256": file_digest(path),  # the file it describes: readers check them together
            }
            text = (json.dumps(info, indent=2) + "\n").encode()
            atomic_write(self.folder / BEST_INFO, lambda f: f.write(text))
        logger.log_metrics({f"checkpoint/best_{self.monitor}": value})

    def state_dict(self) -> dict:
        return {"best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.best = state.get("best")
