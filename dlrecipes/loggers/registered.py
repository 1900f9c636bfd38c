"""Built-in logger destinations (Composer's), registered by name for ``loggers:``.

The run's text log (``train-rank<N>.log`` in the run directory, :mod:`.run_log`) and the
terminal output (:mod:`.terminal`) are always there; these add experiment trackers.  Optional
trackers are pip extras with an install hint.  Each gets every batch's loss, read back from the
device every ``trainer.log_interval`` batches (:mod:`.read_back`).
"""

from __future__ import annotations

from typing import Literal

from dlrecipes.core.ranges import AtLeastOne
from dlrecipes.errors import UserError
from dlrecipes.registry import loggers

Artifacts = Literal["files", "checkpoint", "export", "all", "none"]
PROBE_SECONDS = 10.0  # a busy server answers late; nothing listening is refused at once


def _probe(url: str, key: str, fix: str) -> None:
    """Reach ``url`` once, within a few seconds, before anything is trained: an unreachable tracker is one line."""
    import urllib.error
    import urllib.request

    from dlrecipes.core.secrets import without_user_info

    address = without_user_info(url)  # whether it answers needs no credentials (and urllib takes none from an address)
    try:
        with urllib.request.urlopen(address, timeout=PROBE_SECONDS):  # noqa: S310 - the recipe's own tracker address
            return
    except urllib.error.HTTPError:  # it answers (401, 404...): reachable; the tracker itself will say more
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"{key}: nothing answers at {url} ({reason}); {fix}") from None


def _require(module: str, extra: str, pip_spec: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UserError(
            f"loggers.{extra}: the '{module}' package is not installed. Install it with: pip install '{pip_spec}'"
        )


def _told(tracker, run):
    """A tracker told about its run (``run``, a RunContext, when built for one): the recipe, tags and history it
    records (:class:`~dlrecipes.loggers.run_record.RecordsTheRun`), and how often it reads values back
    (:class:`~dlrecipes.loggers.read_back.ReadsAtInterval`)."""
    if run is not None:
        tracker.read_every = run.read_every
        tracker.bind(run)
    return tracker


@loggers.register("tensorboard")
def tensorboard(layout, run=None, /, log_dir: str | None = None, flush_interval: AtLeastOne = 100):
    """TensorBoard event files (default: <run dir>/tensorboard).

    Args:
        log_dir: the folder the event files go into (in a subfolder named after the run); null: <run dir>/tensorboard.
        flush_interval: batches between writes of the buffered events to disk (also written at each epoch's end
            and each evaluation).
    """
    _require("tensorboard", "tensorboard", "dlrecipes[tensorboard]")
    from dlrecipes.loggers.trackers import TensorboardLogger

    return _told(TensorboardLogger(log_dir=log_dir or str(layout.tensorboard), flush_interval=flush_interval), run)


@loggers.register("wandb")
def wandb(
    layout,
    run=None,
    /,
    project: str | None = None,
    entity: str | None = None,
    group: str | None = None,
    name: str | None = None,
    tags: list[str] | None = None,
    offline: bool = False,
    log_artifacts: Artifacts = "files",
):
    """Weights & Biases (honours WANDB_MODE=offline; `offline: true` forces it); the recipe is the run's config.

    Args:
        project: the W&B project the run is filed under; null: W&B's default (WANDB_PROJECT, else 'uncategorized').
        entity: the W&B user or team that owns the project; null: the account's default entity (WANDB_ENTITY).
        group: a W&B group gathering related runs (e.g. a sweep's) for comparison; null: none.
        name: the run's name in W&B; null: the run directory's name.
        tags: labels put on the W&B run (secrets redacted), besides dlrecipes' own (recipe, device, git commit).
        offline: true sets WANDB_MODE=offline, so the run is only written locally (`wandb sync` uploads it later);
            false leaves WANDB_MODE as it is.
        log_artifacts: the run's files uploaded at the end: 'files' (recipe.yaml, summary.json, history.csv, the
            plots and the report), 'checkpoint' adds best.pt, 'export' the export folder, 'all' both, 'none' nothing.
    """
    _require("wandb", "wandb", "dlrecipes[wandb]")
    import os

    from dlrecipes.loggers.wandb_logger import WandBLogger

    if offline:
        os.environ["WANDB_MODE"] = "offline"
    if os.environ.get("WANDB_MODE", "online") not in ("offline", "disabled", "dryrun"):
        base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        _probe(
            base,
            "loggers.wandb",
            "check the network or WANDB_BASE_URL, or log offline (loggers.wandb.offline=true; "
            "`wandb sync` uploads it later)",
        )
    # the run's files stay in its run directory (this run's: not an environment variable a later run would inherit),
    # unless WANDB_DIR says otherwise
    where = {} if os.environ.get("WANDB_DIR") else {"dir": str(layout)}
    from dlrecipes.core.secrets import redact

    logger = WandBLogger(
        project=project, entity=entity, group=group, name=name or layout.name, tags=redact(tags), init_kwargs=where
    )
    logger.log_artifacts = log_artifacts
    return _told(logger, run)


@loggers.register("mlflow")
def mlflow(
    layout,
    run=None,
    /,
    tracking_uri: str | None = None,
    experiment_name: str | None = None,
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
    log_artifacts: Artifacts = "files",
):
    """MLflow tracking (default: a local file store in <run dir>/mlruns); the recipe is the run's parameters.

    Args:
        tracking_uri: where MLflow records the run: a server's http(s) address (checked before training) or a
            store URI; null: a file store in <run dir>/mlruns.
        experiment_name: the MLflow experiment the run is filed under (created if missing); null: 'dlrecipes'.
        run_name: the run's name in MLflow; null: the run directory's name.
        tags: extra tags on the MLflow run, name to value (secrets redacted), besides dlrecipes' own (recipe,
            device, git commit).
        log_artifacts: the run's files uploaded at the end: 'files' (recipe.yaml, summary.json, history.csv, the
            plots and the report), 'checkpoint' adds best.pt, 'export' the export folder, 'all' both, 'none' nothing.
    """
    _require("mlflow", "mlflow", "dlrecipes[mlflow]")
    import os

    from dlrecipes.loggers.trackers import MLFlowLogger

    if tracking_uri is None:
        # MLflow 3 keeps its local file store only on request; a database needs a server or sqlalchemy
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking_uri = layout.mlflow_store.resolve().as_uri()
    elif tracking_uri.startswith(("http://", "https://")):
        _probe(
            tracking_uri.rstrip("/") + "/health",
            "loggers.mlflow.tracking_uri",
            "start the server (mlflow server --host ... --port ...), fix the URI, or leave tracking_uri out "
            "for a store in the run directory",
        )
        # a server that drops out mid-run costs seconds, not MLflow's minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from dlrecipes.core.secrets import redact

    logger = MLFlowLogger(
        experiment_name=experiment_name or "dlrecipes",
        run_name=run_name or layout.name,
        tags=redact(tags),
        tracking_uri=tracking_uri,
        log_system_metrics=False,
        # every value, as the other trackers and history.csv have them: Composer's default leaves out a value equal
        # to the last one within 100 steps (an evaluation whose top-1 did not change had no point in MLflow)
        log_duplicated_metric_every_n_steps=0,
    )
    logger.log_artifacts = log_artifacts
    return _told(logger, run)
