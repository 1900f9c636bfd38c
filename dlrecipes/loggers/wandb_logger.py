"""Composer's WandBLogger, adapted to current wandb.

Composer 0.32.1's ``WandBLogger.init`` reads ``wandb.run.get_url()``; wandb 0.31 removed
``Run.get_url`` in favour of the ``Run.url`` property, so ``Trainer(...)`` fails at init,
offline mode included.  This subclass supplies ``get_url`` (as ``url``) for the duration of
Composer's ``init``, and reads device values back every ``read_every`` batches (:mod:`.read_back`).  Chosen over pinning ``wandb<0.19`` (Composer's
declared range), which would hold back protobuf and conflict with current TensorBoard.
"""

from __future__ import annotations

from composer.core import State
from composer.loggers import Logger
from composer.loggers import WandBLogger as ComposerWandBLogger

from dlrecipes.loggers.read_back import ReadsAtInterval


class WandBLogger(ReadsAtInterval, ComposerWandBLogger):
    def init(self, state: State, logger: Logger) -> None:
        from wandb.sdk.wandb_run import Run

        missing = not hasattr(Run, "get_url")
        if missing:
            Run.get_url = lambda run: run.url  # the name Composer 0.32.1 calls
        try:
            super().init(state, logger)
        finally:
            if missing:
                del Run.get_url
