"""What the builder knows of the run it builds, handed to the callbacks and loggers that need it.

The fit stage resolves the device and turns the recipe into plain data once; the builder makes
the run's history once.  A callback or logger factory that needs any of it (the export writes
the data's preprocessing beside the model, a tracker records the recipe and how the run ended)
takes a positional-only ``run`` parameter after ``run_dir``, which
:func:`dlrecipes.registry.build_component` supplies::

    @callbacks.register("my_callback")
    def my_callback(run_dir, run=None, /, every: int = 10):
        return MyCallback(run.history if run is not None else None, every)

So nothing is searched for in the Trainer's callback or logger lists by its type: what needs a
reference is given it as it is built.  (``run`` is None when a factory is built outside a run.)  A factory that
takes ``layout`` (positional-only) in place of ``run_dir`` gets the run directory as a
:class:`dlrecipes.records.layout.RunDir`, which names each of its files (the built-ins do).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunContext:
    path: Path  # the run directory
    recipe: dict[str, Any]  # the resolved recipe as plain data (what recipe.yaml records and trackers log)
    device: str  # "cpu" or "gpu", resolved once by the caller
    data: Any  # the run's dlrecipes.data.DatasetSplits (class names, preprocessing)
    history: Any  # the run's dlrecipes.records.history.RunHistory (summary.json: status, reason, wall time)
    read_every: int  # batches between read-backs of logged device values (trainer.log_interval)
    layout: Any = None  # the run directory as a dlrecipes.records.layout.RunDir: where each of its files goes


__all__ = ["RunContext"]
