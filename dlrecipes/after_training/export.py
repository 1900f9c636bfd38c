"""After training: export a run's checkpoint for inference (``dlrecipes export``).

The same export and the same checks as the ``export`` callback (:mod:`dlrecipes.callbacks.export_for_inference`):
TorchScript and/or ONNX files, each run on real evaluation images next to the trained network
(``verify.json``), with ``preprocess.json`` and ``classes.json`` beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.after_training.trained_model import network_of, trained_model
from dlrecipes.errors import RecipeError

if TYPE_CHECKING:
    import torch

    from dlrecipes.after_training.opened import Trained
    from dlrecipes.engine.trainer import Trainer


def first_eval_images(trainer: Trainer, count: int) -> torch.Tensor:
    """The first ``count`` images of the evaluation split, as the network receives them (on the CPU)."""
    spec = trainer.state.evaluators[0].dataloader  # a Composer DataSpec: its transforms finish the batch
    for batch in spec.dataloader:
        batch = spec.microbatch_transforms(spec.batch_transforms(trainer.state.device.batch_to_device(batch)))
        return batch[0][:count].detach().to("cpu").float().contiguous()
    raise RecipeError("dataset: the evaluation split is empty: there are no images to check the export on")


def export_run(
    trained: Trained,
    formats: Sequence[str] = ("torchscript",),
    out: str | Path | None = None,
    verify_batch_size: int = 8,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> dict[str, Any]:
    """Export the opened run's checkpoint in ``formats`` to ``out`` (default ``RUN_DIR/export``); returns the
    verification report (``verify.json``) with ``out_dir`` added."""
    import copy

    from dlrecipes.callbacks.export_for_inference import export_and_verify, require_onnx, write_export_metadata
    from dlrecipes.callbacks.export_options import EXPORT_FORMATS
    from dlrecipes.records.layout import EXPORT_DIR, beside
    from dlrecipes.records.run_dir import make_writable_dir

    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown or not formats:
        raise RecipeError(
            f"--format: expected {' or '.join(EXPORT_FORMATS)} (repeatable), got {', '.join(unknown) or 'none'}"
        )
    if "onnx" in formats:
        require_onnx("--format")
    target = trained.found
    if out is not None:
        out_dir = Path(out)
    elif target.run is not None:
        out_dir = target.run.exports
    else:
        out_dir = beside(target.checkpoint, EXPORT_DIR)
    existed = out_dir.exists()
    make_writable_dir(out_dir)  # before anything is built: an --out that cannot be written is one line
    try:
        trainer, data = trained_model(trained)
        try:
            network = copy.deepcopy(network_of(trainer)).to("cpu").eval()
            inputs = first_eval_images(trainer, verify_batch_size)
        finally:
            trainer.close()
        report = export_and_verify(
            network, out_dir, list(dict.fromkeys(formats)), inputs, "eval", 1, atol, rtol, asked_by="--format"
        )
    except BaseException:  # refused (a damaged checkpoint, ...): the folder made for it does not stay behind, empty
        if not existed and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    write_export_metadata(out_dir, data.preprocess, data.class_names, data.num_classes)
    return {**report, "out_dir": str(out_dir), "checkpoint": str(target.checkpoint)}


__all__ = ["export_run", "first_eval_images"]
