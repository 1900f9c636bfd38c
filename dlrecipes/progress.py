"""Composer's progress bar, showing the learning rate and training metrics next to the loss."""

from __future__ import annotations

from composer.core import State
from composer.loggers import Logger, ProgressBarLogger

TRAIN_KEYS = ["loss/train", "metrics/train", "lr"]


class ProgressBar(ProgressBarLogger):
    """The bar's description already names the epoch; this adds ``lr`` and ``metrics/train/*``."""

    def _build_pbar(self, state: State, is_train: bool):
        bar = super()._build_pbar(state, is_train)
        if is_train:
            bar.keys_to_log = TRAIN_KEYS
        return bar

    def batch_end(self, state: State, logger: Logger) -> None:
        # the learning rate goes straight to the bar, not through every logger each batch
        if state.optimizers:
            self.log_metrics({"lr": state.optimizers[0].param_groups[-1]["lr"]})
        super().batch_end(state, logger)
