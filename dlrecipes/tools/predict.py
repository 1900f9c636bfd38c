"""After training: the classes of image files (``dlrecipes predict``).

From a run directory (or a checkpoint), the recipe's network with the checkpoint's weights runs on
the device the recipe would train on; from an export directory (``model.torchscript.pt`` or
``model.onnx`` with ``preprocess.json`` and ``classes.json``) no recipe code is needed, and ONNX
runs with onnxruntime (the ``onnx`` extra).  Either way each file goes through the evaluation
preprocessing (:mod:`dlrecipes.data.preprocess`), in batches.  Unreadable files are named and
skipped.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from dlrecipes.errors import RecipeError, UserError


Predictor = tuple[Callable[[Any], Any], dict[str, Any], list[str]]  # logits of a batch, preprocessing, class names


def is_export_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "preprocess.json").is_file()


def export_predictor(folder: Path) -> Predictor:
    """(logits of a float32 NCHW array batch, preprocess spec, class names) of an export directory."""
    import numpy as np

    try:
        spec = json.loads((folder / "preprocess.json").read_text())
        classes = json.loads((folder / "classes.json").read_text())
    except FileNotFoundError as exc:
        raise UserError(f"{folder}: an export directory needs preprocess.json and classes.json; {exc.filename} is "
                        "missing (export again with dlrecipes export RUN_DIR)") from None
    if (folder / "model.torchscript.pt").is_file():
        import torch

        module = torch.jit.load(str(folder / "model.torchscript.pt"), map_location="cpu").eval()

        def run(batch: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return module(torch.from_numpy(batch)).numpy()

        return run, spec, classes
    if (folder / "model.onnx").is_file():
        try:
            import onnxruntime
        except ImportError:
            raise UserError(f"{folder / 'model.onnx'}: running ONNX needs onnxruntime: pip install 'dlrecipes[onnx]'"
                            ) from None
        session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return (lambda batch: session.run(None, {name: batch})[0]), spec, classes
    raise UserError(f"{folder}: no model.torchscript.pt or model.onnx in this export directory")


def run_predictor(target: Any, config: Any, trust: bool = False) -> Predictor:
    """The same for a run's checkpoint (``config``: its recipe, validated): the recipe's network on the
    recipe's device."""
    import numpy as np
    import torch

    from dlrecipes.tools.evaluate import network_of, trained_model

    trainer, data = trained_model(target, config, trust)
    network = network_of(trainer).eval()
    trainer.close()
    if data.preprocess is None:
        raise RecipeError(f"dataset.name: {target.recipe}'s dataset has no image files to mirror (its inputs are not "
                          "images read from files), so predict cannot prepare image files for it")
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


def predict_files(predictor: Predictor, files: Sequence[str | Path], top_k: int = 5, out: Optional[str | Path] = None,
                  batch_size: int = 64) -> list[dict[str, Any]]:
    """One row per readable file: ``path``, ``class``, ``probability`` and the ``top`` k (class, probability)
    pairs; written to ``out`` as CSV when given."""
    import numpy as np

    from dlrecipes.data.preprocess import image_files, load_image

    check_options(top_k, batch_size)
    run, spec, classes = predictor
    paths = image_files(files)
    if not paths:
        raise UserError(f"FILES: no image files in {', '.join(map(str, files))} (looked for "
                        ".jpg .jpeg .png .bmp .gif .webp .tif .tiff .ppm .pgm)")
    k = min(top_k, len(classes))
    rows: list[dict[str, Any]] = []
    skipped = 0
    for start in range(0, len(paths), batch_size):
        arrays, kept = [], []
        for path in paths[start:start + batch_size]:
            try:
                arrays.append(load_image(path, spec))
                kept.append(path)
            except (OSError, ValueError) as exc:  # missing, unidentified, truncated
                skipped += 1
                print(f"warning: skipping {path}: {str(exc).split(' (')[0] or type(exc).__name__}", file=sys.stderr)
        if not arrays:
            continue
        logits = np.asarray(run(np.stack(arrays)), dtype=np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        for path, p in zip(kept, probabilities):
            order = np.argsort(-p, kind="stable")[:k]
            top = [(classes[i], float(p[i])) for i in order]
            rows.append({"path": str(path), "class": top[0][0], "probability": top[0][1], "top": top})
    if skipped:
        print(f"warning: {skipped} of {len(paths)} file(s) could not be read (named above)", file=sys.stderr)
    if out is not None:
        write_csv(rows, Path(out), k)
    return rows


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


def format_predictions(rows: list[dict[str, Any]], out: Optional[str | Path] = None) -> str:
    lines = []
    for row in rows:
        others = "  ".join(f"{name} {p:.3f}" for name, p in row["top"][1:])
        lines.append(f"{row['path']}  {row['class']} {row['probability']:.3f}" + (f"  ({others})" if others else ""))
    if out is not None:
        lines.append(f"{len(rows)} prediction(s) written to {out}")
    return "\n".join(lines)


__all__ = ["Predictor", "check_options", "export_predictor", "format_predictions", "is_export_dir", "predict_files",
           "run_predictor", "write_csv"]
