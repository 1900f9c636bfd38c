"""One run as a trial of an Optuna study: report the monitored metric at each evaluation, stop when pruned.

``dlrecipes sweep ... --search optuna`` adds ``callbacks.optuna_trial`` to every run it starts (the study
lives in the sweep's folder, in Optuna's journal file, which several processes share).  After each
evaluation rank 0 reports the monitored metric to the trial (step: the evaluations before it, 0, 1, ...)
and asks Optuna's median pruner (no pruning before ``startup_trials`` trials have finished, nor in the first
``warmup_evaluations`` evaluations); when the trial is pruned every rank stops after that epoch's records and
checkpoint, and the run's ``summary.json`` says ``pruned``.  The number of evaluations reported travels
in checkpoints, so a resumed trial goes on at the next step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from dlrecipes.errors import UserError

if TYPE_CHECKING:
    from dlrecipes.records.history import RunHistory


INSTALL_HINT = "Optuna is not installed: pip install 'dlrecipes[optuna]' (or pip install optuna)"


def import_optuna():
    """``optuna``, or a one-line error with the install command."""
    try:
        import optuna
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial INFO lines would fill the run's log
    return optuna


def journal_storage(path: str):
    """Optuna's storage in one journal file (appends under a file lock: safe for parallel processes)."""
    optuna = import_optuna()
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


class OptunaTrial(Callback):
    def __init__(
        self,
        storage: str,
        study: str,
        trial: int,
        monitor: str = "top1",
        startup_trials: int = 5,
        warmup_evaluations: int = 1,
        history: RunHistory | None = None,
    ):
        self.storage_path, self.study_name, self.number, self.monitor = storage, study, trial, monitor
        self.startup_trials, self.warmup_evaluations = startup_trials, warmup_evaluations
        self.history = history  # the run's RunHistory: summary.json says a pruned run was pruned
        self.reported = 0  # evaluations so far: the step of the next report
        self._trial: Any = None

    def fit_start(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        optuna = import_optuna()
        storage = journal_storage(self.storage_path)
        try:
            study_id = storage.get_study_id_from_name(self.study_name)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.number)
        except KeyError:
            raise UserError(
                f"callbacks.optuna_trial: no trial {self.number} of study '{self.study_name}' in "
                f"{self.storage_path} (the sweep starts its trials; run the sweep again)"
            ) from None
        # the pruner is not kept in the storage: the sweep's settings come as this callback's parameters
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_evaluations
        )
        study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=pruner)
        self._trial = optuna.trial.Trial(study, trial_id)

    def eval_end(self, state: State, logger: Logger) -> None:
        pruned = [False]
        if dist.get_global_rank() == 0:
            if self.monitor not in state.eval_metric_values:
                known = ", ".join(sorted(state.eval_metric_values)) or "(none)"
                raise UserError(
                    f"callbacks.optuna_trial.monitor: no eval metric named '{self.monitor}'; the model logs: {known}"
                )
            value = float(state.eval_metric_values[self.monitor])
            if math.isfinite(value):
                self._trial.report(value, self.reported)
                pruned = [self._trial.should_prune()]
        self.reported += 1
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(pruned, src=0)
        if pruned[0]:
            if self.history is not None:  # summary.json says how the run ended
                self.history.status = "pruned"
                self.history.reason = (
                    f"pruned by the Optuna study '{self.study_name}' after evaluation "
                    f"{self.reported} ({self.monitor} {state.eval_metric_values[self.monitor]:.4f})"
                    if dist.get_global_rank() == 0
                    else "pruned by the Optuna study"
                )
            state.stop_training()

    def state_dict(self) -> dict[str, Any]:
        return {"reported": self.reported}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reported = int(state.get("reported", 0))
