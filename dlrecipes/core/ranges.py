"""Ranges in a factory's signature: ``lr: Positive = 0.1`` is a recipe key that must be above 0.

A factory's signature is its recipe schema (:mod:`dlrecipes.registry`); these ``Annotated`` types
add the range a value must lie in, checked at validation with the key's path and the range in the
message (``optimizer.lr: expected float > 0, got -0.1``).  Plugins use them the same way::

    from dlrecipes.core.ranges import Positive, Probability, Range
    def my_optimizer(model, /, lr: Positive = 0.1, dropout: Probability = 0.0, depth: Annotated[int, Range(1, 64)] = 4)
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from dlrecipes.core.durations import Duration


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (either side open, or absent)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False  # NaN compares false with both bounds, so would pass them; infinity is no setting either
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        def number(x: float) -> str:  # 4294967295, not 4.29497e+09
            return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"

        if self.low is not None and self.high is not None:
            return (
                f"in {'(' if self.low_open else '['}{number(self.low)}, "
                f"{number(self.high)}{')' if self.high_open else ']'}"
            )
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {number(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {number(self.high)}"
        return "any"


def range_of(tp: Any) -> tuple[Any, Range | None]:
    """``Annotated[T, Range(...)]`` -> ``(T, Range)``; any other type -> ``(type, None)``."""
    if typing.get_origin(tp) is Annotated:
        inner, *extras = typing.get_args(tp)
        found = next((e for e in extras if isinstance(e, Range)), None)
        return inner, found
    return tp, None


Positive = Annotated[float, Range(0, low_open=True)]  # learning rates, scales, temperatures
NonNegative = Annotated[float, Range(0)]  # weight decay, momentum-like terms that may be 0
Probability = Annotated[float, Range(0, 1, high_open=True)]  # dropout, label smoothing: [0, 1)
Fraction = Annotated[float, Range(0, 1, low_open=True, high_open=True)]  # a share of something: (0, 1)
AtLeastOne = Annotated[int, Range(1)]  # counts
AtLeastZero = Annotated[int, Range(0)]  # counts that may be none
Size = Annotated[int, Range(1, 8192)]  # image sides and layer widths: >= 1 and not absurd
Classes = Annotated[int, Range(2)]  # a classifier's classes: at least 2
PositiveDuration = Annotated[Duration, Range(0, low_open=True)]  # a time that is not zero
