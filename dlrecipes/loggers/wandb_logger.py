"""Composer's WandBLogger, adapted to current wandb, and given the whole run (:mod:`.run_record`).

Composer 0.32.1's ``WandBLogger.init`` reads ``wandb.run.get_url()``; wandb 0.31 removed ``Run.get_url`` in favour of
the ``Run.url`` property, so ``Trainer(...)`` fails at init, offline mode included.  This subclass supplies ``get_url``
(as ``url``) for the duration of Composer's ``init``, and reads device values back every ``read_every`` batches
(:mod:`.read_back`).  Chosen over pinning ``wandb<0.19`` (Composer's declared range), which would hold back protobuf and
conflict with current TensorBoard. The resolved recipe becomes the run's config (nested, as in the recipe; secrets
redacted), the tags its tags, the run directory's files are saved with the run, and the run's exit code says how it
ended.  W&B records the command line in the run's metadata: it is given the command line redacted
(:mod:`dlrecipes.core.secrets`).
"""

from __future__ import annotations

from pathlib import Path

from composer.core import State
from composer.loggers import Logger
from composer.loggers import WandBLogger as ComposerWandBLogger

from dlrecipes.core.secrets import redacted_argv
from dlrecipes.loggers.read_back import ReadsAtInterval
from dlrecipes.loggers.run_record import RecordsTheRun

EXIT_CODES = {"finished": 0, "pruned": 0, "stopped": 75, "diverged": 3, "failed": 1}  # as `dlrecipes train` exits


# the tags a W&B run gets (its config holds the whole provenance)
SHORT_TAGS = (
    "dlrecipes.recipe",
    "dlrecipes.device",
    "dlrecipes.world_size",
    "dlrecipes.git_commit",
    "dlrecipes.versions.torch",
)


class WandBLogger(ReadsAtInterval, RecordsTheRun, ComposerWandBLogger):
    tracker = "loggers.wandb"

    def init(self, state: State, logger: Logger) -> None:
        from wandb.sdk.wandb_run import Run

        missing = not hasattr(Run, "get_url")
        if missing:
            Run.get_url = lambda run: run.url  # the name Composer 0.32.1 calls
        try:
            with redacted_argv():  # the run's metadata records the command line, overrides and all
                super().init(state, logger)
        finally:
            if missing:
                del Run.get_url

    def record_parameters(self, parameters: dict[str, str], tags: dict[str, str]) -> None:
        import wandb

        if not self._enabled or wandb.run is None:
            return
        provenance = dict(getattr(self.record_history, "provenance", None) or {})
        if isinstance(provenance.get("plugins"), dict):  # file paths are no config keys: "FILE SHA256" each
            provenance["plugins"] = [f"{file} {sha}" for file, sha in provenance["plugins"].items()]
        wandb.config.update(
            {**self.record_recipe, **({"provenance": provenance} if provenance else {})}, allow_val_change=True
        )
        short = {
            k.removeprefix("dlrecipes."): (v[:12] if k.endswith("git_commit") else v)
            for k, v in tags.items()
            if k in SHORT_TAGS
        }  # a tag is short: the whole provenance is in the config
        wandb.run.tags = tuple(dict.fromkeys([*(wandb.run.tags or ()), *(f"{k}={v}"[:64] for k, v in short.items())]))

    def record_end(self, status: str, paths: list[Path]) -> None:
        import wandb

        if not self._enabled or wandb.run is None:
            return
        if paths:  # an artifact: recorded offline too, and uploaded by `wandb sync`
            artifact = wandb.Artifact(
                name=f"run-files-{self.record_dir.name}"[:128].replace("=", "-").replace(",", "_"), type="run-files"
            )
            for path in paths:
                name = str(path.relative_to(self.record_dir))
                if path.is_dir():
                    artifact.add_dir(str(path), name=name)
                else:
                    artifact.add_file(str(path), name=name)
            wandb.log_artifact(artifact)
        wandb.finish(exit_code=EXIT_CODES.get(status, 1))  # Composer's post_close then finds no run
