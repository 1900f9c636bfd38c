"""What the check before every checkpoint load costs: the pickle read as instructions and each tensor record's size
compared with what the pickle declares (``records/checkpoint_file.file_problem``), against the load it guards.

    python benchmarks/checkpoint_check.py [--model resnet50] [--rounds 5]

The file is a ResNet's state as Composer saves it (weights, buffers, an SGD momentum buffer per weight), written
once to a temporary folder; each round times the check, torch's own listing of the pickle's globals (what the
tensors-only refusal reads), and the tensors-only load, alternating. Medians are printed.
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
from dlrecipes.records.checkpoint_file import file_problem  # noqa: E402
from dlrecipes.records.checkpoint_safety import load_file, unsafe_globals  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a torchvision classification model")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    model = getattr(torchvision.models, args.model)()
    weights = {f"module.{k}": v for k, v in model.state_dict().items()}
    momentum = {k: {"momentum_buffer": v.clone()} for k, v in weights.items() if v.is_floating_point()}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{args.model}.pt"
        torch.save({"state": {"model": weights, "optimizers": {"SGD": {"state": momentum}}}, "rng": []}, path)
        size = path.stat().st_size
        assert file_problem(path) is None, file_problem(path)
        times: dict[str, list[float]] = {"check": [], "globals": [], "load": []}
        for _ in range(args.rounds):
            for name, step in (
                ("check", lambda: file_problem(path)),
                ("globals", lambda: unsafe_globals(path)),
                ("load", lambda: load_file(path)),
            ):
                started = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - started)
    tensors = len(weights) + len(momentum)
    print(f"{args.model}: {tensors} tensors, {size / 2**20:.0f} MiB, {args.rounds} rounds (medians)")
    for name, what in (
        ("check", "the records' check"),
        ("globals", "torch's globals listing"),
        ("load", "the tensors-only load"),
    ):
        print(f"  {what:<24} {statistics.median(times[name]) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
