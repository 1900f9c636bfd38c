"""Framework overhead per step: Composer's own training step against dlrecipes's, side by side.

    python benchmarks/framework_overhead.py [--models cnn_simple cifar_resnet18] [--steps 300]
        [--rounds 11] [--repeats 3] [--base REV] [--json out.json]

Each repetition runs `dlrecipes bench recipes/quickstart.yaml trainer.batch_size=2 'model={name: M}'`
(batch 2: the model's work is tiny, so the framework's Python shows) once per trainer, alternating:
Composer's Trainer unchanged (`--plugin tests/reference_engine.py`), dlrecipes at git revision REV
when given (exported to a temporary directory), and dlrecipes of this checkout. Each is its own
process because the plugin replaces the Trainer class process-wide (on a CPU, this checkout's are forked
from a process that imported it once; another revision's, and any on a GPU, are new Pythons). Every
`bench` times its plain loop and its trainer in alternating segments; overhead = (trainer time - plain
time) per step.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's dlrecipes, for the forked runs
from dlrecipes.tools.sweep.run import forks_trainings  # noqa: E402
from tests.forked import run_forked  # noqa: E402


def export_revision(rev: str, into: Path) -> Path:
    """The tracked files of git revision ``rev`` of this checkout, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def bench(source: Path, model: str, args: argparse.Namespace, composer_step: bool) -> dict:
    """One `dlrecipes bench` run of the code under ``source``, as a dict of its JSON result."""
    command = [
        sys.executable,
        "-m",
        "dlrecipes",
        "bench",
        "recipes/quickstart.yaml",
        "trainer.batch_size=2",
        f"model={{name: {model}}}",
        "--steps",
        str(args.steps),
        "--rounds",
        str(args.rounds),
        "--warmup",
        str(args.warmup),
        "--json",
    ]
    if composer_step:
        command += ["--plugin", str(ROOT / "tests" / "reference_engine.py")]
    env = {**os.environ, "PYTHONPATH": str(source)}
    if source == ROOT and forks_trainings(1):  # this checkout on a CPU: forked from a process that imported it once
        done = run_forked(command[3:], cwd=source, env=env)
    else:  # another revision's code, or CUDA (it would not survive a fork): a new Python
        done = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench of {model} in {source} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def measure(args: argparse.Namespace, base: Path | None) -> list[dict]:
    trainers = [("Composer's step", ROOT, True)]
    if base is not None:
        trainers.append((f"dlrecipes at {args.base}", base, False))
    trainers.append(("dlrecipes (this checkout)", ROOT, False))
    rows = []
    for model in args.models:
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in trainers}
        for _ in range(args.repeats):
            for name, source, composer_step in trainers:
                runs[name].append(bench(source, model, args, composer_step))
        for name, found in runs.items():
            rows.append(
                {
                    "model": model,
                    "trainer": name,
                    "ratios": [round(r["ratio"], 3) for r in found],
                    "overhead_ms": [round(r["overhead_ms_per_step"], 3) for r in found],
                    "median_overhead_ms": round(statistics.median(r["overhead_ms_per_step"] for r in found), 3),
                }
            )
            print(format_row(rows[-1]), flush=True)
    return rows


def format_row(row: dict) -> str:
    ratios = " / ".join(f"{r:.2f}" for r in row["ratios"])
    overheads = " / ".join(f"{o:.2f}" for o in row["overhead_ms"])
    return f"| `{row['model']}` | {row['trainer']} | {ratios} | {overheads} ms | {row['median_overhead_ms']:.2f} ms |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn_simple", "cifar_resnet18"])
    parser.add_argument("--steps", type=int, default=300, help="steps per timed segment")
    parser.add_argument("--rounds", type=int, default=11, help="timed segments per side in each bench")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="bench runs per trainer, alternating")
    parser.add_argument("--base", help="also measure dlrecipes at this git revision (e.g. a commit before a change)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print("| model (batch 2) | trainer | ratio to plain loop, per run | overhead per step, per run | median |")
    print("|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = export_revision(args.base, Path(tmp)) if args.base else None
        rows = measure(args, base)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
