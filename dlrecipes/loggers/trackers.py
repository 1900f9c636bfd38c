"""Composer's TensorBoard and MLflow loggers, reading device values back every ``read_every``
batches (:mod:`.read_back`) instead of after every step, and given the whole run (:mod:`.run_record`):
the recipe as parameters, the run's files as artifacts, its status.  Same class names, so checkpoints
record them under the names Composer uses; imported only when a recipe asks for one."""

from __future__ import annotations

from pathlib import Path

from composer.loggers import MLFlowLogger as ComposerMLFlowLogger
from composer.loggers import TensorboardLogger as ComposerTensorboardLogger

from dlrecipes.core.secrets import redacted_output
from dlrecipes.loggers.read_back import ReadsAtInterval
from dlrecipes.loggers.run_record import RecordsTheRun

MLFLOW_STATUS = {
    "finished": "FINISHED",
    "pruned": "FINISHED",
    "stopped": "KILLED",
    "diverged": "FAILED",
    "failed": "FAILED",
}


class TensorboardLogger(ReadsAtInterval, RecordsTheRun, ComposerTensorboardLogger):
    """TensorBoard's hparams table gets the recipe (and the tags); Composer pairs them with the metrics of
    every evaluation, the last one included. Its files are the run directory's: nothing to upload."""

    tracker = "loggers.tensorboard"

    def record_parameters(self, parameters: dict[str, str], tags: dict[str, str]) -> None:
        self.log_hyperparameters({**parameters, **tags})

    def record_end(self, status: str, paths: list[Path]) -> None:
        return None  # event files live in the run directory already


class MLFlowLogger(ReadsAtInterval, RecordsTheRun, ComposerMLFlowLogger):
    tracker = "loggers.mlflow"

    def record_parameters(self, parameters: dict[str, str], tags: dict[str, str]) -> None:
        if not self._enabled or self._run_id is None:
            return
        from mlflow.entities import Param, RunTag

        items = list(parameters.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 parameters per request
            self._mlflow_client.log_batch(
                self._run_id, params=[Param(k, v) for k, v in items[start : start + 100]], synchronous=True
            )
        self._mlflow_client.log_batch(self._run_id, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)

    def record_end(self, status: str, paths: list[Path]) -> None:
        if not self._enabled or self._run_id is None:
            return
        import mlflow

        mlflow.flush_async_logging()
        for path in paths:
            if path.is_dir():
                self._mlflow_client.log_artifacts(self._run_id, str(path), artifact_path=path.name)
            else:
                folder = path.parent.name if path.parent != self.record_dir else None
                self._mlflow_client.log_artifact(self._run_id, str(path), artifact_path=folder)
        with redacted_output():  # MLflow prints the run's address, user info and all
            mlflow.end_run(status=MLFLOW_STATUS.get(status, "FAILED"))  # Composer's post_close then finds it ended

    def post_close(self) -> None:
        with redacted_output():  # a run not ended above (a rank but 0, a tracker gone) is ended here, printed alike
            super().post_close()
