"""Callbacks, registered by name in :mod:`.registered` (Composer's and dlrecipes' own).

Every run also gets the run's own callbacks (:mod:`dlrecipes.builders.trainer` adds them).  Those
that live elsewhere, next to what they record, are named here and importable from here:
"""

from dlrecipes.callbacks import registered  # noqa: F401  (registers the built-ins)


def __getattr__(name: str):  # imported on first use: validation and `list` stay light
    if name == "RunHistory":  # history.csv, summary.json and the plots: records of the run
        from dlrecipes.records.history import RunHistory

        return RunHistory
    if name == "ClassReport":  # the confusion matrix and per-class accuracy: a metric's table
        from dlrecipes.metrics.report import ClassReport

        return ClassReport
    if name == "make_saver":  # the periodic saver (atomic writes): checkpoints' own rules
        from dlrecipes.records.checkpoints import make_saver

        return make_saver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
