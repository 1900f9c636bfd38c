"""Which streaming library holds dlrecipes' dataset shards: MosaicML Streaming, litdata and WebDataset measured on the
same generated JPEGs, written in each one's format to a local SeaweedFS bucket (tests/s3_server.py) and read back.

Each library runs in a process of its own with ``PYTHONPATH`` pointing at a folder it was installed into, outside the
project's venv (``pip install --target /tmp/lib-NAME PACKAGE``; MosaicML Streaming pins numpy<2.2 and would downgrade
the venv's numpy)::

    python benchmarks/shard_libraries.py --images 2000 \\
        --lib streaming=/tmp/lib-streaming --lib litdata=/tmp/lib-litdata --lib webdataset=/tmp/lib-webdataset

Per library: samples/s reading the whole split sequentially and in a random order by index, each from an empty local
cache (cold); whether random access by index works through the library's cache; whether a cache limit holds (the
largest the cache folder grew while reading the whole split under a limit of a quarter of it); whether the library's
own loader resumes mid-epoch exactly (the samples after a state saved at batch 5 equal an uninterrupted epoch's).
Every figure is measured; a library that cannot do a thing says so in its row ("no").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "bench"
CHUNK_BYTES = 1 << 20  # 1 MiB shards: ~50 samples each, several dozen shards for a few thousand images


def make_images(folder: Path, count: int, classes: int = 10) -> list[tuple[Path, int]]:
    """``count`` JPEGs of about 20 KB (a smooth gradient under noise, 160x160, quality 90), labels cycling."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    ramp = np.linspace(0, 180, 160, dtype=np.float32)
    for i in range(count):
        base = ramp[None, :, None] + ramp[:, None, None] * rng.uniform(0, 0.5, 3)[None, None, :]
        pixels = np.clip(base + rng.normal(0, 40, (160, 160, 3)), 0, 255).astype(np.uint8)
        path = folder / f"{i:06d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        made.append((path, i % classes))
    return made


class CacheWatch:
    """The largest a folder grew, sampled every 20 ms in a thread while reading."""

    def __init__(self, folder: str):
        self.folder, self.peak, self._stop = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.folder):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(dirpath, name))
                except OSError:
                    pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._size())
            time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._size())


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def s3_client():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"], region_name="us-east-1")


def upload_folder(local: str, prefix: str) -> None:
    client = s3_client()
    for name in sorted(os.listdir(local)):
        client.upload_file(os.path.join(local, name), BUCKET, f"{prefix}/{name}")


# ------------------------------------------------------------------ litdata
def bench_litdata(samples: list[tuple[bytes, int]], work: Path) -> dict:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.writer import BinaryWriter

    # litdata 0.2.76 downloads chunks through obstore, which refuses a plain-http endpoint (the local SeaweedFS)
    # unless its client is told allow_http; the module's client options are the only place to say so
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"

    out = str(work / "litdata-out")
    writer = BinaryWriter(out, chunk_bytes=CHUNK_BYTES)
    for i, (data, label) in enumerate(samples):
        writer[i] = {"image": data, "label": label}
    writer.done()
    writer.merge()
    upload_folder(out, "litdata")
    remote, opts = f"s3://{BUCKET}/litdata", {"endpoint_url": os.environ["S3_ENDPOINT_URL"]}
    total = sum(len(d) for d, _ in samples)

    def dataset(tag: str, limit=None, shuffle=False):
        return StreamingDataset(
            remote,
            cache_dir=str(work / f"lit-{tag}"),
            storage_options=opts,
            shuffle=shuffle,
            max_cache_size=limit or "100GB",
        )

    seq = dataset("seq")
    t_seq, n = timed(lambda: sum(1 for _ in seq))
    order = list(range(len(samples)))
    random.Random(0).shuffle(order)
    ranged = dataset("ranged")  # litdata's default for an index: the sample's byte range, nothing cached
    try:
        t_ranged, _ = timed(lambda: [ranged[i] for i in order])
        ranged_rate = len(order) / t_ranged
    except Exception as error:  # noqa: BLE001 (a measurement: what failed is the result)
        ranged_rate = f"fails: {type(error).__name__}: {str(error)[:80]}"
    whole = dataset("whole")
    whole[0:1]  # an index's slice reads whole chunks into the cache (as iteration does) and keeps doing so
    t_whole, _ = timed(lambda: [whole[i] for i in order])
    limit = max(total // 4, 5 * CHUNK_BYTES)
    cached = dataset("cached", limit=limit)
    cached[0:1]
    with CacheWatch(str(work / "lit-cached")) as watch:
        t_cached, got = timed(lambda: [cached[i] for i in order])
    exact = all(got[k]["image"] == samples[i][0] and got[k]["label"] == samples[i][1] for k, i in enumerate(order))
    return {
        "sequential": n / t_seq,
        "random (byte ranges)": ranged_rate,
        "random (chunk cache)": len(order) / t_whole,
        "random (chunk cache, limit)": len(order) / t_cached,
        "random equals source": exact,
        "cache limit": limit,
        "cache peak": watch.peak,
        "resume": resume_litdata(StreamingDataLoader, lambda: dataset("res", shuffle=True)),
    }


def resume_litdata(loader_cls, make) -> bool:
    full = [int(x) for b in loader_cls(make(), batch_size=16, num_workers=0) for x in b["label"]]
    first = loader_cls(make(), batch_size=16, num_workers=0)
    seen, state = [], None
    for k, batch in enumerate(first):
        seen += [int(x) for x in batch["label"]]
        if k == 4:
            state = first.state_dict()
            break
    second = loader_cls(make(), batch_size=16, num_workers=0)
    second.load_state_dict(state)
    rest = [int(x) for b in second for x in b["label"]]
    return seen + rest == full


# ------------------------------------------------------------------ MosaicML Streaming
def bench_streaming(samples: list[tuple[bytes, int]], work: Path) -> dict:
    from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    remote = f"s3://{BUCKET}/streaming"
    with MDSWriter(
        out=(str(work / "mds-out"), remote), columns={"image": "bytes", "label": "int"}, size_limit=CHUNK_BYTES
    ) as writer:
        for data, label in samples:
            writer.write({"image": data, "label": label})
    total = sum(len(d) for d, _ in samples)

    def dataset(tag: str, limit=None, shuffle=False):
        clean_stale_shared_memory()
        return StreamingDataset(
            remote=remote,
            local=str(work / f"mds-{tag}"),
            shuffle=shuffle,
            batch_size=16,
            cache_limit=limit,
            shuffle_seed=0,
        )

    seq = dataset("seq")
    t_seq, n = timed(lambda: sum(1 for _ in seq))
    order = list(range(len(samples)))
    random.Random(0).shuffle(order)
    rand = dataset("rand")
    t_rand, _ = timed(lambda: [rand[i] for i in order])
    limit = max(total // 4, 5 * CHUNK_BYTES)  # Streaming refuses less than 4 shards
    cached = dataset("cached", limit=limit)
    with CacheWatch(str(work / "mds-cached")) as watch:
        t_cached, got = timed(lambda: [cached[i] for i in order])
    exact = all(got[k]["image"] == samples[i][0] and got[k]["label"] == samples[i][1] for k, i in enumerate(order))
    return {
        "sequential": n / t_seq,
        "random (chunk cache)": len(order) / t_rand,
        "random (chunk cache, limit)": len(order) / t_cached,
        "random equals source": exact,
        "cache limit": limit,
        "cache peak": watch.peak,
        "resume": resume_streaming(StreamingDataLoader, lambda: dataset("res", shuffle=True)),
    }


def resume_streaming(loader_cls, make) -> bool:
    ds = make()
    full = [int(x) for b in loader_cls(ds, batch_size=16, num_workers=0) for x in b["label"]]
    del ds
    first = loader_cls(make(), batch_size=16, num_workers=0)
    seen, state = [], None
    for k, batch in enumerate(first):
        seen += [int(x) for x in batch["label"]]
        if k == 4:
            state = first.state_dict()
            break
    del first
    second = loader_cls(make(), batch_size=16, num_workers=0)
    second.load_state_dict(state)
    rest = [int(x) for b in second for x in b["label"]]
    return seen + rest == full


# ------------------------------------------------------------------ WebDataset
def bench_webdataset(samples: list[tuple[bytes, int]], work: Path) -> dict:
    import webdataset as wds

    out = work / "wds-out"
    out.mkdir()
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=CHUNK_BYTES, verbose=0) as sink:
        for i, (data, label) in enumerate(samples):
            sink.write({"__key__": f"{i:06d}", "jpg": data, "cls": str(label).encode()})
    upload_folder(str(out), "webdataset")
    client = s3_client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="webdataset/")["Contents"])
    signed = [
        client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=3600) for k in keys
    ]
    urls = [f"pipe:curl -s -f '{url}'" for url in signed]
    (work / "wds-seq").mkdir()
    seq = wds.WebDataset(urls, cache_dir=str(work / "wds-seq"), shardshuffle=False).to_tuple("jpg", "cls")
    t_seq, got = timed(lambda: list(seq))
    exact = all(got[i][0] == samples[i][0] and int(got[i][1]) == samples[i][1] for i in range(len(samples)))
    return {
        "sequential": len(got) / t_seq,
        "random (chunk cache)": "no (iterable only)",
        "random (chunk cache, limit)": "no",
        "random equals source": f"sequential: {exact}",
        "cache limit": "no (whole shards cached)",
        "cache peak": "-",
        "resume": "no (no loader state)",
    }


BENCHES = {"litdata": bench_litdata, "streaming": bench_streaming, "webdataset": bench_webdataset}


def worker(name: str, images: Path, work: Path) -> None:
    listing = json.loads((images / "labels.json").read_text())
    samples = [((images / f).read_bytes(), label) for f, label in listing]
    result = BENCHES[name](samples, work)
    print("RESULT " + json.dumps(result))


def installed_size(folder: str) -> int:
    return int(subprocess.run(["du", "-sb", folder], capture_output=True, text=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--lib", action="append", default=[], help="NAME=FOLDER the library was installed into")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--image-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, Path(args.image_dir), Path(args.work))
    sys.path.insert(0, str(ROOT))
    from tests.s3_server import start_s3_server

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        made = make_images(tmp / "images", args.images)
        (tmp / "images" / "labels.json").write_text(json.dumps([(p.name, label) for p, label in made]))
        mean_kb = sum(p.stat().st_size for p, _ in made) / len(made) / 1000
        print(f"{len(made)} JPEGs, {mean_kb:.1f} KB each on average")
        server = start_s3_server(tmp / "s3")
        try:
            server.create_bucket(BUCKET)
            for spec in args.lib:
                name, folder = spec.split("=", 1)
                env = {
                    **os.environ,
                    **server.env(),
                    "PYTHONPATH": f"{folder}:{ROOT}",
                    "AWS_ENDPOINT_URL": server.endpoint,
                    "AWS_ALLOW_HTTP": "true",
                }
                work = tmp / f"work-{name}"
                work.mkdir()
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--worker",
                        name,
                        "--work",
                        str(work),
                        "--image-dir",
                        str(tmp / "images"),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                result = json.loads(lines[-1][7:]) if lines else {"error": done.stderr.strip()[-3000:]}
                result["installed MB"] = installed_size(folder) / 1e6
                print(f"{name}: {json.dumps(result)}", flush=True)
        finally:
            server.kill()


if __name__ == "__main__":
    main()
