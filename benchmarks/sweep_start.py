"""What a sweep's trainings cost to start on a CPU: forked from a process that imported torch and Composer once
(the default without GPUs) against a new Python each (``DLRECIPES_SWEEP_FRESH_PYTHON=1``).

    python benchmarks/sweep_start.py [--points 4] [--batches 2] [--json out.json]

Each mode sweeps the quickstart recipe over ``--points`` learning rates, ``--batches`` training and evaluation
batches each, in a folder of its own, one training at a time; the two sweeps run one after the other in this run.
The table gives each sweep's wall time and the ratio; the points' results must be the same in both modes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {"forked": "0", "new Python": "1"}


def sweep(folder: Path, mode: str, points: int, batches: int) -> dict:
    lrs = ",".join(f"{0.001 * (i + 1):g}" for i in range(points))
    cmd = [
        sys.executable,
        "-m",
        "dlrecipes",
        "sweep",
        str(ROOT / "recipes" / "quickstart.yaml"),
        f"optimizer.lr={lrs}",
        "trainer.max_duration=1ep",
        f"trainer.train_subset_num_batches={batches}",
        f"trainer.eval_subset_num_batches={batches}",
        f"runs_dir={folder}",
        "--name",
        "start",
    ]
    env = {**os.environ, "DLRECIPES_SWEEP_FRESH_PYTHON": MODES[mode]}
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(
            f"sweep_start: the {mode} sweep failed (exit {done.returncode}):\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    with open(folder / "start" / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    if [row["status"] for row in rows] != ["done"] * points:
        sys.exit(f"sweep_start: the {mode} sweep's points did not all finish: {[row['status'] for row in rows]}")
    return {
        "mode": mode,
        "seconds": seconds,
        "per_point": seconds / points,
        "results": {row["optimizer.lr"]: [row["best"], row["final"]] for row in rows},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.points < 2:
        parser.error("--points: at least 2 (a sweep has several points)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-start-") as tmp:
        for mode in MODES:
            folder = Path(tmp) / mode.replace(" ", "-")
            folder.mkdir()
            rows.append(sweep(folder, mode, args.points, args.batches))
    same = rows[0]["results"] == rows[1]["results"]
    print(f"| trainings started | sweep of {args.points} points | per point |\n|---|---|---|")
    for row in rows:
        print(f"| {row['mode']} | {row['seconds']:.1f} s | {row['per_point']:.1f} s |")
    print(
        f"\nnew Python / forked: {rows[1]['seconds'] / rows[0]['seconds']:.2f}x; "
        f"the points' results {'are the same' if same else 'DIFFER'} in both modes"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "same_results": same}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
