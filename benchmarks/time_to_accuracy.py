"""Time to a target test accuracy on the embedded digits: the quickstart recipe through
dlrecipes against a plain PyTorch loop with the same model, data, optimizer and schedule.

    python benchmarks/time_to_accuracy.py [--target 0.97] [--epochs 12]

Both evaluate after every epoch; the time is wall-clock from the start of training (model
built, data in memory) to the end of the first epoch whose evaluation reaches the target,
evaluation included.  The dlrecipes figure comes from the run's history.csv.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import torch

from dlrecipes.api import resolve
from dlrecipes.fit import fit, open_run

ROOT = Path(__file__).resolve().parents[1]


def plain_loop(epochs: int, target: float, seed: int = 17) -> tuple[float | None, list[tuple[float, float]]]:
    """mnist_cnn on digits, AdamW(3e-3, wd 1e-4, no decay on norms/biases), one-cycle over 25%, batch 64."""
    from timm.optim import param_groups_weight_decay
    from torch.utils.data import DataLoader

    from dlrecipes import registry
    from dlrecipes.plugins import load_builtins

    load_builtins()
    torch.manual_seed(seed)
    data = registry.datasets.build("digits", image_size=28, augment=True)
    model = registry.models.build("mnist_cnn", num_classes=10, in_chans=1)
    train_dl = DataLoader(data.train, batch_size=64, shuffle=True, drop_last=True)
    eval_dl = DataLoader(data.eval, batch_size=64)
    opt = torch.optim.AdamW(param_groups_weight_decay(model, 1e-4), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=3e-3, total_steps=epochs * len(train_dl), pct_start=0.25, div_factor=25, final_div_factor=1e4
    )
    start, curve, reached = time.perf_counter(), [], None
    for _ in range(epochs):
        model.train()
        for x, y in train_dl:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in eval_dl:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        elapsed = time.perf_counter() - start
        curve.append((elapsed, correct / total))
        if reached is None and correct / total >= target:
            reached = elapsed
    return reached, curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs:
        result = fit(
            open_run(
                resolve(
                    ROOT / "recipes" / "quickstart.yaml",
                    [
                        f"runs_dir={runs}",
                        "run_name=tta",
                        "trainer.progress_bar=false",
                        "trainer.console_log_interval=1000ep",
                        f"trainer.max_duration={args.epochs}ep",
                        "checkpoint.save=false",
                        "checkpoint.monitor=null",
                    ],
                )
            )
        )
        with open(result.run_dir / "history.csv") as f:
            rows = [(float(r["elapsed_sec"]), float(r["eval_top1"])) for r in csv.DictReader(f)]
    ours = next((t for t, acc in rows if acc >= args.target), None)
    plain, plain_rows = plain_loop(args.epochs, args.target)
    fmt = lambda t: f"{t:.1f}s" if t is not None else "not reached"  # noqa: E731
    print(f"dlrecipes quickstart: {args.target:.0%} after {fmt(ours)}; final {rows[-1][1]:.4f} at {rows[-1][0]:.1f}s")
    print(
        f"plain PyTorch loop  : {args.target:.0%} after {fmt(plain)}; "
        f"final {plain_rows[-1][1]:.4f} at {plain_rows[-1][0]:.1f}s"
    )
    print("per epoch (s, top-1): dlrecipes", [(round(t, 1), round(a, 4)) for t, a in rows])
    print("per epoch (s, top-1): plain    ", [(round(t, 1), round(a, 4)) for t, a in plain_rows])


if __name__ == "__main__":
    main()
