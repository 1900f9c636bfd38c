"""Train metrics: updated from the step's own outputs on sampled batches, accumulated over the epoch, logged after
each sampled batch (the epoch so far) and at the epoch's end (over every rank)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from composer.core import Batch, Callback, State
from composer.core.precision import get_precision_context
from composer.loggers import Logger
from composer.models import ComposerModel
from composer.utils import dist, map_collection, model_eval_mode


def _detached(outputs: Any) -> Any:
    return map_collection(outputs, lambda t: t.detach() if torch.is_tensor(t) else t)


class TrainMetricEpochs(Callback):
    """The train metrics' epoch: reset at its start; at the end of training inside an epoch
    (``max_duration`` in batches), the part trained is computed and logged.

    It holds its Trainer weakly: the state holds the callbacks, and a strong reference back would keep
    the Trainer (its model, optimizers and loaders) alive as long as the state."""

    def __init__(self, trainer: TrainMetrics):
        self._trainer = weakref.ref(trainer)

    @property
    def trainer(self) -> TrainMetrics:
        trainer = self._trainer()
        assert trainer is not None, "the Trainer of these train metrics is gone"
        return trainer

    def epoch_start(self, state: State, logger: Logger) -> None:
        self.trainer.reset_train_metrics()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.trainer.log_train_metrics()


class TrainMetrics:
    """The train metrics' updates and logs (a mixin of :class:`dlrecipes.engine.trainer.Trainer`)."""

    def _metric_outputs(self, batch: Batch) -> Any:  # Any: a model's outputs, as Composer's eval_forward has them
        """What the train metrics are updated with: the step's outputs, as Composer's ``eval_forward``
        returns them for models that keep ComposerModel's; other models' own ``eval_forward``, run
        in eval mode now (before the optimizer step), as Composer does."""
        state, model = self.state, self._original_model
        if type(model).eval_forward is ComposerModel.eval_forward:
            return _detached(state.outputs)
        with (
            torch.no_grad(),
            model_eval_mode(state.model),
            get_precision_context(state.precision, state.precision_config, fp8_autocast_enabled=False),
        ):
            return _detached(model.eval_forward(batch, state.outputs))

    def _update_train_metrics(self) -> None:
        updates, self._metric_updates, self._metric_source = self._metric_updates, [], None
        if not updates:
            return
        metrics = self.state.train_metrics
        placed = (id(metrics), tuple(map(id, metrics.values())))
        if placed != self._metrics_placed:  # new metrics (a callback's, a new fit): onto the model's device
            self.state.train_metrics = self._ensure_metrics_device_and_dtype(metrics)
            self._metrics_placed = (id(self.state.train_metrics), tuple(map(id, self.state.train_metrics.values())))
        with torch.no_grad():
            for batch, outputs in updates:
                for metric in self.state.train_metrics.values():
                    self._original_model.update_metric(batch, outputs, metric)
        self._metrics_pending = True
        self._log_running_train_metrics()

    def _log_running_train_metrics(self) -> None:
        """After a sampled batch, as Composer logs train metrics after every batch: the epoch so far,
        as device tensors (no read-back).  With several processes each rank computes its own running
        value (no collective per step); the value logged at the epoch's end covers every rank."""
        values = {}
        for name, metric in self.state.train_metrics.items():
            if not metric.update_called:
                continue
            syncs = metric._to_sync  # torchmetrics' sync_on_compute
            metric._to_sync = syncs and dist.get_world_size() == 1
            try:
                values[name] = metric.compute()
            finally:
                metric._to_sync = syncs
                metric._computed = None  # the epoch's value is computed afresh, over every rank
        if values:
            self.state.train_metric_values.update(values)
            self.logger.log_metrics({f"metrics/train/{name}": value for name, value in values.items()})

    def reset_train_metrics(self) -> None:
        for metric in (self.state.train_metrics or {}).values():
            metric.reset()
        self._metrics_pending = False

    def log_train_metrics(self) -> None:
        """Compute and log the train metrics updated since the last log (every rank takes part)."""
        if not self._metrics_pending:
            return
        self._metrics_pending = False
        metrics = {name: m for name, m in (self.state.train_metrics or {}).items() if m.update_called}
        if metrics:
            super()._compute_and_log_metrics("train", metrics)

    def _compute_and_log_metrics(self, dataloader_label: str, metrics: dict[str, Any]):
        """Composer computes and logs the train metrics after every batch and at each epoch's end;
        here only at the epoch's end (the call after the last batch of the data).

        Replaces ``composer.trainer.trainer.Trainer._compute_and_log_metrics`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_a_loader_without_a_length_gets_every_loss_and_the_epoch_metrics``.
        """
        if dataloader_label != "train":
            return super()._compute_and_log_metrics(dataloader_label, metrics)
        if self._in_batch:  # the per-batch call
            self._in_batch = False
            return None
        return self.log_train_metrics()

    _in_batch = False  # between a batch's step and its BATCH_END: Composer's per-batch metrics call
