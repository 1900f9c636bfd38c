"""Schedules Composer does not ship: step decay with warmup, and one-cycle.

Both follow Composer's ``ComposerScheduler`` protocol: called with the training state,
they return the multiplier applied to the optimizer's learning rate.
"""

from __future__ import annotations

import math

from composer.core import State, Time
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
