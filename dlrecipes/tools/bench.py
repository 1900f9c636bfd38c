"""Trainer overhead, measured side by side: the recipe through dlrecipes/Composer against a plain
hand-written PyTorch loop doing the same work.

Both get the same model (same initial weights), optimizer, precision, channels-last setting,
batch and microbatch, and the same batches already in memory (on the device), so only the
training-loop machinery differs.  The two run in alternating segments of ``steps`` batches,
``rounds`` times, so drifts in machine speed hit both; the result is the median throughput of
each and the median of the per-round ratios.  A Composer segment is one ``fit(duration=...)``
call timed from its first batch's start to its last batch's end: a real run calls ``fit`` once,
so the fixed cost of each extra call is not part of the per-step overhead.  The dlrecipes side is the Trainer that
``dlrecipes train`` builds (with the recipe's callbacks and our history/logging) minus
evaluation and checkpoint writing; of the recipe's algorithms only ``channels_last`` is kept,
since the plain loop does not reproduce the others.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from dlrecipes import builders
from dlrecipes.config import RecipeConfig
from dlrecipes.core.devices import device_name, resolve_device, torch_device
from dlrecipes.core.precision import precision_of
from dlrecipes.errors import RecipeError
from dlrecipes.records.store import TrainingRun


def in_memory_batches(
    config: RecipeConfig, count: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``count`` training batches of the recipe's data, on ``device``."""
    data = builders.build_datasets(config.dataset)
    loader, _ = builders.build_dataloaders(data, config.trainer, device_name(device), config.trainer.seed)
    loader = getattr(loader, "dataloader", loader)
    batches = []
    while len(batches) < count:
        for x, y in loader:
            batches.append((x.to(device), y.to(device)))
            if len(batches) == count:
                break
    return batches


class BatchList(list):
    """Batches in memory, with the ``batch_size`` attribute Composer reads from dataloaders."""

    def __init__(self, batches: list):
        super().__init__(batches)
        self.batch_size = len(batches[0][1])


def one_epoch(batches: list, count: int):
    """A DataSpec cycling through ``batches`` for ``count`` steps: the timed steps stay inside
    one epoch, so per-epoch work (history rows, log flushes) is not charged to a few steps."""
    from composer.core import DataSpec

    cycled = BatchList([batches[i % len(batches)] for i in range(count)])
    return DataSpec(cycled, num_samples=sum(len(b[1]) for b in cycled))


class PlainLoop:
    """What one would write by hand: forward, loss, backward, step, with AMP and accumulation."""

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Any,
        precision: str,
        microbatch: int | None,
        channels_last: bool,
        device: torch.device,
    ):
        self.module, self.optimizer, self.loss_fn = module.train(), optimizer, loss_fn
        self.microbatch = microbatch
        self.channels_last = channels_last
        facts = precision_of(precision)
        dtype = getattr(torch, facts.autocast_dtype) if facts.autocast_dtype else None
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else nullcontext
        self.scaler = torch.amp.GradScaler(device.type) if facts.grad_scaler else None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        self.optimizer.zero_grad(set_to_none=True)
        chunks = x.shape[0] // self.microbatch if self.microbatch else 1
        for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):
            with self.autocast():
                loss = self.loss_fn(self.module(xs), ys) * (xs.shape[0] / x.shape[0])
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class _SegmentTimer:
    """Times a ``fit(duration=...)`` segment from its first batch's start to its last batch's end,
    so the fixed cost of each extra ``fit`` call (which a real run pays once) is left out.

    Like the plain loop's timing, it waits for the device only at the two ends of a segment:
    a wait after every batch would stop the host from running ahead on one side only.
    """

    def __init__(self, device: torch.device):
        from composer.core import Callback

        timer = self

        class _Callback(Callback):
            def batch_start(self, state, logger):
                if timer.start is None:
                    _sync(device)
                    timer.start = time.perf_counter()

            def batch_end(self, state, logger):
                if int(state.timestamp.batch) == timer.last_batch:
                    _sync(device)
                    timer.end = time.perf_counter()

        self.callback = _Callback()
        self.start: float | None = None
        self.end: float | None = None
        self.last_batch = -1

    def reset(self, last_batch: int) -> None:
        self.start = self.end = None
        self.last_batch = last_batch

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _bench_config(config: RecipeConfig) -> RecipeConfig:
    """The recipe as benchmarked: no checkpoints, no console output, only the algorithms the plain loop
    can mirror (channels-last)."""
    if config.task is not None:
        raise RecipeError(
            "task: bench compares with a plain (image, label) loop; multi-input recipes are not benchmarked yet"
        )
    config = copy.deepcopy(config)
    config.algorithms = {k: v for k, v in config.algorithms.items() if k == "channels_last"}
    config.checkpoint.save, config.checkpoint.monitor = False, None
    config.trainer.progress_bar = False
    config.trainer.console_log_interval = "100000ep"
    return config


def _timed_rounds(plain_segment, composer_segment, steps: int, rounds: int, warmup: int, batch: int) -> dict:
    """Warm both up, then alternate timed segments of ``steps`` steps; medians over the rounds."""
    plain_segment(warmup)
    composer_segment(warmup)
    plain_rates, composer_rates, ratios, extra_ms = [], [], [], []
    for _ in range(rounds):
        plain_s, composer_s = plain_segment(steps), composer_segment(steps)
        plain_rates.append(steps * batch / plain_s)
        composer_rates.append(steps * batch / composer_s)
        ratios.append(plain_s / composer_s)
        extra_ms.append(1000 * (composer_s - plain_s) / steps)
    return {
        "plain_img_s": statistics.median(plain_rates),
        "dlrecipes_img_s": statistics.median(composer_rates),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "overhead_ms_per_step": statistics.median(extra_ms),
    }


def run_bench(config: RecipeConfig, steps: int = 30, rounds: int = 5, warmup: int = 5) -> dict[str, Any]:
    """The recipe's Trainer against a plain PyTorch loop on the same model, batches and optimizer."""
    from dlrecipes.builders import build_bench_trainer
    from dlrecipes.losses import build_loss

    config = _bench_config(config)
    t = config.trainer
    device_name = resolve_device(t.device)
    device = torch_device(device_name)
    channels_last = "channels_last" in config.algorithms
    batches = in_memory_batches(config, max(steps, 8), device)
    micro = t.device_train_microbatch_size if isinstance(t.device_train_microbatch_size, int) else None
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_bench_trainer(
            TrainingRun.in_folder(config, Path(tmp), device_name), one_epoch(batches, warmup + steps * rounds + 1)
        )
        timer = _SegmentTimer(device)
        trainer.state.callbacks.append(timer.callback)
        module = copy.deepcopy(trainer.state.model.module)  # same initial weights (and channels-last if applied)
        optimizer = builders.build_optimizer(config.optimizer, module)
        if t.compile is not False:  # the plain loop compiles too, with the recipe's options
            module = torch.compile(module, **({} if t.compile is True else t.compile))
        plain = PlainLoop(module, optimizer, build_loss(config.loss), t.precision, micro, channels_last, device)

        def plain_segment(n: int) -> float:
            _sync(device)
            start = time.perf_counter()
            for i in range(n):
                plain.step(*batches[i % len(batches)])
            _sync(device)
            return time.perf_counter() - start

        def composer_segment(n: int) -> float:
            timer.reset(int(trainer.state.timestamp.batch) + n)
            trainer.fit(duration=f"{n}ba")
            return timer.seconds  # from the first batch's start to the last batch's end: n batches

        batch = len(batches[0][1])
        timings = _timed_rounds(plain_segment, composer_segment, steps, rounds, warmup, batch)
        trainer.close()
    return {
        "model": config.model.name,
        "dataset": config.dataset.name,
        "device": device_name,
        "precision": t.precision,
        "channels_last": channels_last,
        "batch": batch,
        "microbatch": micro,
        "steps_per_round": steps,
        "rounds": rounds,
        **timings,
    }


def format_bench(result: dict[str, Any]) -> str:
    return (
        f"{result['model']} on {result['dataset']}, {result['device']}, {result['precision']}, batch {result['batch']}"
        f"{', microbatch ' + str(result['microbatch']) if result['microbatch'] else ''}"
        f"{', channels-last' if result['channels_last'] else ''}: "
        f"{result['rounds']} rounds of {result['steps_per_round']} steps\n"
        f"plain PyTorch loop  {result['plain_img_s']:9.1f} img/s\n"
        f"dlrecipes/Composer  {result['dlrecipes_img_s']:9.1f} img/s\n"
        f"ratio               {result['ratio']:9.3f}  (per round: {', '.join(f'{r:.3f}' for r in result['ratios'])})\n"
        f"overhead            {result['overhead_ms_per_step']:9.3f} ms per step (median over rounds)"
    )


def measure_throughput(config: RecipeConfig, steps: int = 30, warmup: int = 10) -> dict[str, Any]:
    """Training images/s of the recipe's Trainer on batches already on the device (no data loading)."""
    from composer.core import DataSpec

    from dlrecipes.builders import build_bench_trainer

    config = copy.deepcopy(config)
    config.checkpoint.save, config.checkpoint.monitor = False, None
    config.trainer.progress_bar = False
    config.trainer.console_log_interval = "100000ep"
    device_name = resolve_device(config.trainer.device)
    device = torch_device(device_name)
    batches = in_memory_batches(config, 4, device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_bench_trainer(
            TrainingRun.in_folder(config, Path(tmp), device_name),
            DataSpec(BatchList(batches), num_samples=sum(len(b[1]) for b in batches)),
        )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.fit(duration=f"{warmup}ba")  # includes torch.compile's compilation when enabled
        _sync(device)
        start = time.perf_counter()
        trainer.fit(duration=f"{steps}ba")
        _sync(device)
        seconds = time.perf_counter() - start
        loss = float(trainer.state.loss.detach()) if isinstance(trainer.state.loss, torch.Tensor) else None
        trainer.close()
    batch = len(batches[0][1])
    return {
        "img_s": steps * batch / seconds,
        "step_ms": 1000 * seconds / steps,
        "batch": batch,
        "loss": loss,
        "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
    }
