"""Composer's TensorBoard and MLflow loggers, reading device values back every ``read_every``
batches (:mod:`.read_back`) instead of after every step.  Same class names, so Composer's
checkpoints file them as before; imported only when a recipe asks for one."""

from __future__ import annotations

from composer.loggers import MLFlowLogger as ComposerMLFlowLogger
from composer.loggers import TensorboardLogger as ComposerTensorboardLogger

from dlrecipes.loggers.read_back import ReadsAtInterval


class TensorboardLogger(ReadsAtInterval, ComposerTensorboardLogger):
    pass


class MLFlowLogger(ReadsAtInterval, ComposerMLFlowLogger):
    pass
