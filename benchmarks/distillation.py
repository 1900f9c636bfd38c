"""Knowledge distillation on the embedded digits: a small student distilled from a stronger teacher vs the same
student alone, same epochs, several seeds.

    python benchmarks/distillation.py [--seeds 0 1 2] [--epochs 8] [--teacher-epochs 12] [--kinds soft hard]

The teacher (``cnn_simple`` at width 32, hidden 128: 8x wider, 62x the student's 6,794 parameters) is trained
once with the quickstart schedule;
each student (``cnn_simple`` at width 4, hidden 16) trains ``--epochs`` epochs alone and, with the same seed
and schedule, with ``algorithms.distillation`` from the teacher's run directory.  Half of the 1,797 digits
train, half (899) test, at 16 px (as ``recipes/digits_qat.yaml``).  Prints one row per run, then mean +- std
(sample standard deviation) of eval top-1 per variant, as a Markdown table; ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from dlrecipes.api import resolve
from dlrecipes.fit import fit, open_run

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"
STUDENT = "model={name: cnn_simple, width: 4, hidden: 16}"
TEACHER = "model={name: cnn_simple, width: 32, hidden: 128}"


def _common(runs: str, args: argparse.Namespace, seed: int, epochs: int) -> list[str]:
    return [
        f"trainer.seed={seed}",
        f"trainer.max_duration={epochs}ep",
        f"dataset.eval_fraction={args.eval_fraction}",
        f"dataset.image_size={args.image_size}",
        "trainer.progress_bar=false",
        "trainer.console_log_interval=1000ep",
        f"runs_dir={runs}",
        "trainer.device=cpu",
    ]


def _train(overrides: list[str]) -> tuple[float, float, Path]:
    start = time.perf_counter()
    result = fit(open_run(resolve(RECIPE, overrides)))
    return result.eval_metrics["top1"], time.perf_counter() - start, result.run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=8, help="the students' epochs (alone and distilled)")
    parser.add_argument("--teacher-epochs", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--eval-fraction", type=float, default=0.5)
    parser.add_argument("--kinds", nargs="+", default=["soft"], choices=["soft", "hard"])
    parser.add_argument("--temperature", type=float, default=4.0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as runs:
        top1, wall, teacher = _train([TEACHER, *_common(runs, args, 0, args.teacher_epochs), "run_name=teacher"])
        print(f"teacher cnn_simple width 32 seed=0 top1={top1:.4f} wall={wall:.1f}s", flush=True)
        results["teacher (cnn_simple width 32)"] = [top1]
        for seed in args.seeds:
            variants = {"student alone": []}
            for kind in args.kinds:
                variants[f"student distilled ({kind})"] = [
                    f"algorithms.distillation={{teacher: {teacher}, kind: {kind}, temperature: {args.temperature}, "
                    f"alpha: {args.alpha}}}"
                ]
            for name, extra in variants.items():
                top1, wall, _ = _train(
                    [
                        STUDENT,
                        *_common(runs, args, seed, args.epochs),
                        *extra,
                        "checkpoint.save=false",
                        "checkpoint.monitor=null",
                    ]
                )
                results.setdefault(name, []).append(top1)
                print(f"seed={seed} {name:<26} top1={top1:.4f} wall={wall:.1f}s", flush=True)
    print("\n| variant | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean +- std |")
    print("|---|" + "---|" * (len(args.seeds) + 1))
    for name, accs in results.items():
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        cells = " | ".join([f"{a:.2%}" for a in accs] + [""] * (len(args.seeds) - len(accs)))
        print(f"| {name} | {cells} | {statistics.mean(accs):.2%} +- {spread * 100:.2f} |")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "top1": results}, indent=1)
        )


if __name__ == "__main__":
    main()
