"""One rank of a small multi-process run of our Trainer (gloo on the CPU), for tests/test_engine_ranks.py.

    python -m tests.engine_ranks SCENARIO OUT_DIR     (RANK, WORLD_SIZE, MASTER_ADDR, ... set by the test)

Each scenario builds :class:`dlrecipes.engine.Trainer` directly on a linear classifier and
tensors, trains, and saves what the test compares to ``OUT_DIR/rank<N>.pt``.  A user error
ends the process with its one line on stderr and exit code 2, as the CLI does.
``ENGINE_DEVICE=gpu`` trains on each rank's GPU with NCCL (benchmarks/gpu_check.py), and
``REFERENCE=1`` with Composer's own Trainer.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from composer.core import Callback
from composer.loggers import InMemoryLogger
from composer.models import ComposerClassifier
from composer.utils import dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def model() -> ComposerClassifier:
    torch.manual_seed(0)
    return ComposerClassifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3)), num_classes=3)


def data(samples: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 6, generator=g), torch.randint(0, 3, (samples,), generator=g))


def shard(dataset, **kwargs) -> DistributedSampler:
    """This rank's share (made before the Trainer starts the process group)."""
    return DistributedSampler(dataset, num_replicas=WORLD, rank=RANK, **kwargs)


class NaNAt(Callback):
    """Makes the loss NaN on one rank at one batch (before the NaN monitor looks at it)."""

    def __init__(self, rank: int, batch: int):
        self.rank, self.batch = rank, batch

    def after_loss(self, state, logger):
        if RANK == self.rank and int(state.timestamp.batch) == self.batch:
            state.loss = state.loss * float("nan")


class Stall(Callback):
    """One rank stops answering for a while after a batch (a hung or preempted peer)."""

    def __init__(self, rank: int, batch: int, seconds: float):
        self.rank, self.batch, self.seconds = rank, batch, seconds

    def batch_end(self, state, logger):
        if RANK == self.rank and int(state.timestamp.batch) == self.batch:
            time.sleep(self.seconds)


class CountReductions(Callback):
    """Counts the host-side reductions of the training loop (from FIT_START to FIT_END)."""

    def __init__(self):
        self.count, self.active = 0, False
        from dlrecipes.core.distributed import HostReducer

        original = HostReducer.start

        def counted(reducer, *args, **kwargs):
            self.count += self.active
            return original(reducer, *args, **kwargs)

        HostReducer.start = counted

    def fit_start(self, state, logger):
        self.active = True

    def fit_end(self, state, logger):
        self.active = False


def trainer(loader, callbacks=(), **kwargs):
    if os.environ.get("REFERENCE"):  # Composer's own Trainer, for comparison
        from composer import Trainer

        kwargs.pop("train_metrics_interval", None)
    else:
        from dlrecipes.engine import Trainer

    memory = InMemoryLogger()
    made = Trainer(
        model=model(),
        train_dataloader=loader,
        max_duration=kwargs.pop("max_duration", "2ep"),
        optimizers=None,
        device=os.environ.get("ENGINE_DEVICE", "cpu"),
        loggers=[memory],
        callbacks=list(callbacks),
        progress_bar=False,
        log_to_console=False,
        seed=1,
        **kwargs,
    )
    return made, memory


def result(made, memory, **extra):
    losses = [float(v) for v in memory.get_timeseries("loss/train/total")["loss/train/total"]]
    return {
        "params": {k: v.detach().cpu().clone() for k, v in made.state.model.state_dict().items()},
        "batches": int(made.state.timestamp.batch),
        "samples": int(made.state.timestamp.sample),
        "losses": losses,
        **extra,
    }


def uneven(out: Path) -> dict:
    """Each rank samples its own dataset (36 and 48 samples, 18 and 24 a rank): rank 0 has 5 batches an
    epoch, the last of 2 samples, and rank 1 has 6 of 4.  Every rank trains 5, weighing the 5th batches
    by their sizes as Composer does."""
    dataset = data(36 + 12 * RANK, seed=RANK)
    loader = DataLoader(dataset, batch_size=4, sampler=shard(dataset, shuffle=False))
    counter = CountReductions()
    made, memory = trainer(loader, callbacks=[counter], train_metrics_interval=1)
    made.fit()
    top1 = made.state.train_metric_values.get("MulticlassAccuracy")
    return result(made, memory, train_top1=None if top1 is None else float(top1), reductions=counter.count)


def equal(out: Path) -> dict:
    """One dataset sharded by a DistributedSampler: the ranks agree once per epoch, then reduce nothing."""
    dataset = data(40)
    loader = DataLoader(dataset, batch_size=4, sampler=shard(dataset, shuffle=True, seed=3))
    counter = CountReductions()
    made, memory = trainer(loader, callbacks=[counter])
    made.fit()
    return result(made, memory, reductions=counter.count)


def nan_skip(out: Path) -> dict:
    """NaN on rank 1 only, at batch 3, with nan_monitor's skip: every rank skips that step."""
    from dlrecipes.callbacks.monitors import NaNMonitor

    monitor = NaNMonitor(out, action="skip")
    dataset = data(40)
    loader = DataLoader(dataset, batch_size=4, sampler=shard(dataset, shuffle=False))
    made, memory = trainer(loader, callbacks=[NaNAt(rank=1, batch=3), monitor], max_duration="1ep")
    made.fit()
    return result(made, memory, skipped=monitor.skipped)


def nan_stop(out: Path) -> dict:
    """NaN on rank 1 only with nan_monitor's stop: every rank stops with the same one line."""
    from dlrecipes.callbacks.monitors import NaNMonitor

    dataset = data(40)
    loader = DataLoader(dataset, batch_size=4, sampler=shard(dataset, shuffle=False))
    made, memory = trainer(
        loader, callbacks=[NaNAt(rank=1, batch=3), NaNMonitor(out, action="stop")], max_duration="1ep"
    )
    made.fit()
    return result(made, memory)


def stalled_peer(out: Path) -> dict:
    """Rank 1 stops answering for 25 s after batch 2; the others give up after dist_timeout (4 s)."""
    dataset = data(48 + 8 * RANK, seed=RANK)  # uneven: host reductions every batch
    loader = DataLoader(dataset, batch_size=4, sampler=shard(dataset, shuffle=False))
    made, memory = trainer(loader, callbacks=[Stall(rank=1, batch=2, seconds=25)], dist_timeout=4.0)
    made.fit()
    return result(made, memory)


SCENARIOS = {f.__name__: f for f in (uneven, equal, nan_skip, nan_stop, stalled_peer)}


def main() -> int:
    from dlrecipes.errors import UserError

    scenario, out = sys.argv[1], Path(sys.argv[2])
    try:
        found = SCENARIOS[scenario](out)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.save(found, out / f"rank{dist.get_global_rank()}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
