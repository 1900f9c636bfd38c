"""Callbacks, registered by name in :mod:`.registered` (Composer's and dlrecipes' own).

Every run also gets the run's own callbacks (:mod:`dlrecipes.builders.trainer` adds them).  Those
that live elsewhere, next to what they record, are named here and importable from here:

Modules:
- :mod:`.best_checkpoint`: BestCheckpoint: best.pt by the monitored evaluation metric
- :mod:`.export_for_inference`: ExportForInference: TorchScript/ONNX files, checked against the network
- :mod:`.export_options`: what the export callback accepts, checked at validation (no torch)
- :mod:`.monitors`: NaNMonitor, StopOnDivergence, TorchProfilerTraces
- :mod:`.optuna_trial`: OptunaTrial: a run as a trial of an Optuna study (report, prune)
- :mod:`.speedrun`: the CIFAR-10 speedruns' patch whitening, lookahead and batch-norm settings
- :mod:`.stop_on_signal`: StopOnSignal: SIGTERM, SIGUSR1, SIGINT, SIGHUP -> a checkpoint, exit 75
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
