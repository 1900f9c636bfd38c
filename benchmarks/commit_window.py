"""The commit of a bucket run (dlrecipes.records.store.commit) with and without conditional writes: how long a commit
takes, and, on a server without them, the window a frozen writer's late commit could still land in.

    python benchmarks/commit_window.py [--commits 200] [--json OUT]

Against a local S3 server (SeaweedFS's ``weed``, started here on loopback and killed at the end), one writer moves a
run's pointer ``--commits`` times, first as on S3 (``If-Match`` on the ETag it last wrote: the server refuses a
stale commit, there is no window), then as on a server without conditional writes (the pointer read back before
and after the write). For the second, the window is the time from the read that found the pointer as this writer
left it to the end of its write: another writer's commit landing inside it would be overwritten unseen. Each
commit's duration and window are measured on this machine's clock; the median, 99th percentile and largest are
printed, and written with ``--json``. (tests/test_benchmarks.py runs it with a few commits.)
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


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def measure(commits: int, conditional: bool, run: str) -> dict[str, dict[str, float]]:
    """``commits`` commits of one writer to ``s3://bench/<run>``: each one's duration and, without conditional
    writes, its window (the read that found the pointer unchanged, to the end of the write)."""
    from dlrecipes.records.store.bucket import RemoteRoot, object_store
    from dlrecipes.records.store.commit import Commit

    root = RemoteRoot.parse("s3://bench/runs")
    store = object_store(root)
    store.conditional_writes = conditional
    commit = Commit(store, root.key(run, "checkpoints/latest.txt"), "w0123abcd")
    commit.read(f"{root}/{run}")
    marks: dict[str, float] = {}
    read_tagged, write = store.read_tagged, store.write

    def timed_read(key):
        answer = read_tagged(key)
        marks.setdefault("read", time.perf_counter())  # the first read of a commit: the check before the write
        return answer

    def timed_write(key, data, **conditions):
        etag = write(key, data, **conditions)
        marks["written"] = time.perf_counter()
        return etag

    store.read_tagged, store.write = timed_read, timed_write
    durations, windows = [], []
    try:
        for n in range(1, commits + 1):
            marks.clear()
            began = time.perf_counter()
            commit.write(commit.next(f"ep{n}-ba{n}-rank0.w0123abcd.pt", (0, 0)))
            durations.append(time.perf_counter() - began)
            if not conditional:
                windows.append(marks["written"] - marks["read"])
    finally:
        store.read_tagged, store.write = read_tagged, write
        store.conditional_writes = True
    result = {"commit": _percentiles(durations)}
    if windows:
        result["window"] = _percentiles(windows)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    from tests.s3_server import start_s3_server

    with tempfile.TemporaryDirectory() as tmp:
        server = start_s3_server(Path(tmp) / "s3")
        try:
            server.create_bucket("bench")
            os.environ.update(server.env())
            results = {
                "conditional (If-Match)": measure(args.commits, True, "conditional"),
                "read back (no conditional writes)": measure(args.commits, False, "read-back"),
            }
        finally:
            server.kill()
    print(f"{args.commits} commits each, on a local SeaweedFS:")
    for name, result in results.items():
        line = f"  {name}: commit median {result['commit']['median_ms']} ms, p99 {result['commit']['p99_ms']} ms"
        if "window" in result:
            window = result["window"]
            line += (
                f"; window a late commit could land in: median {window['median_ms']} ms, p99 {window['p99_ms']} ms, "
                f"max {window['max_ms']} ms"
            )
        else:
            line += "; no window (the server refuses a stale commit)"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"commits": args.commits, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
