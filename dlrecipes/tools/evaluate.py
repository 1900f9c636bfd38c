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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from dlrecipes.errors import RecipeError, UserError
from dlrecipes.records.layout import BEST_CHECKPOINT, EVAL_DIR, EVAL_FILE, RECIPE_FILE, RunDir, beside

CHECKPOINT_CHOICES = ("best", "latest")
TTA_CHOICES = ("flip",)


@dataclass
class RunTarget:
    """What ``eval``/``predict``/``export`` were pointed at: the recipe and the checkpoint to use."""

    recipe: Path
    checkpoint: Path
    run_dir: Optional[Path]  # None: a checkpoint file given with --recipe


@dataclass
class EvalResult:
    checkpoint: Path
    metrics: dict[str, float]
    images: int
    seconds: float
    out_dir: Optional[Path]
    overrides: list[str] = field(default_factory=list)
    tta: Optional[str] = None

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": str(self.checkpoint), "metrics": self.metrics, "images": self.images,
                "seconds": self.seconds, "images_per_sec": self.images_per_sec, "overrides": self.overrides,
                "tta": self.tta, "out_dir": str(self.out_dir) if self.out_dir else None}


def find_target(target: str | Path, checkpoint: str = "best", recipe: Optional[str | Path] = None,
                trust: bool = False) -> RunTarget:
    """A run directory (its recipe.yaml and the checkpoint ``checkpoint`` names: best, latest or a path), or a
    checkpoint file (inside a run directory's checkpoints/, or with ``recipe``). ``latest`` is the newest
    periodic checkpoint that loads, read tensors-only unless ``trust``."""
    from dlrecipes.records.checkpoints import resume_point

    target = Path(target)
    run: Optional[RunDir]
    if target.is_dir():
        run_dir, run = target, RunDir(target)
        if not run.is_run():
            raise UserError(f"{target}: not a run directory (no {RECIPE_FILE}); give a run directory such as "
                            "runs/<name>, or a checkpoint file with --recipe")
        folder = run.checkpoints
        if checkpoint == "best":
            path = run.best
            if not path.is_file():
                raise UserError(f"--checkpoint: {run_dir} has no {BEST_CHECKPOINT} (its recipe monitors no metric, "
                                "or it never evaluated); use --checkpoint latest, or a checkpoint file")
        elif checkpoint == "latest":
            path = resume_point(folder, repair=False, trust=trust, key="--checkpoint") if folder.is_dir() else None
            if path is None:
                raise UserError(f"--checkpoint: {run_dir} has no complete periodic checkpoint; use --checkpoint best")
        else:
            path = Path(checkpoint)
            if not path.is_file():
                raise UserError(f"--checkpoint: no checkpoint file at {path}; use best, latest or a .pt file")
    elif target.is_file():
        path, run = target, RunDir.holding(target)
        run_dir = run.path if run is not None else None
    else:
        raise UserError(f"{target}: no such run directory or checkpoint file")
    if recipe is not None:
        recipe_path = Path(recipe)
    elif run is not None:
        recipe_path = run.recipe
    else:
        raise UserError(f"{target}: a checkpoint outside a run directory needs its recipe: add --recipe RECIPE.yaml")
    return RunTarget(recipe_path, path, run_dir)


def _name(target: RunTarget, overrides: Sequence[str], tta: Optional[str]) -> str:
    """The report folder's name: the checkpoint, then the overrides and the TTA, made filesystem-safe."""
    parts = [target.checkpoint.stem, *overrides, *([f"tta-{tta}"] if tta else [])]
    name = re.sub(r"[^A-Za-z0-9._=+-]+", "_", ",".join(parts))
    return name[:120]


def flip_average(network: Any) -> Any:
    """Test-time augmentation: a module whose logits are the mean of ``network``'s for the images and their
    mirror images."""
    import torch
    from torch import nn

    class FlipAverage(nn.Module):
        def __init__(self, net: nn.Module):
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.net(x) + self.net(torch.flip(x, dims=[-1]))) / 2

    return FlipAverage(network)


def trained_model(target: RunTarget, config: Any, trust: bool = False, out_dir: Optional[Path] = None):
    """The run's network with ``target``'s checkpoint weights, in an evaluation Trainer, and the data:
    (trainer, data). ``config``: the run's recipe (with any overrides), validated. The checkpoint (a run's
    own too) is read tensors-only unless ``trust`` (``--trust-checkpoint``): one that holds other Python
    objects is refused before any of it is loaded."""
    from dlrecipes.builders.trainer import build_eval_trainer
    from dlrecipes.core.devices import resolve_device
    from dlrecipes.loggers.terminal import hide_harmless_warnings
    from dlrecipes.records.checkpoints import check_checkpoint

    if config.task is not None:
        raise RecipeError("task: this command works on classifiers with one image input and one label; this "
                          "recipe has a task: section (several inputs/outputs)")
    check_checkpoint(target.checkpoint, trust, key="--checkpoint")
    with warnings.catch_warnings():
        hide_harmless_warnings()
        warnings.filterwarnings("ignore", message="No optimizer was specified")  # none is needed: no step is taken
        try:
            trainer, data = build_eval_trainer(config, target.checkpoint, out_dir or target.checkpoint.parent,
                                               resolve_device(config.trainer.device), trust=trust)
        except RuntimeError as exc:
            if "state_dict" not in str(exc):
                raise
            raise RecipeError(f"--checkpoint: {target.checkpoint} does not fit {target.recipe}'s model "
                              f"({_first_mismatch(str(exc))}); give the recipe it was trained with, or undo the "
                              "model overrides") from None
    return trainer, data


def _first_mismatch(message: str) -> str:
    """The first useful line of torch's ``load_state_dict`` error (which names every mismatching key)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = next((line for line in lines[1:] if line.startswith(("size mismatch", "Missing key", "Unexpected key"))),
                  lines[0] if lines else "")
    return detail[:300]


def evaluate_run(target: RunTarget, config: Any, overrides: Sequence[str] = (), tta: Optional[str] = None,
                 out: Optional[str | Path] = None, trust: bool = False) -> EvalResult:
    """Evaluate ``target``'s checkpoint on ``config``'s evaluation split (the run's recipe with ``overrides``);
    write the report (metrics, confusion matrix, per-class accuracy) to ``out`` or ``RUN_DIR/eval/<name>/``."""
    from composer.utils import dist

    from dlrecipes.loggers.terminal import hide_harmless_warnings
    from dlrecipes.metrics.report import ClassReport, report_tables, write_report
    from dlrecipes.records.run_dir import make_writable_dir

    if tta is not None and tta not in TTA_CHOICES:
        raise RecipeError(f"--tta: expected one of {', '.join(TTA_CHOICES)}, got '{tta}'")
    if out is not None:
        out_dir = Path(out)
    elif target.run_dir is not None:
        out_dir = RunDir(target.run_dir).eval_report(_name(target, overrides, tta))
    else:
        out_dir = beside(target.checkpoint, EVAL_DIR) / _name(target, overrides, tta)
    if out is not None and dist.get_global_rank() == 0:
        make_writable_dir(out_dir)  # before anything is built: an --out that cannot be written is one line
    trainer, data = trained_model(target, config, trust, out_dir)
    with_network = trainer.state.model.module if trainer.state.is_model_ddp else trainer.state.model
    tables = report_tables(config.metrics)
    report = None
    if tables:
        report = ClassReport(out_dir, data.num_classes, data.class_names, tables)
        trainer.state.callbacks.append(report)
    if tta == "flip":
        with_network.module = flip_average(with_network.module)
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


def _eval_size(split: Any, subset_batches: Optional[int], trainer_cfg: Any) -> int:
    try:
        size = len(split)
    except TypeError:
        return 0
    if subset_batches is not None and subset_batches > 0:
        return min(size, subset_batches * (trainer_cfg.eval_batch_size or trainer_cfg.batch_size))
    return size


def format_eval(result: EvalResult, width: Optional[int] = None) -> str:
    """``eval``'s closing line, in train's form: the metrics, images/s and where the report went; in a
    terminal ``width`` wide, a longer line becomes the checkpoint's line and one indented line per part."""
    import textwrap

    metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.metrics.items()))
    tta = f" (tta {result.tta})" if result.tta else ""
    speed = f"{result.images:,} images in {result.seconds:.1f}s ({result.images_per_sec:,.0f} img/s)"
    where = f"report {result.out_dir}" if result.out_dir else ""
    line = f"eval {result.checkpoint}{tta}: {metrics}; {speed}" + (f"; {where}" if where else "")
    if width is None or len(line) <= width - 1:
        return line
    parts = [metrics, speed, *([where] if where else [])]
    return "\n".join([f"eval {result.checkpoint}{tta}:", *(textwrap.fill(
        part, width - 1, initial_indent="  ", subsequent_indent="    ", break_long_words=False,
        break_on_hyphens=False) for part in parts)])


def network_of(trainer: Any) -> Any:
    """The bare network (images in, logits out) inside an evaluation Trainer's model."""
    state = trainer.state
    composer_model = state.model.module if state.is_model_ddp else state.model
    return composer_model.module


__all__ = ["EvalResult", "RunTarget", "evaluate_run", "find_target", "format_eval", "network_of",
           "trained_model"]
