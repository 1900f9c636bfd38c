"""Schedules Composer does not ship: step decay with warmup, one-cycle, and timm's cosine and step schedules.

All follow Composer's ``ComposerScheduler`` protocol: called with the training state,
they return the multiplier applied to the optimizer's learning rate.
"""

from __future__ import annotations

import math

from composer.core import State, Time, TimeUnit
from composer.optim.scheduler import LinearScheduler, _convert_time  # _convert_time: Composer's own time arithmetic


class StepWithWarmupScheduler:
    """Linear warmup to 1, then multiply by ``gamma`` every ``step_size`` after the warmup."""

    def __init__(self, t_warmup: str, step_size: str, gamma: float = 0.1):
        self.t_warmup = Time.from_timestring(t_warmup)  # parsed once, not at every step
        self.step_size = Time.from_timestring(step_size)
        self.gamma = gamma
        self.warmup = LinearScheduler(alpha_i=0.0, alpha_f=1.0, t_max=t_warmup)

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_warmup = _convert_time(self.t_warmup, state)
        if state.timestamp < t_warmup:
            return self.warmup(state)
        step = _convert_time(self.step_size, state, ssr=ssr)
        elapsed = state.timestamp.get(step.unit).value - t_warmup.value
        return self.gamma ** (elapsed // max(1, step.value))


class OneCycleScheduler:
    """One-cycle (Smith & Topin 2018): warm up from lr/div_factor to lr, then cosine down.

    The optimizer's ``lr`` is the peak.  The end value is lr / (div_factor * final_div_factor).
    """

    def __init__(self, t_warmup: str, div_factor: float = 25.0, final_div_factor: float = 1e4):
        self.t_warmup = Time.from_timestring(t_warmup)  # parsed once, not at every step
        self.t_max = Time.from_timestring("1dur")
        self.start = 1.0 / div_factor
        self.end = self.start / final_div_factor

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        t_warmup = _convert_time(self.t_warmup, state)
        t_max = _convert_time(self.t_max, state, ssr=ssr)
        now = state.timestamp.get(t_warmup.unit).value
        if now < t_warmup.value:
            frac = now / max(1, t_warmup.value)
            return self.start + (1.0 - self.start) * (1 - math.cos(math.pi * frac)) / 2
        frac = min(1.0, (now - t_warmup.value) / max(1, t_max.value - t_warmup.value))
        return self.end + (1.0 - self.end) * (1 + math.cos(math.pi * frac)) / 2


class TimmScheduler:
    """One of timm's schedulers (``timm.scheduler.CosineLRScheduler``, ``StepLRScheduler``) as a Composer scheduler.

    timm's schedulers are no torch ``LRScheduler``: they hold an optimizer and set absolute rates on it when stepped by
    hand (``step_update(n)`` after the n-th update, ``step(epoch)`` after an epoch).  This one builds timm's own
    scheduler over a one-parameter optimizer at the run's learning rate (the optimizer's ``lr``), its durations counted
    in this run's batches (epochs with ``per_epoch``), steps it to the batch (epoch) Composer sets the rate for and
    returns timm's rate over the run's: the multiplier Composer applies to each group's own rate at every batch, so that
    each batch trains at the rate timm's train.py would give it.  A group with another rate (``finetune.head_lr``,
    layer-wise decay) thus gets timm's curve scaled, as timm scales a group with ``lr_scale``; absolute settings
    (``warmup_lr_init``, ``lr_min``) are scaled with it, as in timm.  Warmups are not stretched by
    ``scale_schedule_ratio`` (as Composer's are not); the rest is.
    """

    def __init__(self, kind: str, durations: dict[str, str], per_epoch: bool = False, **options):
        self.kind = kind  # "cosine" or "step"
        self.durations = {key: Time.from_timestring(value) for key, value in durations.items()}
        self.per_epoch = per_epoch
        self.options = options
        self._timm = None  # (what it was built for, timm's scheduler, its optimizer)
        self._last = None  # (what, t, multiplier): Composer asks once per parameter group

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        base = state.optimizers[0].defaults.get("lr") if state.optimizers else None
        if not base:
            raise ValueError(f"timm_{self.kind}: the optimizer has no learning rate to schedule (lr: {base})")
        what = (base, ssr, state.max_duration, state.dataloader_len)
        t = self._next_update(state)
        if self.per_epoch:  # timm's train.py holds the rate for an epoch: its index from the batch's
            t //= max(1, int(state.dataloader_len))
        if self._last is not None and self._last[:2] == (what, t):
            return self._last[2]
        if self._timm is None or self._timm[0] != what:
            self._timm = (what, *self._build(state, ssr, base))
        _, scheduler, holder = self._timm
        scheduler.step_update(t)
        multiplier = holder.param_groups[0]["lr"] / base
        self._last = (what, t, multiplier)
        return multiplier

    @staticmethod
    def _next_update(state: State) -> int:
        """The index of the batch the rate is for, timm's update count before it.  Composer steps its schedulers
        after a batch and before counting it (the timestamp still says k after batch k, whose rate was set), so
        a call during training is for batch k + 1, as timm's ``step_update(k + 1)`` after the (k+1)-th update;
        the call as Composer compiles the schedule (no batch loaded yet: ``state.batch`` is None, at the start or
        on resuming at k) is for batch k."""
        batch = int(state.timestamp.batch)
        return batch if state.batch is None else batch + 1

    def _build(self, state: State, ssr: float, base: float):
        import torch
        from timm.scheduler import CosineLRScheduler, StepLRScheduler

        lengths = {key: self._length(time, state, key, ssr) for key, time in self.durations.items()}
        holder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
        cls = CosineLRScheduler if self.kind == "cosine" else StepLRScheduler
        return cls(holder, t_in_epochs=False, **lengths, **self.options), holder

    def _length(self, time: Time, state: State, key: str, ssr: float) -> float:
        """A duration in this run's batches (in epochs, not necessarily whole, with ``per_epoch``); any but the
        warmup at least one batch."""
        converted = _convert_time(time, state, ssr=1.0 if key == "warmup_t" else ssr)
        if converted.unit != TimeUnit.BATCH:
            raise ValueError(
                f"timm_{self.kind}: durations must come to batches or epochs (max_duration is "
                f"{state.max_duration}); got {time}"
            )
        batches = converted.value if key == "warmup_t" else max(1, converted.value)
        return batches / max(1, int(state.dataloader_len)) if self.per_epoch else batches


def run_batches(state: State) -> int:
    """The run's length in batches (``max_duration`` in batches, or in epochs times the batches per epoch)."""
    duration = state.max_duration
    if duration.unit == TimeUnit.BATCH:
        return int(duration.value)
    if duration.unit == TimeUnit.EPOCH and state.dataloader_len is not None:
        return int(duration.value) * int(state.dataloader_len)
    from dlrecipes.errors import RecipeError

    raise RecipeError(
        f"trainer.max_duration: the triangle schedule and lookahead need it in batches or epochs "
        f"('476ba', '10ep'), not {duration}"
    )


def upcoming_batch(state: State) -> int:
    """The count of the batch a rate is being set for.  Composer steps its schedules after each batch, before the
    batch count advances, so that batch t + 1 would train at the rate of t (and batch 1 at batch 0's); the rate set
    there is for the next batch, one more than the count.  At the Trainer's start (no batch trained in this
    process: ``state.batch`` is None) it is the count itself."""
    now = int(state.timestamp.batch)
    return now if state.batch is None else now + 1


class TriangleScheduler:
    """Linear from ``start`` to 1 over the first ``peak`` of the run, then linear to ``end`` (the speedruns'
    'triangle'); the peak falls on batch ``int(peak * T)`` of the run's ``T`` (stretched by scale_schedule_ratio).
    Batch t trains at the triangle's value at t, as in the speedruns (:func:`upcoming_batch`)."""

    def __init__(self, start: float, peak: float, end: float):
        self.start, self.peak, self.end = start, peak, end

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        total = run_batches(state) * ssr
        top = int(self.peak * total)
        now = upcoming_batch(state)
        if now < top:
            return self.start + (1.0 - self.start) * now / top
        return 1.0 + (self.end - 1.0) * (now - top) / max(1e-12, total - top)
