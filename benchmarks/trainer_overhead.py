"""dlrecipes/Composer against a plain PyTorch loop on the same model, optimizer and batches.

    python benchmarks/trainer_overhead.py [--steps 20] [--rounds 7] [--json out.json]
        [--case "recipes/quickstart.yaml trainer.loader=device" ...]

Each case is a recipe and overrides; the default cases are the quickstart (CNN on the
embedded digits, batch 64) and a ResNet-18 at 32 px on synthetic data (batch 64). Same as
`dlrecipes bench RECIPE [overrides]`, for several cases in one run.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from dlrecipes.api import resolve
from dlrecipes.tools.bench import format_bench, run_bench

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = [
    f"{ROOT}/recipes/quickstart.yaml",
    f"{ROOT}/recipes/quickstart.yaml 'model={{name: cifar_resnet18}}' "
    "'dataset={name: synthetic, input_shape: [3, 32, 32], train_samples: 1024, num_classes: 10}' trainer.batch_size=64",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="recipe path and overrides, quoted")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for case in args.case or DEFAULT_CASES:
        recipe, *overrides = shlex.split(case)
        result = run_bench(resolve(recipe, overrides), steps=args.steps, rounds=args.rounds, warmup=args.warmup)
        result["case"] = case
        print(format_bench(result), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
