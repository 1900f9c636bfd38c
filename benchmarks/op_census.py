"""The aten ops a steady training step dispatches: dlrecipes' Trainer against the plain loop of ``dlrecipes bench``.

    python benchmarks/op_census.py [--steps 10] [--batch 8] [--train-metrics-interval 10] [--json out.json]

Both train the same model (CIFAR ResNet-18 by default, the GPU speed suite's case: synthetic 32 px data on
the device loader, ``decoupled_sgdw``, channels-last; fp32, on the CPU) from the same weights on the same
batches, and a dispatch mode counts every aten op of ``--steps`` steps after three warm-up steps. On a GPU
each op is at least one kernel launch: an op ours adds costs the step time whatever its size. Printed: the
ops per step of each, then every op whose count differs, with where in our code it comes from.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
CASE = [
    "model={name: cifar_resnet18}",
    "trainer.device=cpu",
    "trainer.loader=device",
    "trainer.num_workers=0",
    "optimizer={name: decoupled_sgdw, lr: 0.1, momentum: 0.9, weight_decay: 5.0e-5}",
    "scheduler=constant",
    "algorithms={channels_last: {}}",
]


class OpCounter(TorchDispatchMode):
    """Counts each aten op by name, and by the innermost frame outside torch that called it."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.where: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        frame = sys._getframe(1)
        while frame is not None and ("/torch/" in frame.f_code.co_filename or frame.f_code.co_filename == __file__):
            frame = frame.f_back
        if frame is not None:
            self.where[
                (str(func), f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}")
            ] += 1
        return func(*args, **(kwargs or {}))


def census(overrides: list[str], steps: int = 10) -> dict:
    """Ops per step of the plain loop and of dlrecipes, and where each op that differs comes from."""
    from composer.core import Callback

    from dlrecipes import builders
    from dlrecipes.api import resolve
    from dlrecipes.builders import build_bench_trainer
    from dlrecipes.core.devices import torch_device
    from dlrecipes.losses import build_loss
    from dlrecipes.records.store import TrainingRun
    from dlrecipes.tools.bench import PlainLoop, _bench_config, in_memory_batches, one_epoch

    config = _bench_config(resolve(ROOT / "recipes" / "quickstart.yaml", [*CASE, *overrides]))
    device = torch_device("cpu")
    batches = in_memory_batches(config, 8, device)
    warmup = 3
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_bench_trainer(
            TrainingRun.in_folder(config, Path(tmp), "cpu"), one_epoch(batches, warmup + steps + 1)
        )
        module = copy.deepcopy(trainer.state.model.module)  # the same weights
        plain = PlainLoop(
            module,
            builders.build_optimizer(config.optimizer, module),
            build_loss(config.loss),
            config.trainer.precision,
            None,
            "channels_last" in config.algorithms,
            device,
        )
        for i in range(warmup):
            plain.step(*batches[i % len(batches)])
        plain_ops = OpCounter()
        with plain_ops:
            for i in range(warmup, warmup + steps):
                plain.step(*batches[i % len(batches)])
        ours = OpCounter()

        class Window(Callback):
            def batch_start(self, state, logger):
                if int(state.timestamp.batch) == warmup:
                    ours.__enter__()

            def batch_end(self, state, logger):
                if int(state.timestamp.batch) == warmup + steps:
                    ours.__exit__(None, None, None)

        trainer.state.callbacks.append(Window())
        trainer.fit(duration=f"{warmup + steps}ba")
        trainer.close()
    differing = sorted({op for op in set(plain_ops.ops) | set(ours.ops) if plain_ops.ops[op] != ours.ops[op]})
    return {
        "steps": steps,
        "batch": len(batches[0][1]),
        "train_metrics_interval": config.trainer.train_metrics_interval,
        "plain_ops_per_step": sum(plain_ops.ops.values()) / steps,
        "ours_ops_per_step": sum(ours.ops.values()) / steps,
        "extra_per_step": {op: (ours.ops[op] - plain_ops.ops[op]) / steps for op in differing},
        # the differing ops' sites outside the model's forward, the loss and backward (which both loops run)
        "ours_from": {
            f"{op} @ {where}": n / steps
            for (op, where), n in sorted(ours.where.items())
            if op in differing and not where.endswith((" forward", " _train_microbatch_direct", " soft_cross_entropy"))
        },
    }


def format_census(result: dict) -> str:
    lines = [
        f"ops per step (batch {result['batch']}, {result['steps']} steps, train metrics every "
        f"{result['train_metrics_interval']} batches): plain loop {result['plain_ops_per_step']:.1f}, "
        f"dlrecipes {result['ours_ops_per_step']:.1f}",
        "",
        "| op | dlrecipes - plain, per step |",
        "|---|---|",
    ]
    lines += [f"| {op} | {n:+.1f} |" for op, n in result["extra_per_step"].items()]
    lines += ["", "where ours come from, outside the forward, loss and backward (per step):"] + [
        f"  {n:5.1f}  {k}" for k, n in result["ours_from"].items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--train-metrics-interval", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    data = (
        f"dataset={{name: synthetic, input_shape: [3, 32, 32], num_classes: 10, train_samples: {8 * args.batch}, "
        f"eval_samples: {args.batch}}}"
    )
    result = census(
        [data, f"trainer.batch_size={args.batch}", f"trainer.train_metrics_interval={args.train_metrics_interval}"],
        args.steps,
    )
    print(format_census(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
