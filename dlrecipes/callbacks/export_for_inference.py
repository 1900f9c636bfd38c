"""Export the trained network for inference (TorchScript, ONNX) and check the files against it.

The ``export`` callback (``callbacks: {export: {formats: [torchscript, onnx]}}``) writes, at
the end of training, into ``<run dir>/export/``:

- ``model.torchscript.pt`` (``torch.jit.load``) and/or ``model.onnx`` (batch axis dynamic),
- ``verify.json``: each file run on real eval images next to the trained network,
- ``preprocess.json``: how an image file becomes the input (:mod:`dlrecipes.data.preprocess`),
- ``classes.json``: the class names, in the order of the logits.

``dlrecipes export RUN_DIR`` writes the same directory after training, from a checkpoint.

The files hold the bare network (``ComposerClassifier.module``): images in, logits out, no loss or metrics.  TorchScript
is written by Composer's :func:`composer.utils.export_for_inference` (a deep copy, moved to the CPU, in eval mode;
scripting, tracing if that fails); ONNX by ``torch.onnx.export`` with the TorchScript-based exporter (see
:func:`export_model`).  Composer's own ``ExportForInferenceCallback`` does not fit: it exports the whole ComposerModel
(whose forward takes an ``(images, labels)`` batch), sends the file to a logger's upload destination instead of the run
directory when wandb/MLflow is on, traces on an augmented training batch and sets no dynamic batch axis, and checks
nothing.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist
from torch import nn

from dlrecipes.errors import RecipeError, UserError, first_line
from dlrecipes.records.layout import ExportDir

KEY = "callbacks.export"  # the files' names: dlrecipes.records.layout (ExportDir)


class ExportMismatchError(UserError):
    """An exported file does not compute what the trained network computes."""


def _leave_out(fmt: str, asked_by: str) -> str:
    """How to do without ``fmt``: in the recipe's callback, or on ``dlrecipes export``'s command line."""
    return f"remove '{fmt}' from {KEY}.formats" if asked_by == KEY else f"export without {asked_by} {fmt}"


def require_onnx(asked_by: str = KEY) -> None:
    """Import onnx and onnxruntime, or say how to install them (``asked_by``: the recipe key or the option)."""
    from dlrecipes.callbacks.export_options import ONNX_PACKAGES, missing_onnx_message

    missing = []
    for name in ONNX_PACKAGES:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        if asked_by != KEY:
            raise UserError(
                f"{asked_by} onnx: needs the {' and '.join(missing)} package(s): pip install "
                f"'dlrecipes[onnx]' (or {asked_by} torchscript)"
            )
        raise UserError(missing_onnx_message(missing, KEY))


def export_model(
    module: nn.Module,
    fmt: str,
    path: Path,
    sample: torch.Tensor,
    onnx_opset: int | None = None,
    asked_by: str = KEY,
) -> Path:
    """Write ``module`` as ``fmt`` to ``path`` (tracing on ``sample`` where needed); the module is not changed."""
    from composer.utils import export_for_inference

    if fmt == "onnx":
        require_onnx(asked_by)
    try:
        if fmt == "onnx":
            # Written here rather than through Composer's export_for_inference: from torch 2.9 on,
            # torch.onnx.export defaults to the dynamo exporter (which needs onnxscript and writes the
            # weights beside the file), and Composer cannot ask for the TorchScript-based one.
            network = copy.deepcopy(module).cpu().eval()
            torch.onnx.export(
                network,
                (sample.detach().cpu(),),
                str(path),
                input_names=["input"],
                output_names=["output"],
                dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                opset_version=onnx_opset,
                dynamo=False,
            )
        else:
            export_for_inference(module, fmt, str(path), sample_input=(sample,))
    except Exception as exc:  # an operator the exporter cannot translate: the user can drop this format
        first = first_line(exc, default="")
        raise UserError(
            f"{asked_by}: could not export this model to {fmt} ({type(exc).__name__}: {first}); "
            f"{_leave_out(fmt, asked_by)}"
        ) from exc
    return path


def run_exported(path: Path, fmt: str, inputs: torch.Tensor) -> torch.Tensor:
    """The exported file's outputs on ``inputs``: TorchScript through torch.jit.load, ONNX through onnxruntime."""
    if fmt == "torchscript":
        loaded = torch.jit.load(str(path), map_location="cpu").eval()
        with torch.no_grad():
            return loaded(inputs)
    require_onnx()
    import onnx
    import onnxruntime

    onnx.checker.check_model(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {session.get_inputs()[0].name: inputs.numpy()})
    return torch.from_numpy(output)


def verify_export(
    module: nn.Module, path: Path, fmt: str, inputs: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4
) -> dict[str, Any]:
    """Run ``inputs`` through ``module`` (eval mode, CPU) and the exported file; passed when
    every output satisfies ``|exported - trained| <= atol + rtol * |trained|``."""
    module = module.eval()
    with torch.no_grad():
        expected = module(inputs)
    actual = run_exported(path, fmt, inputs).to(expected.dtype)
    if actual.shape != expected.shape:
        return {
            "format": fmt,
            "file": path.name,
            "max_abs_diff": None,
            "passed": False,
            "problem": f"output shape {list(actual.shape)}, expected {list(expected.shape)}",
        }
    diff = (actual - expected).abs()
    passed = bool((diff <= atol + rtol * expected.abs()).all())  # NaN compares false: a NaN fails
    return {"format": fmt, "file": path.name, "max_abs_diff": float(diff.max()), "passed": passed}


def _verified(results: list[dict[str, Any]], on: str, tolerance: str, passed: bool, out_dir: Path) -> str:
    """The verification line; in a terminal too narrow for it, a line per part (file results, then the folder)."""
    import shutil

    per_file = [f"{r['file']} max |diff| {_diff(r)}" for r in results]
    outcome = "passed" if passed else "FAILED"
    line = f"export: {', '.join(per_file)} vs the trained model on {on} {tolerance}: {outcome}; {out_dir}"
    width = shutil.get_terminal_size().columns if sys.stderr.isatty() else None
    if width is None or len(line) < width:
        return line
    return "\n".join(
        [
            f"export: {outcome} vs the trained model on {on}",
            f"  {tolerance}",
            *(f"  {part}" for part in per_file),
            f"  {out_dir}",
        ]
    )


def export_and_verify(
    module: nn.Module,
    out_dir: Path,
    formats: Sequence[str],
    inputs: torch.Tensor,
    source: str = "eval",
    batch_size: int = 1,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    onnx_opset: int | None = None,
    asked_by: str = KEY,
) -> dict[str, Any]:
    """Export ``module`` in each format to ``out_dir``, verify each file on ``inputs`` and write
    ``verify.json``; a file that disagrees raises :class:`ExportMismatchError` (the files stay).
    ``asked_by``: what errors name, the callback's recipe key or ``dlrecipes export``'s ``--format``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    export = ExportDir(out_dir)
    inputs = inputs.detach().to("cpu").contiguous()
    results = []
    for fmt in formats:
        path = export_model(module, fmt, export.model(fmt), inputs[:batch_size], onnx_opset, asked_by)
        results.append(verify_export(module, path, fmt, inputs, atol, rtol))
    report = {
        "passed": all(r["passed"] for r in results),
        "inputs": {"source": source, "shape": list(inputs.shape)},
        "traced_batch_size": min(batch_size, len(inputs)),
        "atol": atol,
        "rtol": rtol,
        "results": results,
    }
    export.report.write_text(json.dumps(report, indent=2) + "\n")
    on = f"{len(inputs)} {source} images"
    print(_verified(results, on, f"(atol {atol:g}, rtol {rtol:g})", report["passed"], out_dir), file=sys.stderr)
    for r in results:
        if not r["passed"]:
            why = r.get("problem") or f"max |diff| {_diff(r)} on {on} exceeds atol={atol:g}, rtol={rtol:g}"
            loosen = f"Loosen {KEY}.atol/rtol if that is acceptable, or " if asked_by == KEY else ""
            raise ExportMismatchError(
                f"{asked_by}: the {r['format']} export {out_dir / r['file']} disagrees with the trained model: {why} "
                f"(details in {export.report}). {loosen}{_leave_out(r['format'], asked_by)}"
            )
    return report


def write_export_metadata(
    out_dir: Path, preprocess: dict[str, Any] | None, class_names: Sequence[str] | None, num_classes: int
) -> None:
    """``preprocess.json`` (when the data are image files) and ``classes.json`` beside the exported model."""
    export = ExportDir(out_dir)
    export.path.mkdir(parents=True, exist_ok=True)
    if preprocess is not None:
        export.preprocess.write_text(json.dumps(preprocess, indent=2) + "\n")
    names = list(class_names or [])
    if len(names) != num_classes:
        names = [str(i) for i in range(num_classes)]
    export.classes.write_text(json.dumps(names, indent=2) + "\n")


def _diff(result: dict[str, Any]) -> str:
    return "n/a" if result["max_abs_diff"] is None else f"{result['max_abs_diff']:.3g}"


class ExportForInference(Callback):
    """At the end of training: export the network, verify the files on eval images (rank 0 only).

    The verification inputs are the first ``verify_batch_size`` images of the first eval
    batch (a training batch if no evaluation ran); the export traces on ``batch_size`` of
    them, so checking the larger batch also checks the dynamic batch axis.  With Composer's
    EMA algorithm the averaged weights are exported, as evaluation uses them.
    """

    def __init__(
        self,
        out_dir: Path,
        formats: Sequence[str],
        *,
        batch_size: int,
        verify_batch_size: int,
        atol: float,
        rtol: float,
        onnx_opset: int | None,
        trial: bool,
    ):
        """The parameters (and their defaults) are the ``export`` factory's in :mod:`dlrecipes.callbacks`."""
        self.out_dir = Path(out_dir)
        self.trial = trial  # export once at the first batch too, to fail before training
        self.formats = tuple(formats)
        self.batch_size = batch_size
        self.verify_batch_size = verify_batch_size
        self.atol, self.rtol, self.onnx_opset = atol, rtol, onnx_opset
        self._inputs: dict[str, torch.Tensor] = {}  # "eval" / "train" -> images kept for the check
        self.report: dict[str, Any] | None = None
        # set by the builder from the data: written beside the model
        self.preprocess: dict[str, Any] | None = None
        self.class_names: Sequence[str] | None = None
        self.num_classes = 0

    def fit_start(self, state: State, logger: Logger) -> None:
        # refuse before training, not after it
        from composer.models import ComposerClassifier

        model = state.model.module if state.is_model_ddp else state.model
        if not isinstance(model, ComposerClassifier):
            raise RecipeError(
                f"{KEY}: exports a classifier with one image input and one logits output; this run trains "
                f"a {type(model).__name__} (a task with several inputs/outputs?). Remove {KEY}"
            )
        if state.fsdp_enabled:
            raise RecipeError(
                f"{KEY}: cannot export an FSDP-sharded model (it cannot be copied); train without trainer.fsdp "
                f"or remove {KEY}"
            )
        if "onnx" in self.formats:
            require_onnx()
        self._network = model.module  # read by the trial export (exports work on copies)

    def before_forward(self, state: State, logger: Logger) -> None:
        if not self._inputs:  # a fallback for runs that never evaluate
            self._keep("train", state)
            if self.trial and dist.get_global_rank() == 0 and "train" in self._inputs:
                self._trial_export()

    def _trial_export(self) -> None:
        """Export the network once at the first batch: an operator a format cannot take fails now, not after
        training."""
        import tempfile

        network = copy.deepcopy(self._network).to("cpu").eval()
        with tempfile.TemporaryDirectory(prefix="dlrecipes-export-trial-") as tmp:
            for fmt in self.formats:
                export_model(
                    network, fmt, ExportDir(tmp).model(fmt), self._inputs["train"][: self.batch_size], self.onnx_opset
                )

    def eval_before_forward(self, state: State, logger: Logger) -> None:
        if "eval" not in self._inputs:
            self._keep("eval", state)

    def _keep(self, source: str, state: State) -> None:
        images = state.batch_get_item(0)
        if isinstance(images, torch.Tensor):
            images = images[: self.verify_batch_size].detach().to("cpu", copy=True).contiguous()
            self._inputs[source] = images.float() if images.is_floating_point() else images

    def fit_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        source = "eval" if "eval" in self._inputs else "train"
        if source not in self._inputs:  # Composer refuses to fit for zero batches, so this is a safeguard
            raise UserError(f"{KEY}: no batch was seen during training, so there is nothing to check the export on")
        self.report = export_and_verify(
            trained_network(state),
            self.out_dir,
            self.formats,
            self._inputs[source],
            source,
            self.batch_size,
            self.atol,
            self.rtol,
            self.onnx_opset,
        )
        write_export_metadata(self.out_dir, self.preprocess, self.class_names, self.num_classes)
        logger.log_metrics(
            {
                f"export/{r['format']}/max_abs_diff": r["max_abs_diff"]
                for r in self.report["results"]
                if r["max_abs_diff"] is not None
            }
        )


def trained_network(state: State) -> nn.Module:
    """A CPU copy, in eval mode, of the network inside the trained ComposerModel (training is not disturbed)."""
    from composer.algorithms import EMA

    composer_model = state.model.module if state.is_model_ddp else state.model
    composer_model = copy.deepcopy(composer_model)
    for algorithm in state.algorithms:
        if isinstance(algorithm, EMA) and algorithm.ema_started and not algorithm.ema_weights_active:
            algorithm.get_ema_model(composer_model)  # the copy takes the averaged weights evaluation uses
    network = getattr(composer_model, "module", composer_model)
    return network.to("cpu").eval()
