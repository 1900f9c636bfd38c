"""After training: evaluate a run's checkpoint (``dlrecipes eval``), with no training step.

A run directory holds what an evaluation needs: the resolved recipe (``recipe.yaml``) and the
checkpoints (``checkpoints/best.pt``, the periodic ones).  ``key=value`` overrides change what is
evaluated (another dataset or split, ``dataset.eval_crop_size``/``dataset.resize_size`` for
FixRes-style evaluation at another size, ``trainer.eval_batch_size``, ``trainer.device``,
``trainer.precision``); the network and its weights stay the checkpoint's.  Only the model's
weights are loaded: no optimizer state, no schedule, no step.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.after_training.target import RunTarget
from dlrecipes.after_training.trained_model import trained_model
from dlrecipes.errors import RecipeError
from dlrecipes.records.layout import EVAL_DIR, EVAL_FILE, EVAL_NAME_MAX, beside

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from dlrecipes.after_training.opened import Trained
    from dlrecipes.config.sections import RecipeConfig, TrainerConfig

TTA_CHOICES = ("flip", "flip_translate")  # levels 1 and 2 of algorithms.tta


@dataclass
class EvalResult:
    checkpoint: Path
    metrics: dict[str, float]
    images: int
    seconds: float
    out_dir: Path | None
    overrides: list[str] = field(default_factory=list)
    tta: str | None = None

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": str(self.checkpoint),
            "metrics": self.metrics,
            "images": self.images,
            "seconds": self.seconds,
            "images_per_sec": self.images_per_sec,
            "overrides": self.overrides,
            "tta": self.tta,
            "out_dir": str(self.out_dir) if self.out_dir else None,
        }


def _name(target: RunTarget, overrides: Sequence[str], tta: str | None) -> str:
    """The report folder's name: the checkpoint, then the overrides and the TTA, made filesystem-safe."""
    parts = [target.checkpoint.stem, *overrides, *([f"tta-{tta}"] if tta else [])]
    name = re.sub(r"[^A-Za-z0-9._=+-]+", "_", ",".join(parts))
    return name[:EVAL_NAME_MAX]


def _with_tta(config: RecipeConfig, tta: str | None) -> str | None:
    """``--tta`` puts the test-time augmentation it names in the recipe's algorithms (over the recipe's own
    ``tta``, which the evaluation otherwise rebuilds like the training's); returns what the evaluation uses."""
    if tta is not None:
        config.algorithms = {**config.algorithms, "tta": {"level": TTA_CHOICES.index(tta) + 1}}
    level = config.algorithms["tta"].get("level", 2) if "tta" in config.algorithms else 0
    return TTA_CHOICES[level - 1] if level else None


def evaluate_run(trained: Trained, tta: str | None = None, out: str | Path | None = None) -> EvalResult:
    """Evaluate the opened run's checkpoint on its recipe's evaluation split (with the command's overrides); write
    the report (metrics, confusion matrix, per-class accuracy) to ``out`` or ``RUN_DIR/eval/<name>/``."""
    from composer.utils import dist

    from dlrecipes.loggers.terminal import hide_harmless_warnings
    from dlrecipes.metrics.report import ClassReport, report_tables, write_report
    from dlrecipes.records.run_dir import make_writable_dir

    target, config, overrides = trained.found, trained.config, trained.overrides
    if tta is not None and tta not in TTA_CHOICES:
        raise RecipeError(f"--tta: expected one of {', '.join(TTA_CHOICES)}, got '{tta}'")
    tta = _with_tta(config, tta)
    if out is not None:
        out_dir = Path(out)
    elif target.run is not None:
        out_dir = target.run.eval_report(_name(target, overrides, tta))
    else:
        out_dir = beside(target.checkpoint, EVAL_DIR) / _name(target, overrides, tta)
    if out is not None and dist.get_global_rank() == 0:
        make_writable_dir(out_dir)  # before anything is built: an --out that cannot be written is one line
    trainer, data = trained_model(trained)
    tables = report_tables(config.metrics)
    report = None
    if tables:
        report = ClassReport(out_dir, data.num_classes, data.class_names, tables)  # kept here: written below
        trainer.state.callbacks.append(report)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            hide_harmless_warnings()
            trainer.eval()
        seconds = time.perf_counter() - start
        metrics = {k: float(v) for k, v in trainer.state.eval_metric_values.items()}
    finally:
        trainer.close()
    images = _eval_size(data.eval, config.trainer.eval_subset_num_batches, config.trainer)
    result = EvalResult(target.checkpoint, metrics, images, seconds, out_dir, list(overrides), tta)
    if dist.get_global_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        if report is not None and report.kept is not None:
            write_report(out_dir, report.kept, report.class_names, tables)
        (out_dir / EVAL_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def _eval_size(split: Dataset, subset_batches: int | None, trainer_cfg: TrainerConfig) -> int:
    try:
        size = len(split)
    except TypeError:
        return 0
    if subset_batches is not None and subset_batches > 0:
        return min(size, subset_batches * (trainer_cfg.eval_batch_size or trainer_cfg.batch_size))
    return size


__all__ = ["EvalResult", "evaluate_run"]
