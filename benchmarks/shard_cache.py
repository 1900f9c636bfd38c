"""The shards cache under training's order, measured against a real S3 server: peak bytes held, downloads per shard
per epoch and epoch time, with the smallest cache limit dlrecipes accepts and with a limit that holds everything.

    python benchmarks/shard_cache.py [--images 600] [--epochs 3] [--processes 2] [--workers 2] [--batch 16]
        [--json OUT]

Random-pixel 96 px JPEGs are converted to shards of about 200 KB in a bucket of SeaweedFS (``weed``, started here on
loopback, killed at the end). Then, for each limit, ``--processes`` processes (the ranks of one node), each with
``--workers`` DataLoader workers, read ``--epochs`` epochs of the training order (dlrecipes.data.order: shards
shuffled, samples shuffled within windows of 4 shards) through one cache folder, every rank waiting for the others
after each batch as training's all-reduce makes them. Each download is logged with the bytes the cache then holds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rank(dataset, rank: int, args, step, log: Path, times: Path) -> None:
    from torch.utils.data import DataLoader

    from dlrecipes.data.order import ordered

    samples = ordered(dataset, args.batch, rank, args.processes, seed=11)
    per_rank = args.batch // args.processes
    for epoch in range(args.epochs):
        samples.sampler.set_epoch(epoch)
        loader = DataLoader(samples, batch_size=per_rank, sampler=samples.sampler, num_workers=args.workers)
        started = time.perf_counter()
        for _ in loader:
            step.wait(timeout=300)
        step.wait(timeout=300)
        if rank == 0:
            with open(log, "a") as out:
                out.write(f"epoch {epoch}\n")
            with open(times, "a") as out:
                out.write(f"{time.perf_counter() - started:.3f}\n")


def measure(remote: str, cache: Path, limit: int, args) -> dict:
    """One limit: the ranks read the epochs; what the log says."""
    from dlrecipes.data.shards.dataset import build_shards

    splits = build_shards(remote, str(cache), limit, 64, 72, None, 0.35, True, (0.5,) * 3, (0.25,) * 3)
    dataset = splits.train
    log, times = cache / "downloads.log", cache / "epochs.txt"
    folder = Path(dataset.cache.folder)
    fetch = dataset.fetch

    def logged(name: str, path: str) -> None:
        fetch(name, path)
        held = sum(p.stat().st_size for p in folder.glob("chunk-*.bin")) + Path(path).stat().st_size
        with open(log, "a") as out:
            out.write(f"{name} {held}\n")

    dataset.cache.fetch = logged
    step = multiprocessing.get_context("fork").Barrier(args.processes)
    ranks = []
    for rank in range(args.processes):
        process = multiprocessing.get_context("fork").Process(
            target=_rank, args=(dataset, rank, args, step, log, times)
        )
        process.start()
        ranks.append(process)
    for process in ranks:
        process.join()
        assert process.exitcode == 0, f"rank exited with {process.exitcode}"
    per_epoch, current, peak = [], {}, 0
    for line in log.read_text().splitlines():
        name, value = line.split()
        if name == "epoch":
            per_epoch.append(current)
            current = {}
        else:
            current[name] = current.get(name, 0) + 1
            peak = max(peak, int(value))
    largest = max(shard["bytes"] for shard in dataset.shards)
    return {
        "limit": limit,
        "peak": peak,
        "largest": largest,
        "downloads": [sum(epoch.values()) for epoch in per_epoch],
        "most_per_shard_epoch": max(max(epoch.values(), default=0) for epoch in per_epoch),
        "epoch_s": [float(t) for t in times.read_text().split()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()

    from dlrecipes.data.shards.cache import check_room, samples_in_flight
    from tests.conftest import image_folders
    from tests.s3_server import serving

    with tempfile.TemporaryDirectory() as tmp, serving(Path(tmp, "s3"), "data") as server:
        os.environ.update(server.env())
        classes = ["a", "b", "c"]
        source = image_folders(Path(tmp, "src"), classes, per_class=args.images // 3, size=(96, 96))
        convert = [sys.executable, "-m", "dlrecipes", "data", "convert", "image_folder",
                   f"train_path={source / 'train'}", f"val_path={source / 'val'}", "--format", "shards",
                   "--out", "s3://data/bench", "--shard-size", "200000"]  # fmt: skip
        subprocess.run(convert, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        from dlrecipes.data.shards.dataset import open_shards

        _, meta, _ = open_shards("s3://data/bench", "100GB")
        shards = meta["splits"]["train"]["shards"]
        total = sum(shard["bytes"] for shard in shards)
        span, _ = samples_in_flight(args.batch, args.batch, args.workers)["train"]
        try:
            check_room(shards, 1, span, True, "train")
        except Exception as exc:  # the line gives the least limit that holds the window
            least = int(str(exc).split("give at least ")[1].split(", or")[0].replace(",", ""))
        print(
            f"{len(shards)} train shards, {total:,} bytes; {args.processes} processes x {args.workers} workers, "
            f"global batch {args.batch}, {args.epochs} epochs; least limit accepted: {least:,} bytes",
            flush=True,
        )
        report = {"shards": len(shards), "bytes": total, "least": least}
        for name, limit in (("least accepted", least), ("holds everything", 10 * total)):
            result = report[name] = measure("s3://data/bench", Path(tmp, f"cache-{limit}"), limit, args)
            print(
                f"{name:>16}: limit {limit:,}, peak {result['peak']:,} (limit + largest shard "
                f"{limit + result['largest']:,}); downloads per epoch {result['downloads']}, most of one shard in an "
                f"epoch {result['most_per_shard_epoch']}; epoch seconds {result['epoch_s']}",
                flush=True,
            )
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
