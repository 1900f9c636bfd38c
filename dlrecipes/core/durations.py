"""Durations: Composer's time strings as recipes write them (``10ep``, ``200ba``, ``5000sp``, ``0.5dur``)."""

from __future__ import annotations

import re
from typing import NewType

Duration = NewType("Duration", str)
"""A Composer time string: ``10ep`` (epochs), ``200ba`` (batches), ``5000sp`` (samples), ``0.1dur``."""

# Each unit a duration is written in (Composer's), an example and what it counts: what the parser takes and what
# the keys' meanings say (DURATION_FORM).
DURATION_UNITS = {
    "ep": ("1ep", "epochs, whole passes over the training data"),
    "ba": ("500ba", "batches, one optimizer step each"),
    "sp": ("10000sp", "training samples"),
    "dur": ("0.25dur", "that fraction of trainer.max_duration"),
    "tok": ("1000tok", "tokens, of sequence data: images have none"),
}
DURATION_FORM = "a duration, a number and its unit: " + ", ".join(
    f"{example} ({meaning})" for example, meaning in DURATION_UNITS.values()
)

_DURATION_RE = re.compile(r"^\s*(\d+(\.\d*)?|\.\d+)\s*({})\s*$".format("|".join(DURATION_UNITS)))


def parse_duration(value: str) -> tuple[float, str]:
    """``'2ep'`` -> ``(2.0, 'ep')``: the one parser of duration strings (validation checks them with it;
    schedules, QAT times and fine-tuning compare them with it; Composer parses them again to train)."""
    match = _DURATION_RE.match(value)
    if match is None:
        raise ValueError(f"not a duration: {value!r}")
    return float(match.group(1)), match.group(3)


def is_zero(duration: str) -> bool:
    """``'0ep'``, ``'0.0ba'``, ``'0dur'``...: no time at all."""
    return parse_duration(duration)[0] == 0.0
