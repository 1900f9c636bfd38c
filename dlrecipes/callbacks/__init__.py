"""Callbacks, registered by name in :mod:`.registered` (Composer's and dlrecipes' own).

Every run also gets the run's own callbacks (:mod:`dlrecipes.builders.trainer` adds them).  Those
that live elsewhere, next to what they record, are named here and importable from here:
"""

from dlrecipes.callbacks import registered  # noqa: F401  (registers the built-ins)

ELSEWHERE = {
    "RunHistory": "dlrecipes.records.history",  # history.csv, summary.json and the plots: records of the run
    "ClassReport": "dlrecipes.metrics.report",  # the confusion matrix and per-class accuracy: a metric's table
    "make_saver": "dlrecipes.records.checkpoints",  # the periodic saver (atomic writes): checkpoints' own rules
}


def __getattr__(name: str):  # imported on first use: validation and `list` stay light
    if name in ELSEWHERE:
        import importlib

        return getattr(importlib.import_module(ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
