"""After training, end to end on real images: train on an image folder, then eval, predict, export and runs.
The numbers must agree: eval gives the run's own evaluation, predict's accuracy on the eval folder is eval's
top-1, and an export used without dlrecipes gives predict's classes."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import run_cli, write

CLASSES = ["0", "1", "2", "3"]


def _digit_folders(root: Path, per_class_train: int = 40, per_class_val: int = 12) -> None:
    """The embedded handwritten digits 0-3 as 20x16 RGB PNG files in root/{train,val}/<digit>/."""
    import numpy as np
    from PIL import Image

    from dlrecipes.data.digits import load_digits_arrays

    images, labels = load_digits_arrays()
    for digit in CLASSES:
        picked = np.flatnonzero(labels == int(digit))[: per_class_train + per_class_val]
        for i, index in enumerate(picked):
            split = "train" if i < per_class_train else "val"
            folder = root / split / digit
            folder.mkdir(parents=True, exist_ok=True)
            grey = Image.fromarray((images[index] * 15).astype(np.uint8)).resize((20, 16), Image.BILINEAR)
            grey.convert("RGB").save(folder / f"{i}.png")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("after")
    _digit_folders(root / "data")
    recipe = write(
        root / "folders.yaml",
        f"""
        model: {{name: cnn_simple, width: 8, hidden: 32}}
        dataset: {{name: image_folder, train_path: data/train, val_path: data/val, crop_size: 12, resize_size: 14,
                   min_scale: 0.5}}
        trainer: {{max_duration: 4ep, batch_size: 16, num_workers: 0, progress_bar: false, device: cpu}}
        optimizer: {{name: adamw, lr: 0.01}}
        checkpoint: {{save_interval: 1ep, keep: 2, monitor: top1}}
        runs_dir: {root / "runs"}
        run_name: folders
    """,
    )
    result = run_cli("train", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    return root, root / "runs" / "folders"


def _history(run_dir: Path) -> list[dict]:
    with open(run_dir / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


def _eval_json(*args: str) -> dict:
    result = run_cli("eval", *args, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow
def test_eval_gives_the_run_s_own_evaluation(trained, tmp_path):
    root, run_dir = trained
    last = _history(run_dir)[-1]
    latest = _eval_json(str(run_dir), "--checkpoint", "latest")
    assert round(latest["metrics"]["top1"], 4) == round(float(last["eval_top1"]), 4)
    assert round(latest["metrics"]["loss"], 4) == round(float(last["eval_loss"]), 4)
    assert latest["images"] == 4 * 12
    best = _eval_json(str(run_dir))
    assert round(best["metrics"]["top1"], 4) == round(
        json.loads((run_dir / "checkpoints" / "best.json").read_text())["value"], 4
    )
    report = Path(best["out_dir"])
    assert report == run_dir / "eval" / "best" and (report / "confusion_matrix.csv").is_file()
    matrix = list(csv.reader(open(report / "confusion_matrix.csv")))[1:]
    correct = sum(int(row[1 + i]) for i, row in enumerate(matrix))
    assert correct / 48 == pytest.approx(best["metrics"]["top1"])
    # another batch size, the same numbers; a checkpoint file alone, with its recipe
    rebatched = _eval_json(str(run_dir), "trainer.eval_batch_size=7")
    assert rebatched["metrics"]["top1"] == pytest.approx(best["metrics"]["top1"])
    alone = tmp_path / "model.pt"
    shutil.copy(run_dir / "checkpoints" / "best.pt", alone)
    lone = run_cli(
        "eval",
        str(alone),
        "--recipe",
        str(run_dir / "recipe.yaml"),
        "--trust-checkpoint",
        "--out",
        str(tmp_path / "report"),
    )
    assert lone.returncode == 0, lone.stderr[-2000:]
    assert f"top1={best['metrics']['top1']:.4f}" in lone.stdout and "img/s" in lone.stdout
    assert (tmp_path / "report" / "per_class_accuracy.csv").is_file()
    # FixRes-style: evaluated at another size (the network is size-agnostic), and with flip TTA
    # (the recipe's own size given as overrides gives the run's numbers; another size, other images, other numbers)
    same = _eval_json(str(run_dir), "dataset.eval_crop_size=12", "dataset.resize_size=14")
    assert same["metrics"]["loss"] == pytest.approx(best["metrics"]["loss"])
    bigger = _eval_json(str(run_dir), "dataset.eval_crop_size=14", "dataset.resize_size=16")
    assert bigger["overrides"] == ["dataset.eval_crop_size=14", "dataset.resize_size=16"]
    assert bigger["images"] == 48 and bigger["metrics"]["loss"] != pytest.approx(best["metrics"]["loss"])
    assert bigger["out_dir"].endswith("eval/best_dataset.eval_crop_size=14_dataset.resize_size=16")
    flipped = _eval_json(str(run_dir), "--tta", "flip")
    assert flipped["tta"] == "flip" and flipped["out_dir"].endswith("best_tta-flip")
    assert flipped["metrics"]["loss"] != pytest.approx(best["metrics"]["loss"])  # digits are not symmetric


@pytest.mark.slow
def test_eval_errors_are_one_line(trained, tmp_path):
    root, run_dir = trained
    for args, expected in [
        ((str(tmp_path / "nope"),), "no such run directory or checkpoint file"),
        ((str(root / "data"),), "not a run directory (no recipe.yaml)"),
        ((str(run_dir), "--checkpoint", "elsewhere.pt"), "--checkpoint: no checkpoint file at elsewhere.pt"),
        ((str(run_dir), "--tta", "crop"), "--tta: expected one of flip"),
        ((str(run_dir), "trainer.eval_batch_size=0"), "trainer.eval_batch_size"),
    ]:
        result = run_cli("eval", *args)
        assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, (
            args,
            result.stderr[-1500:],
        )
    lone = tmp_path / "x.pt"
    shutil.copy(run_dir / "checkpoints" / "best.pt", lone)
    result = run_cli("eval", str(lone))
    assert result.returncode == 2 and "needs its recipe: add --recipe" in result.stderr


@pytest.mark.slow
def test_predict_agrees_with_eval_and_skips_unreadable_files(trained, tmp_path):
    root, run_dir = trained
    best = _eval_json(str(run_dir))
    out = tmp_path / "preds.csv"
    result = run_cli("predict", str(run_dir), str(root / "data" / "val"), "--top-k", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 48 and list(rows[0]) == [
        "path",
        "class",
        "probability",
        "class_2",
        "probability_2",
        "class_3",
        "probability_3",
    ]
    accuracy = sum(Path(r["path"]).parent.name == r["class"] for r in rows) / len(rows)
    assert accuracy == pytest.approx(best["metrics"]["top1"])
    assert all(float(r["probability"]) >= float(r["probability_2"]) >= float(r["probability_3"]) for r in rows)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    some = run_cli("predict", str(run_dir), str(root / "data" / "val" / "1" / "40.png"), str(broken), "--json")
    assert some.returncode == 0, some.stderr[-2000:]
    assert [r["path"] for r in json.loads(some.stdout)] == [str(root / "data" / "val" / "1" / "40.png")]
    assert f"skipping {broken}" in some.stderr


FRESH = """
import json, sys
from pathlib import Path
import numpy as np
import torch
from PIL import Image

folder, files = Path(sys.argv[1]), sys.argv[2:]
spec = json.loads((folder / "preprocess.json").read_text())
classes = json.loads((folder / "classes.json").read_text())
model = torch.jit.load(str(folder / "model.torchscript.pt")).eval()
out = []
for name in files:
    image = Image.open(name).convert(spec["channels"])
    side = spec["resize"]["shorter_side"]
    w, h = image.size
    image = image.resize((side, int(side * h / w)) if w <= h else (int(side * w / h), side), Image.BILINEAR)
    ch, cw = spec["center_crop"]
    w, h = image.size
    top, left = int(round((h - ch) / 2)), int(round((w - cw) / 2))
    x = np.asarray(image.crop((left, top, left + cw, top + ch)), dtype=np.float32) / spec["scale"]
    x = ((x - np.array(spec["mean"], np.float32)) / np.array(spec["std"], np.float32)).transpose(2, 0, 1)
    with torch.no_grad():
        out.append(classes[int(model(torch.from_numpy(x[None].copy())).argmax())])
assert "dlrecipes" not in sys.modules
print(json.dumps(out))
"""


@pytest.mark.slow
def test_export_is_usable_without_dlrecipes(trained, tmp_path):
    root, run_dir = trained
    result = run_cli("export", str(run_dir), "--out", str(tmp_path / "export"))
    assert result.returncode == 0, result.stderr[-2000:]
    export = tmp_path / "export"
    assert {p.name for p in export.iterdir()} >= {
        "model.torchscript.pt",
        "preprocess.json",
        "classes.json",
        "verify.json",
    }
    assert json.loads((export / "verify.json").read_text())["passed"]
    assert json.loads((export / "classes.json").read_text()) == CLASSES
    spec = json.loads((export / "preprocess.json").read_text())
    assert spec["resize"] == {"shorter_side": 14} and spec["center_crop"] == [12, 12] and spec["channels"] == "RGB"
    files = sorted(str(p) for p in (root / "data" / "val").rglob("*.png"))
    fresh = subprocess.run(
        [sys.executable, "-c", FRESH, str(export), *files], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    by_predict = json.loads(run_cli("predict", str(run_dir), *files, "--json").stdout)
    assert json.loads(fresh.stdout) == [row["class"] for row in by_predict]
    from_export = json.loads(run_cli("predict", str(export), *files, "--json").stdout)
    assert [row["class"] for row in from_export] == [row["class"] for row in by_predict]


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")), reason="pip install 'dlrecipes[onnx]'"
)
def test_predict_from_an_onnx_export_gives_the_run_s_classes_and_probabilities(trained, tmp_path):
    """The ONNX export runs with onnxruntime, without the recipe's code: the same classes as predict on the run,
    the same probabilities to ONNX's float tolerance. (At the fixture's 12x12 crops cnn_simple pools 3x3 features
    up to 7x7, which ONNX cannot express: that is one line naming the option; this run uses 28x28.)"""
    root, small = trained
    refused = run_cli("export", str(small), "--format", "onnx", "--out", str(tmp_path / "refused"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].startswith("error: --format: could not export this model to onnx")
    assert refused.stderr.strip().endswith("export without --format onnx")
    recipe = write(
        tmp_path / "mnist_size.yaml",
        f"""
        model: {{name: cnn_simple, width: 4, hidden: 16}}
        dataset: {{name: image_folder, train_path: {root}/data/train, val_path: {root}/data/val, crop_size: 28,
                   resize_size: 28}}
        trainer: {{max_duration: 1ep, batch_size: 16, num_workers: 0, progress_bar: false, device: cpu}}
        checkpoint: {{save_interval: 1ep, monitor: top1}}
        runs_dir: {tmp_path / "runs"}
        run_name: onnx
    """,
    )
    assert run_cli("train", str(recipe)).returncode == 0
    run_dir = tmp_path / "runs" / "onnx"
    result = run_cli("export", str(run_dir), "--format", "onnx", "--out", str(tmp_path / "onnx"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "onnx" / "model.onnx").is_file() and not (tmp_path / "onnx" / "model.torchscript.pt").exists()
    files = sorted(str(p) for p in (root / "data" / "val").rglob("*.png"))
    by_run = json.loads(run_cli("predict", str(run_dir), *files, "--json").stdout)
    by_onnx = json.loads(run_cli("predict", str(tmp_path / "onnx"), *files, "--json").stdout)
    assert [row["path"] for row in by_onnx] == [row["path"] for row in by_run] and len(by_run) == len(files)
    assert [row["class"] for row in by_onnx] == [row["class"] for row in by_run]
    assert [row["probability"] for row in by_onnx] == pytest.approx([row["probability"] for row in by_run], abs=1e-4)


@pytest.mark.slow
def test_runs_lists_the_run_and_compare_takes_the_newest(trained):
    root, run_dir = trained
    result = run_cli("runs", str(root / "runs"), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = [r for r in json.loads(result.stdout) if r["run"] == "folders"]
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())["value"]
    assert row["status"] == "done" and row["epochs"] == "4/4" and row["best_value"] == pytest.approx(best)
    assert row["device"] == "cpu" and row["precision"] == "fp32"
    table = run_cli("runs", str(root / "runs"))
    assert table.returncode == 0 and "folders" in table.stdout and "done" in table.stdout
    compared = run_cli("compare", "--last", "1", "--runs-dir", str(root / "runs"), "--json")
    assert compared.returncode == 0 and [s["run"] for s in json.loads(compared.stdout)] == ["folders"]


@pytest.mark.slow
def test_two_process_eval_gives_the_same_numbers(trained, tmp_path):
    root, run_dir = trained
    from .test_distributed import _forked_ranks

    one = _eval_json(str(run_dir), "trainer.eval_batch_size=10")
    # two ranks with the environment Composer's launcher gives them (forked; the launcher is test_distributed's)
    _forked_ranks(tmp_path, str(run_dir), "trainer.eval_batch_size=10", "--out", str(tmp_path / "two"), command="eval")
    both = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert both["images"] == one["images"] == 48
    for name, value in one["metrics"].items():  # 48 images over 2 ranks: shards of 24, uneven batches of 10
        assert both["metrics"][name] == pytest.approx(value, abs=1e-6), name


def test_runs_status_comes_from_the_run_s_files(tmp_path):
    import os
    import socket

    from dlrecipes.records.runs import list_runs

    def run(name: str, summary: dict | None = None, checkpoint: bool = False, lock: dict | None = None) -> None:
        folder = tmp_path / name
        write(folder / "recipe.yaml", "name: tiny\ntrainer: {max_duration: 5ep, precision: fp32}\n")
        if summary is not None:
            (folder / "summary.json").write_text(json.dumps(summary))
        if checkpoint:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "ep1-ba3-rank0.pt").write_bytes(b"x")
        if lock is not None:
            (folder / "run.lock").write_text(json.dumps(lock))

    run("done", {"status": "finished", "epochs": 5, "wall_time_sec": 3725.0, "device": "cpu"})
    run("diverged", {"status": "diverged", "epochs": 1})
    run("stopped", {"status": "stopped", "epochs": 2}, checkpoint=True)
    run("killed", checkpoint=True)
    run("killed_early")
    run("running", lock={"host": socket.gethostname(), "pid": os.getpid()})
    run("gone", checkpoint=True, lock={"host": socket.gethostname(), "pid": 2**22 + 12345})
    rows = {r["run"]: r for r in list_runs(tmp_path)}
    assert {name: r["status"] for name, r in rows.items()} == {
        "done": "done",
        "diverged": "diverged",
        "stopped": "stopped (resumable)",
        "killed": "killed (resumable)",
        "killed_early": "killed",
        "running": f"running (pid {os.getpid()})",
        "gone": "killed (resumable)",
    }
    assert rows["done"]["epochs"] == "5/5" and rows["done"]["wall_time"] == "1:02:05"
    assert rows["killed"]["epochs"] == "0/5"
    assert [r["run"] for r in list_runs(tmp_path, last=2)] == list(rows)[:2]  # newest first
    assert run_cli("runs", str(tmp_path / "nope")).returncode == 2


def test_a_best_pt_that_is_not_the_one_best_json_describes_is_refused(tiny_run):
    """best.json records the SHA-256 of the best.pt it describes: another file in its place (an upload cut off or
    landed out of order leaves one) is refused in one line, not evaluated as the best weights; with
    --trust-checkpoint (the file is the user's) a note says so and the file is evaluated."""
    info = json.loads((tiny_run / "checkpoints" / "best.json").read_text())
    other = next(
        p for p in sorted((tiny_run / "checkpoints").glob("ep*-rank0.pt")) if f"-ba{info['batch']}-" not in p.name
    )
    shutil.copy(other, tiny_run / "checkpoints" / "best.pt")
    result = run_cli("eval", str(tiny_run))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: {tiny_run / 'checkpoints' / 'best.pt'}: not the best checkpoint best.json describes (epoch "
        f"{info['epoch']}, batch {info['batch']}: another file, as an upload cut off or landed out of order leaves); "
        "resume the run (--resume) to upload its own, or give --checkpoint latest"
    )
    trusted = run_cli("eval", str(tiny_run), "--trust-checkpoint")  # the user vouches for the file: a note, then used
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert (
        "not the best checkpoint best.json describes" in trusted.stderr
        and "used as given (--trust-checkpoint)" in trusted.stderr
    )
