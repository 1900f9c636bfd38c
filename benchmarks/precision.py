"""Precision and gradient accumulation side by side: wall time, peak memory and loss after a
fixed number of steps (in the spirit of a FP32 / FP16 AMP / BF16 AMP / accumulation study).

    python benchmarks/precision.py --device cpu                      # fp32, fp32 + accumulation
    python benchmarks/precision.py --device gpu                      # adds amp_fp16, amp_bf16, amp + accumulation

Each configuration trains in its own process through `dlrecipes train` (so peak memory is that
run's alone: CUDA peak allocation on GPU, peak resident memory on CPU; on the CPU the process is forked from
one that imported torch and Composer once) on synthetic data, for
--steps batches from the same seed; the table comes from each run's summary.json/history.csv.
Composer runs only fp32 on CPU, so AMP rows exist only with --device gpu.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "resnet18_cifar": ("{name: cifar_resnet18}", (3, 32, 32), 10),
    "resnet50": ("{name: torchvision, arch: resnet50}", (3, 224, 224), 1000),
}


def configs(device: str, batch: int) -> list[tuple[str, list[str]]]:
    micro = batch // 4
    rows = [
        ("fp32", ["trainer.precision=fp32"]),
        (
            f"fp32 + accumulation (microbatch {micro})",
            ["trainer.precision=fp32", f"trainer.device_train_microbatch_size={micro}"],
        ),
    ]
    if device == "gpu":
        rows += [
            ("amp_fp16", ["trainer.precision=amp_fp16"]),
            ("amp_bf16", ["trainer.precision=amp_bf16"]),
            (
                f"amp_bf16 + accumulation (microbatch {micro})",
                ["trainer.precision=amp_bf16", f"trainer.device_train_microbatch_size={micro}"],
            ),
        ]
    return rows


def own_process(
    args: list[str], device: str, env: dict[str, str] | None = None, script: Path | None = None
) -> subprocess.CompletedProcess:
    """``python -m dlrecipes ARGS`` (``python SCRIPT ARGS``) in ROOT, to its end, output captured: a new Python on
    GPUs; on the CPU, forked from a process that imported torch and Composer once (the imports are not what a CPU
    run measures; peak memory is still its own process's; CUDA would not survive the fork)."""
    if device == "cpu":
        if str(ROOT) not in sys.path:  # tests/forked.py, run as a script
            sys.path.insert(0, str(ROOT))
        from tests.forked import run_forked

        return run_forked(args, cwd=ROOT, env=env, module=str(script) if script else "dlrecipes")
    command = [sys.executable, str(script)] if script else [sys.executable, "-m", "dlrecipes"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=ROOT, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--models", default="resnet18_cifar")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as runs:
        for model in args.models.split(","):
            spec, shape, classes = MODELS[model]
            for label, extra in configs(args.device, args.batch):
                run = f"{model}-{len(results)}"
                command = [
                    "train",
                    str(ROOT / "recipes" / "quickstart.yaml"),
                    f"model={spec}",
                    f"dataset={{name: synthetic, input_shape: {list(shape)}, num_classes: {classes}, "
                    f"train_samples: {args.steps * args.batch}, eval_samples: {args.batch}}}",
                    f"trainer.batch_size={args.batch}",
                    "trainer.max_duration=1ep",
                    f"trainer.device={args.device}",
                    "trainer.loader=device",
                    "trainer.num_workers=0",
                    "trainer.progress_bar=false",
                    "trainer.console_log_interval=1000ep",
                    "checkpoint.save=false",
                    "checkpoint.monitor=null",
                    "scheduler=constant",
                    f"runs_dir={runs}",
                    f"run_name={run}",
                    *extra,
                ]
                start = time.perf_counter()
                done = own_process(command, args.device)
                wall = time.perf_counter() - start
                if done.returncode != 0:
                    print(f"{label}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                    continue
                summary = json.loads((Path(runs) / run / "summary.json").read_text())
                with open(Path(runs) / run / "history.csv") as f:
                    last = list(csv.DictReader(f))[-1]
                row = {
                    "model": model,
                    "config": label,
                    "train_s": float(last["elapsed_sec"]),
                    "process_s": wall,
                    "img_s": float(last["images_per_sec"]),
                    "peak_memory_mb": summary["peak_memory_mb"],
                    "train_loss": float(last["train_loss"]),
                }
                results.append(row)
                print(
                    f"{model:<15} {label:<38} train {row['train_s']:6.1f}s  {row['img_s']:7.1f} img/s  "
                    f"peak {row['peak_memory_mb']:7.0f} MiB  loss {row['train_loss']:.4f}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
