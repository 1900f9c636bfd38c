"""cnn_simple vs mnist_cnn on the embedded digits, over several seeds and a harder split.

    python benchmarks/digits_models.py [--seeds 0 1 2] [--eval-fraction 0.5] [--epochs 12]

With the quickstart's 80/20 split both models reach ~99% on 360 test images, which is too
small a test set to separate them; a 50/50 split halves the training data and doubles the
test set.  Prints one row per run and the mean test accuracy per model.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dlrecipes.api import resolve
from dlrecipes.fit import fit, open_run

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-fraction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as runs:
        for seed in args.seeds:
            for model in ("cnn_simple", "mnist_cnn"):
                overrides = [
                    f"model={{name: {model}}}",
                    f"trainer.seed={seed}",
                    f"trainer.max_duration={args.epochs}ep",
                    f"dataset.eval_fraction={args.eval_fraction}",
                    "trainer.progress_bar=false",
                    "trainer.console_log_interval=1000ep",
                    f"runs_dir={runs}",
                    "checkpoint.save=false",
                    "checkpoint.monitor=null",
                ]
                start = time.perf_counter()
                result = fit(open_run(resolve(RECIPES / "quickstart.yaml", overrides)))
                top1 = result.eval_metrics["top1"]
                results.setdefault(model, []).append(top1)
                print(
                    f"seed={seed} model={model:<10} top1={top1:.4f} wall={time.perf_counter() - start:.1f}s", flush=True
                )
    for model, accs in results.items():
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"{model:<10} mean top1 {statistics.mean(accs):.4f} +- {spread:.4f} over {len(accs)} seeds")


if __name__ == "__main__":
    main()
