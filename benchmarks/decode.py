"""Images per second per core, decoding and cropping the same JPEGs three ways: PIL, libjpeg-turbo (dlrecipes'
``dataset.decode: turbo``) and FFCV.

    python benchmarks/decode.py [--images 400] [--crops 160,224] [--min-scale 0.25] [--json out.json]

One process, one thread (torch.set_num_threads(1), no DataLoader workers): each path's cost per image on one core,
the training transform (random-resized crop, flip) included; PIL and turbo also normalise to float32 in the worker,
FFCV's pipeline does not (dlrecipes' FFCV loader normalises on the GPU). The images are photo-like
JPEGs at quality 90 (benchmarks/data_loading.py's generator): 500x375 (about 100 KB each, as ImageNet's average),
then the same kind stored at 256x192. PIL and turbo read the files, FFCV its .beton file written from them
(``--max-resolution``: the side FFCV stores, 256 as ffcv-imagenet's recipes: the 500 px files re-encoded at that
size, which is most of what makes FFCV fast on them; the 256 px files compare the three on the same stored pixels). FFCV
runs in a subprocess (importing it sets torch's threads to 1 for the whole process) with one worker thread; its
first epoch compiles its pipeline (numba), so the rate is its second epoch's. Each path is timed over
``--repeats`` passes after one warm-up pass, and the best pass is reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.data_loading import make_images  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def folder_rate(root: Path, crop: int, min_scale: float, decode: str, repeats: int) -> float:
    from dlrecipes.data.image_folder import build_image_folders

    split = build_image_folders(
        str(root / "train"), str(root / "train"), crop, crop, min_scale, True, MEAN, STD, decode=decode
    ).train
    best = 0.0
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        for i in range(len(split)):
            split[i]
        rate = len(split) / (time.perf_counter() - start)
        best = max(best, rate) if attempt else best  # the first pass warms the page cache
    return best


FFCV_RATE = """
import sys, time, torch
sys.path.insert(0, sys.argv[1])
from benchmarks.data_loading import ffcv_loader
from pathlib import Path
root, crop, min_scale = Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
resolution, repeats = int(sys.argv[5]), int(sys.argv[6])
loader = ffcv_loader(root, 50, 1, crop, resolution, min_scale)
loader.loader.pipeline_specs  # built
best = 0.0
for epoch in range(repeats + 1):
    start, seen = time.perf_counter(), 0
    for images, labels in loader:
        seen += len(labels)
    rate = seen / (time.perf_counter() - start)
    best = max(best, rate) if epoch else best  # the first epoch compiles the pipeline
print(best)
"""


def ffcv_rate(root: Path, crop: int, min_scale: float, resolution: int, repeats: int) -> float | None:
    try:
        import ffcv  # noqa: F401
    except ImportError:
        return None
    repo = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", FFCV_RATE, repo, str(root), str(crop), str(min_scale), str(resolution), str(repeats)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.split()[-1])


def nvjpeg_rate(root: Path, batch: int = 128) -> float | None:
    """Batched decode of the files on the GPU (nvJPEG through torchvision.io.decode_jpeg), images per second."""
    if not torch.cuda.is_available():
        return None
    from torchvision.io import decode_jpeg

    files = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in sorted(root.rglob("*.jpg"))]
    decode_jpeg(files[:batch], device="cuda")  # warm-up: the decoder's state and memory
    torch.cuda.synchronize()
    start = time.perf_counter()
    for first in range(0, len(files), batch):
        decode_jpeg(files[first : first + batch], device="cuda")
    torch.cuda.synchronize()
    return len(files) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--crops", default="160,224")
    parser.add_argument("--min-scale", type=float, default=0.25, help="random-resized-crop's smallest area")
    parser.add_argument("--max-resolution", type=int, default=256, help="the side FFCV stores")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for stored in ((500, 375), (256, 192)):  # ImageNet-like originals; and stored at 256 px, as FFCV stores them
            root = Path(tmp) / f"{stored[0]}px"
            make_images(root, args.images, classes=10, size=stored)
            for crop in (int(c) for c in args.crops.split(",")):
                row = {
                    "pil": folder_rate(root, crop, args.min_scale, "pil", args.repeats),
                    "turbo": folder_rate(root, crop, args.min_scale, "turbo", args.repeats),
                    "ffcv": ffcv_rate(root, crop, args.min_scale, args.max_resolution, args.repeats),
                }
                results[f"{stored[0]}x{stored[1]} files, {crop} px"] = row
                ffcv = f"{row['ffcv']:,.0f}" if row["ffcv"] else "n/a (ffcv not installed)"
                print(
                    f"{stored[0]}x{stored[1]} files, {crop} px crops: PIL {row['pil']:,.0f}  turbo {row['turbo']:,.0f}"
                    f" ({row['turbo'] / row['pil']:.2f}x PIL)  FFCV (stored at {args.max_resolution} px) {ffcv} "
                    "images/s per core",
                    flush=True,
                )
        gpu = nvjpeg_rate(Path(tmp) / "500px")
        print(f"nvJPEG batched decode: {gpu:,.0f} images/s" if gpu else "nvJPEG: no GPU here", flush=True)
    meta = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results, "nvjpeg": gpu}, indent=2))


if __name__ == "__main__":
    main()
