"""After training: the classes of image files (``dlrecipes predict``).

From a run directory (or a checkpoint), the recipe's network with the checkpoint's weights runs on
the device the recipe would train on; from an export directory (``model.torchscript.pt`` or
``model.onnx`` with ``preprocess.json`` and ``classes.json``) no recipe code is needed, and ONNX
runs with onnxruntime (the ``onnx`` extra).  Either way each file goes through the evaluation
preprocessing (:mod:`dlrecipes.data.preprocess`), in batches.  A file that cannot be read (missing,
not an image, truncated, too large to decode safely) is named with the reason and skipped; the rows
come back as :class:`Predictions`, which also hold the skipped files, and when none could be read
that is a :class:`~dlrecipes.errors.UserError`.  A damaged export directory (a model file that does
not load, ``preprocess.json`` or ``classes.json`` that is not valid JSON or not of the expected
shape) is one error naming the file.
"""

from __future__ import annotations

import csv
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.errors import RecipeError, UserError, first_line
from dlrecipes.records.layout import CLASSES_FILE, EXPORTED_MODELS, PREPROCESS_FILE, ExportDir

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch.utils.data import Dataset

    from dlrecipes.after_training.opened import Trained


Predictor = tuple[
    Callable[["np.ndarray"], "np.ndarray"], dict[str, Any], list[str]
]  # logits of a batch, preprocessing, class names
AGAIN = "export again with dlrecipes export RUN_DIR"


class Predictions(list):
    """The rows of the files predicted (a list: JSON prints it as one) and ``skipped``: (path, reason) of each
    file that could not be read."""

    def __init__(self, rows: Sequence[dict[str, Any]] = (), skipped: Sequence[tuple[Path, str]] = ()):
        super().__init__(rows)
        self.skipped = list(skipped)

    def counted(self) -> str:
        return f"{len(self)} predicted, {len(self.skipped)} skipped"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path.parent}: an export directory needs {PREPROCESS_FILE} and {CLASSES_FILE}; {path.name} "
            f"is missing ({AGAIN})"
        ) from None
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); {AGAIN}"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable, or not text
        raise UserError(f"{path}: cannot be read as JSON text ({_first_line(exc)}); {AGAIN}") from None


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = first_line(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def export_predictor(folder: Path) -> Predictor:
    """(logits of a float32 NCHW array batch, preprocess spec, class names) of an export directory."""

    from dlrecipes.data.preprocess import spec_problem
    from dlrecipes.errors import shown

    export = ExportDir(folder)
    spec = _read_json(export.preprocess)
    problem = spec_problem(spec)
    if problem:
        raise UserError(f"{export.preprocess}: {problem}; {AGAIN}")
    classes = _read_json(export.classes)
    if not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)):
        raise UserError(
            f"{export.classes}: expected a list of class names (strings) in logit order, got {shown(classes)}; {AGAIN}"
        )
    if export.model("torchscript").is_file():
        import torch

        path = export.model("torchscript")
        try:
            with warnings.catch_warnings():  # torch >= 2.10 deprecates TorchScript loudly; the export is TorchScript
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated", category=FutureWarning)
                module = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as exc:  # truncated, not a TorchScript archive, not a file torch can read
            raise UserError(f"{path}: not a TorchScript model torch can load ({_first_line(exc)}); {AGAIN}") from None

        def run(batch: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return module(torch.from_numpy(batch)).numpy()

        return _checked(run, path, classes), spec, classes
    if export.model("onnx").is_file():
        path = export.model("onnx")
        try:
            import onnxruntime
        except ImportError:
            raise UserError(f"{path}: running ONNX needs onnxruntime: pip install 'dlrecipes[onnx]'") from None
        try:
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own errors (invalid protobuf, a graph it cannot run)
            raise UserError(f"{path}: not an ONNX model onnxruntime can load ({_first_line(exc)}); {AGAIN}") from None
        name = session.get_inputs()[0].name
        return _checked(lambda batch: session.run(None, {name: batch})[0], path, classes), spec, classes
    raise UserError(f"{folder}: no {' or '.join(EXPORTED_MODELS.values())} in this export directory ({AGAIN})")


def _checked(run: Callable[[np.ndarray], Any], path: Path, classes: list[str]) -> Callable[[np.ndarray], np.ndarray]:
    """``run``, failing with one line naming the model file when the model does not take the batch
    ``preprocess.json`` makes, or gives another number of classes than ``classes.json`` names."""
    import numpy as np

    def checked(batch: np.ndarray) -> np.ndarray:
        try:
            logits = np.asarray(run(batch))
        except Exception as exc:  # the model's own error, from torch or onnxruntime
            raise UserError(
                f"{path}: failed on a batch of shape {list(batch.shape)} made as {PREPROCESS_FILE} "
                f"says ({_first_line(exc)}); {AGAIN}"
            ) from None
        if logits.ndim != 2 or logits.shape[1] != len(classes):
            raise UserError(
                f"{path}: gives logits of shape {list(logits.shape)} for {len(batch)} image(s), but "
                f"{CLASSES_FILE} names {len(classes)} classes; {AGAIN}"
            )
        return logits

    return checked


def run_predictor(trained: Trained, files: bool = True) -> Predictor:
    """The same for a run's checkpoint (opened by :func:`~.opened.open_trained`): its recipe's network on the
    recipe's device.  ``files=False``: for tensors given as they are (no image file to prepare)."""
    import torch

    from dlrecipes.after_training.trained_model import network_of, trained_model

    trainer, data = trained_model(trained)
    network = network_of(trainer).eval()
    trainer.close()
    if data.preprocess is None and files:
        raise RecipeError(
            f"dataset.name: {trained.found.recipe}'s dataset has no image files to mirror (its inputs are not "
            "images read from files), so predict cannot prepare image files for it (from Python, "
            "predict tensors with inputs=)"
        )
    device = next(network.parameters()).device
    names = list(data.class_names or [])
    if len(names) != data.num_classes:
        names = [str(i) for i in range(data.num_classes)]

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return network(torch.from_numpy(batch).to(device)).float().cpu().numpy()

    return run, data.preprocess, names


def check_options(top_k: int, batch_size: int) -> None:
    if top_k < 1:
        raise RecipeError(f"--top-k: must be at least 1, got {top_k}")
    if batch_size < 1:
        raise RecipeError(f"--batch-size: must be at least 1, got {batch_size}")


def predict_files(
    predictor: Predictor,
    files: Sequence[str | Path],
    top_k: int = 5,
    out: str | Path | None = None,
    batch_size: int = 64,
) -> Predictions:
    """One row per readable file: ``path``, ``class``, ``probability`` and the ``top`` k (class, probability)
    pairs; written to ``out`` as CSV when given.  Each file that cannot be read is named on standard error with
    the reason, and skipped; none readable is a :class:`UserError`."""
    import numpy as np

    from dlrecipes.data.preprocess import image_files, load_image

    check_options(top_k, batch_size)
    if out is not None:
        check_out(Path(out))
    run, spec, classes = predictor
    paths = image_files(files)
    if not paths:
        raise UserError(
            f"FILES: no image files in {', '.join(map(str, files))} (looked for "
            ".jpg .jpeg .png .bmp .gif .webp .tif .tiff .ppm .pgm)"
        )
    k = min(top_k, len(classes))
    read_errors = _read_errors()
    result = Predictions()
    for start in range(0, len(paths), batch_size):
        arrays, kept = [], []
        for path in paths[start : start + batch_size]:
            try:
                arrays.append(load_image(path, spec))
                kept.append(path)
            except read_errors as exc:
                result.skipped.append((path, unreadable(path, exc)))
                print(f"warning: skipping {path}: {result.skipped[-1][1]}", file=sys.stderr)
        if not arrays:
            continue
        logits = np.asarray(run(np.stack(arrays)), dtype=np.float64)
        result.extend(_ranked(logits, classes, k, path=[str(p) for p in kept]))
    if not result:
        raise UserError(f"{result.counted()}: no file could be read (each is named above)")
    if out is not None:
        write_csv(result, Path(out), k)
    return result


def _ranked(logits: np.ndarray, classes: list[str], k: int, **columns: list[Any]) -> list[dict[str, Any]]:
    """One row per logit vector: ``columns``' values, the class, its probability and the ``top`` k."""
    import numpy as np

    logits = logits - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    rows = []
    for i, p in enumerate(probabilities):
        top = [(classes[j], float(p[j])) for j in np.argsort(-p, kind="stable")[:k]]
        rows.append(
            {
                **{name: values[i] for name, values in columns.items()},
                "class": top[0][0],
                "probability": top[0][1],
                "top": top,
            }
        )
    return rows


def predict_inputs(
    predictor: Predictor, inputs: torch.Tensor | Dataset, top_k: int = 5, batch_size: int = 64
) -> Predictions:
    """One row per input (``index``, ``class``, ``probability``, ``top``): ``inputs`` a batch tensor (N, C, H, W)
    or a Dataset of ``(input, label)`` samples, as the network takes them (no preprocessing)."""
    import numpy as np
    import torch

    check_options(top_k, batch_size)
    run, _, classes = predictor
    if isinstance(inputs, torch.Tensor):
        samples = list(inputs)
    else:
        samples = [
            item[0] if isinstance(item, (tuple, list)) else item for item in (inputs[i] for i in range(len(inputs)))
        ]
    if not samples:
        raise UserError("inputs: nothing to predict (an empty batch or dataset)")
    result = Predictions()
    k = min(top_k, len(classes))
    for start in range(0, len(samples), batch_size):
        batch = torch.stack([torch.as_tensor(s) for s in samples[start : start + batch_size]]).float().numpy()
        logits = np.asarray(run(batch), dtype=np.float64)
        result.extend(_ranked(logits, classes, k, index=list(range(start, start + len(batch)))))
    return result


def _read_errors() -> tuple[type[BaseException], ...]:
    import struct

    from PIL import Image

    # OSError: missing, unreadable, not an image, truncated; the others: what Pillow's decoders raise on a
    # damaged file; the decompression-bomb pair: an image too large to decode safely
    return (
        OSError,
        ValueError,
        SyntaxError,
        EOFError,
        struct.error,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    )


def unreadable(path: Path, exc: BaseException) -> str:
    """Why ``path`` could not be read, in a few words (the path itself is said by the caller)."""
    from PIL import Image, UnidentifiedImageError

    from dlrecipes.errors import did_you_mean

    if isinstance(exc, FileNotFoundError):
        folder = path.parent
        if not folder.is_dir():
            return f"no such file (and no folder {folder})"
        return "no such file" + did_you_mean(path.name, [p.name for p in folder.iterdir()])
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, UnidentifiedImageError):
        return "not an image file Pillow can read"
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        size = str(exc).split(", could be")[0]
        return (
            f"too large to decode safely ({size[:1].lower() + size[1:]}: Pillow's decompression-bomb limit, "
            "PIL.Image.MAX_IMAGE_PIXELS)"
        )
    text = _first_line(exc).replace(f"'{path}'", "").replace(str(path), "").strip(" :")
    return text.split(" (")[0] if isinstance(exc, OSError) and text else text or type(exc).__name__


def check_out(path: Path) -> None:
    """``--out`` can be written (checked before any image is read)."""
    if path.is_dir():
        raise UserError(f"--out: {path} is a folder; give a file name such as {path / 'predictions.csv'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"--out: cannot write {path}: {parent} is a file, not a folder")
            break


def write_csv(rows: list[dict[str, Any]], path: Path, k: int) -> None:
    header = ["path", "class", "probability"]
    for rank in range(2, k + 1):
        header += [f"class_{rank}", f"probability_{rank}"]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for row in rows:
                cells = [row["path"], row["class"], f"{row['probability']:.6f}"]
                for name, probability in row["top"][1:]:
                    cells += [name, f"{probability:.6f}"]
                writer.writerow(cells)
    except OSError as exc:
        raise UserError(f"--out: cannot write {path}: {exc.strerror or exc}") from None


__all__ = [
    "Predictions",
    "Predictor",
    "check_options",
    "check_out",
    "export_predictor",
    "predict_files",
    "run_predictor",
    "unreadable",
    "write_csv",
]
