"""airbench94's own training code against dlrecipes' recipes/cifar10_speedrun.yaml: the same device, the same data,
one command.

    python benchmarks/speedrun.py                                   # a GPU, CIFAR-10's size (synthetic images)
    python benchmarks/speedrun.py --cifar data/cifar10              # a GPU, your CIFAR-10 (cifar-10-batches-py/)
    python benchmarks/speedrun.py --device cpu --images 1024 --batch 256 --epochs 3
    python benchmarks/speedrun.py --tiny --device cpu               # a smoke run (the test suite's)

Each side trains in a Python of its own (a cold start for both: CUDA's context, cuDNN's autotuning and
torch.compile are paid by each): airbench's ``train()`` (the `airbench` package 0.1.8, the test dependency, with
its ``CifarLoader`` over a ``train.pt`` of the images) and ``dlrecipes.train`` of the recipe over the same images
written as CIFAR-10's python batches.  Measured for each: the imports (airbench's: torch and torchvision;
dlrecipes': those and Composer), the whole run's wall time after them (from before the data is read to the trained
model: loading, whitening, compilation, every step; dlrecipes' also one evaluation batch at the end, the least its
trainer runs; airbench's none, as with verbose off), and the steady step time (the median
epoch after the first, whole epochs only, over its batches).  The ratios are airbench's over dlrecipes': above 1,
dlrecipes is faster.

airbench places its network and images on CUDA in fp16: on the CPU (and only there) this script keeps them on the
CPU in fp32, and dlrecipes runs fp32 too; on a GPU both run as published (airbench: fp16 weights; the recipe:
amp_fp16, channels-last, compiled unless --eager).  airbench's own package trains uncompiled (its compiled
variant is a separate script), so ``--eager`` gives the like-for-like row.  Accuracy is not measured: synthetic
labels are random.  On a real CIFAR-10, ``dlrecipes train recipes/cifar10_speedrun.yaml`` reports it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY_WIDTHS = [8, 16, 16]


def images_and_labels(args) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images N x 32 x 32 x 3 uint8, labels, test images, labels): the user's CIFAR-10 or synthetic ones."""
    if args.cifar:
        from dlrecipes.data.torchvision_sets import CIFAR10, read_cifar_batches

        folder = Path(args.cifar) / CIFAR10.folder
        missing = [name for name in (*CIFAR10.train_files, *CIFAR10.test_files) if not (folder / name).is_file()]
        if missing:
            sys.exit(
                f"speedrun: --cifar: {folder} lacks {', '.join(missing)} (CIFAR-10's python version, "
                "cifar-10-batches-py/, under the folder given)"
            )
        train = read_cifar_batches(folder, CIFAR10.train_files, CIFAR10.label_key)
        test = read_cifar_batches(folder, CIFAR10.test_files, CIFAR10.label_key)
        nhwc = [x.transpose(0, 2, 3, 1) for x in (train[0], test[0])]
        return nhwc[0][: args.images], train[1][: args.images], nhwc[1], test[1]
    rng = np.random.default_rng(0)
    n_test = max(16, args.images // 5)
    return (
        rng.integers(0, 256, (args.images, 32, 32, 3), dtype=np.uint8),
        rng.integers(0, 10, args.images),
        rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8),
        rng.integers(0, 10, n_test),
    )


def write_data(root: Path, data) -> None:
    """The same images in both formats: airbench's root/cifar10/{train,test}.pt, CIFAR's python batches under
    root/dl/cifar-10-batches-py (the five training files share the images)."""
    import torch

    train_x, train_y, test_x, test_y = data
    (root / "cifar10").mkdir(parents=True)
    classes = [str(i) for i in range(10)]
    for name, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        torch.save(
            {"images": torch.from_numpy(x), "labels": torch.from_numpy(y.astype(np.int64)), "classes": classes},
            root / "cifar10" / f"{name}.pt",
        )
    folder = root / "dl" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    parts = np.array_split(np.arange(len(train_x)), 5)
    batches = {f"data_batch_{i + 1}": part for i, part in enumerate(parts)}
    for name, rows in batches.items():
        flat = train_x[rows].transpose(0, 3, 1, 2).reshape(len(rows), -1)
        (folder / name).write_bytes(pickle.dumps({"data": flat, "labels": train_y[rows].tolist()}))
    flat = test_x.transpose(0, 3, 1, 2).reshape(len(test_x), -1)
    (folder / "test_batch").write_bytes(pickle.dumps({"data": flat, "labels": test_y.tolist()}))


def sync(device: str) -> None:
    import torch

    if device == "gpu":
        torch.cuda.synchronize()


def airbench_on_the_cpu() -> None:
    """airbench's CUDA and fp16 placement and its CUDA-event timing, kept on the CPU in fp32 (the CPU run only)."""
    import torch
    from airbench import utils

    class NoEvent:
        def __init__(self, *args, **kwargs):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 0.0

    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.nn.Module.half = lambda self: self
    torch.cuda.Event, torch.cuda.synchronize = NoEvent, lambda *a, **k: None
    loader = utils.CifarLoader

    def on_cpu(*args, **kwargs):
        made = loader(*args, **{**kwargs, "gpu": "cpu"})
        made.images = made.images.float()
        return made

    utils.CifarLoader = on_cpu


def airbench_side(args, root: Path) -> dict:
    """airbench94's train() on root/cifar10: the whole run's seconds and the start of each epoch."""
    import functools

    started = time.perf_counter()
    from airbench import lib_airbench94, utils  # torch and torchvision

    imports = time.perf_counter() - started
    if args.device == "cpu":
        airbench_on_the_cpu()
    marks = []

    def timed(loader):
        iterate = loader.__iter__

        class Timed(type(loader)):
            def __iter__(self):
                sync(args.device)
                marks.append(time.perf_counter())
                return iterate()

        loader.__class__ = Timed
        return loader

    os.chdir(root)  # train() opens its test set as the folder 'cifar10'
    start = time.perf_counter()
    loader = utils.CifarLoader(
        "cifar10", train=True, batch_size=args.batch, aug=lib_airbench94.hyp["aug"], altflip=True
    )
    widths = (
        dict(zip(("block1", "block2", "block3"), args.widths)) if args.widths else lib_airbench94.hyp["net"]["widths"]
    )
    lib_airbench94.train94(
        timed(loader),
        epochs=args.epochs,
        make_net=functools.partial(lib_airbench94.make_net94, widths=widths),
        verbose=False,
    )
    sync(args.device)
    end = time.perf_counter()
    return {
        "wall_s": end - start,
        "import_s": imports,
        "epoch_s": [b - a for a, b in zip(marks, marks[1:] + [end])],
        "steps_per_epoch": len(loader),
    }


def dlrecipes_side(args, root: Path) -> dict:
    """dlrecipes.train of recipes/cifar10_speedrun.yaml on root/dl: the whole run's seconds and each epoch's."""
    import csv

    started = time.perf_counter()
    from dlrecipes import api
    from dlrecipes.runtime import process_state

    process_state.import_training_stack()  # torch, Composer and the rest of the training code
    imports = time.perf_counter() - started

    steps_per_epoch = args.images // args.batch
    steps = math.ceil(steps_per_epoch * args.epochs)
    overrides = [
        f"dataset.root={root / 'dl'}",
        "dataset.download=false",
        f"trainer.device={args.device}",
        f"trainer.batch_size={args.batch}",
        f"trainer.max_duration={steps}ba",
        f"trainer.eval_interval={steps}ba",
        "trainer.eval_subset_num_batches=1",
        "trainer.progress_bar=false",
        f"runs_dir={root / 'runs'}",
        "run_name=speedrun",
        "plots=false",
        f"optimizer.weight_decay={0.0153 * args.batch / 11.5!r}",
        f"callbacks.patch_whitening.images={min(5000, args.images)}",
    ]
    if args.widths:
        overrides.append(f"model.widths={list(args.widths)}")
    if args.device == "cpu":
        overrides += ["trainer.precision=fp32", "trainer.compile=false"]
    elif args.eager:
        overrides.append("trainer.compile=false")
    start = time.perf_counter()
    api.train(ROOT / "recipes" / "cifar10_speedrun.yaml", overrides)
    wall = time.perf_counter() - start
    with open(root / "runs" / "speedrun" / "history.csv") as f:
        rates = [float(row["images_per_sec"]) for row in csv.DictReader(f)]
    return {
        "wall_s": wall,
        "import_s": imports,
        "epoch_s": [steps_per_epoch * args.batch / rate for rate in rates],
        "steps_per_epoch": steps_per_epoch,
    }


def steady_step_s(side: dict, epochs: float) -> float:
    """The median whole epoch after the first, over its steps (the first when there is no other)."""
    whole = side["epoch_s"][1 : int(epochs)] or side["epoch_s"][:1]
    return statistics.median(whole) / side["steps_per_epoch"]


def one_side(args) -> None:
    root = Path(args.root)
    result = (airbench_side if args.side == "airbench" else dlrecipes_side)(args, root)
    print("RESULT " + json.dumps(result), flush=True)


def run_side(name: str, args, root: Path) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--side",
        name,
        "--root",
        str(root),
        "--device",
        args.device,
        "--images",
        str(args.images),
        "--batch",
        str(args.batch),
        "--epochs",
        str(args.epochs),
    ]
    cmd += ["--widths", *map(str, args.widths)] if args.widths else []
    cmd += ["--eager"] if args.eager else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"speedrun: the {name} side failed:\n{done.stderr[-3000:]}")
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--images", type=int, default=50_000, help="training images (synthetic unless --cifar)")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--epochs", type=float, default=9.9, help="airbench's train_epochs (fractional allowed)")
    parser.add_argument("--widths", type=int, nargs=3, help="the blocks' widths (default: airbench94's 64 256 256)")
    parser.add_argument("--cifar", help="a folder holding cifar-10-batches-py: your CIFAR-10 instead of noise")
    parser.add_argument("--eager", action="store_true", help="the recipe uncompiled, as airbench's package trains")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 64 images, batch 16, 2.5 epochs, narrow")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--side", choices=["airbench", "dlrecipes"], help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        args.images, args.batch, args.epochs, args.widths = 64, 16, 2.5, args.widths or TINY_WIDTHS
    if args.side:
        return one_side(args)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_data(root, images_and_labels(args))
        sides = {name: run_side(name, args, root) for name in ("airbench", "dlrecipes")}
    ours, theirs = sides["dlrecipes"], sides["airbench"]
    result = {
        "device": args.device,
        "images": args.images,
        "batch": args.batch,
        "epochs": args.epochs,
        "widths": args.widths or [64, 256, 256],
        "compiled": args.device == "gpu" and not args.eager,
        "data": args.cifar or "synthetic",
        **{f"{k}_{name}": v for name, side in sides.items() for k, v in side.items()},
        "steady_step_ms_airbench": 1e3 * steady_step_s(theirs, args.epochs),
        "steady_step_ms_dlrecipes": 1e3 * steady_step_s(ours, args.epochs),
    }
    result["step_speed_ratio"] = result["steady_step_ms_airbench"] / result["steady_step_ms_dlrecipes"]
    result["wall_ratio"] = ours["wall_s"] / theirs["wall_s"]
    result["wall_with_imports_ratio"] = (ours["wall_s"] + ours["import_s"]) / (theirs["wall_s"] + theirs["import_s"])
    print(
        f"{'':12} {'imports s':>10} {'whole run s':>12} {'steady step ms':>15}\n"
        f"{'airbench':12} {theirs['import_s']:10.2f} {theirs['wall_s']:12.2f} "
        f"{result['steady_step_ms_airbench']:15.2f}\n"
        f"{'dlrecipes':12} {ours['import_s']:10.2f} {ours['wall_s']:12.2f} {result['steady_step_ms_dlrecipes']:15.2f}\n"
        f"steady step speed, dlrecipes / airbench: {result['step_speed_ratio']:.3f} (goal on a GPU: >= 0.95)\n"
        f"whole run, dlrecipes / airbench: {result['wall_ratio']:.3f}x (goal on a GPU: <= 1.1x); "
        f"with the imports: {result['wall_with_imports_ratio']:.3f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
