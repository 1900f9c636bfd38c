"""What crash-safe checkpoint writes cost: Composer's in-place write vs dlrecipes' atomic one.

    python benchmarks/checkpoint_save.py [--model resnet50] [--rounds 5]

Both save the same ResNet state (weights, buffers and SGD momentum, the size of a real
checkpoint) to the same folder, alternating, for --rounds rounds: "plain" is ``torch.save``
into the final name (what Composer's saver does); "atomic" is dlrecipes' path: write
``<name>-partial``, fsync the file, rename, fsync the folder, relink ``latest``.  The
difference is the price of never leaving a half-written checkpoint under a real name; it is
mostly the fsync, i.e. the time to get the bytes onto the disk rather than the page cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dlrecipes.records.checkpoints import atomic_write, relink  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a torchvision classification model")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    model = getattr(torchvision.models, args.model)()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    optimizer.step()  # momentum buffers exist, as in a real checkpoint
    state = {"state": {"model": model.state_dict(), "optimizers": optimizer.state_dict()}}

    times: dict[str, list[float]] = {"plain": [], "atomic": []}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        folder = Path(tmp)
        for r in range(args.rounds):
            for kind in ("plain", "atomic") if r % 2 == 0 else ("atomic", "plain"):
                path = folder / f"{kind}-{r}.pt"
                start = time.perf_counter()
                if kind == "plain":
                    with open(path, "wb") as f:
                        torch.save(state, f)
                else:
                    atomic_write(path, lambda f: torch.save(state, f))
                    relink(folder / "latest-rank0.pt", path)
                times[kind].append(time.perf_counter() - start)
        size = (folder / "plain-0.pt").stat().st_size
    plain, atomic = statistics.median(times["plain"]), statistics.median(times["atomic"])
    print(f"{args.model}: checkpoint {size / 2**20:.0f} MiB, medians of {args.rounds} alternating rounds")
    print("| write | median s | MiB/s |\n|---|---|---|")
    print(f"| plain (torch.save in place) | {plain:.3f} | {size / 2**20 / plain:.0f} |")
    print(f"| atomic (partial + fsync + rename + relink) | {atomic:.3f} | {size / 2**20 / atomic:.0f} |")
    print(f"atomic / plain: {atomic / plain:.2f}x")


if __name__ == "__main__":
    main()
