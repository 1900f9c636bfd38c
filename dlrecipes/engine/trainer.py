"""The Trainer: Composer's, with the loop, the step, the train metrics and the close of this package's mixins and its
events dispatched by :class:`~dlrecipes.engine.events.DirectEngine`."""

from __future__ import annotations

import atexit
import functools
import weakref
from typing import Any

from composer import Trainer as ComposerTrainer
from composer.core import Engine
from composer.trainer.trainer import TrainerMode

from dlrecipes.core.devices import gpu_available
from dlrecipes.core.distributed import HostReducer, gloo_errors
from dlrecipes.engine.events import DirectEngine
from dlrecipes.engine.lifecycle import Lifecycle, close_at_exit, keep_freed_memory_for_reuse
from dlrecipes.engine.loop import Loop
from dlrecipes.engine.step import Step
from dlrecipes.engine.train_metrics import TrainMetricEpochs, TrainMetrics


class Trainer(Loop, Step, TrainMetrics, Lifecycle, ComposerTrainer):
    """Composer's Trainer without per-step host-device synchronisation (see :mod:`dlrecipes.engine`).

    ``train_metrics_interval``: every how many batches the step's outputs update the train
    metrics (1: every batch; 0: no train metrics).  ``dist_timeout`` (Composer's) also bounds the
    host-side reductions.
    """

    def __init__(self, *args: Any, train_metrics_interval: int = 1, **kwargs: Any):
        self.train_metrics_interval = int(train_metrics_interval)
        self._cuda = gpu_available()
        self._closures: tuple[Any, bool] = (None, False)
        self._sample_metrics = self._record_metrics = self._metrics_pending = False
        self._sampled_epoch = -1  # the epoch whose batches last updated the train metrics
        self._metric_updates: list[tuple[Any, Any]] = []  # this batch's (batch, outputs), applied once it trained
        self._metric_source: Any = None  # the microbatch list whose first pass is being recorded
        self._metrics_placed: Any = None
        self._same_batches: dict[TrainerMode, bool] = {}  # per mode: the ranks' batch plans agree
        if kwargs.get("device") in (None, "cpu"):
            keep_freed_memory_for_reuse()
        with gloo_errors("the process group (torch.distributed, gloo)"):
            super().__init__(*args, **kwargs)
        self._host = HostReducer(timeout=kwargs.get("dist_timeout", 300.0))
        if self.train_metrics_interval <= 0:
            self.state.train_metrics = {}  # Composer's way of computing none
        self.state.callbacks.insert(0, TrainMetricEpochs(self))
        self.engine.__class__ = DirectEngine  # same state; only the dispatch differs
        # Composer's Engine registers its close with the state and logger at exit, and unregisters it only when
        # it is collected unclosed: after close() the hook keeps the state (model, optimizers) until the process
        # ends. This one holds the engine weakly and leaves at close(). (atexit unregisters by function: every
        # Engine's hook goes, and each of ours has its own.)
        atexit.unregister(Engine._close)
        self._at_exit = functools.partial(close_at_exit, weakref.ref(self.engine))
        atexit.register(self._at_exit)
