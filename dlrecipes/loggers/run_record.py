"""What an experiment tracker gets besides the metrics: the whole run.

:class:`RecordsTheRun` (a mixin for Composer's MLflow, W&B and TensorBoard destinations) gives the
tracker, on rank 0:

- at the start, the resolved recipe as the run's parameters (as recipe.yaml records it: secrets
  redacted, :mod:`dlrecipes.core.secrets`): every leaf key flattened with dotted
  names (``optimizer.lr``, ``model.name``), values as text within the tracker's limits; and tags
  naming the recipe, the git commit of the working directory's project (where there is one), the
  device and the world size;
- at the end (a clean stop included), the run directory's files as artifacts (``log_artifacts``:
  ``files``, the default: recipe.yaml, summary.json, history.csv, the plots and the report;
  ``checkpoint`` adds ``best.pt``, ``export`` the export directory, ``all`` both, ``none``
  nothing), and the run's status as summary.json has it (MLflow: FINISHED, KILLED for a stop,
  FAILED for a failure or divergence; W&B: the exit code).

A tracker that stops answering in the middle of a run does not stop the training: one warning
line, then nothing more is sent to it, and the run directory's own files stay complete.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.core.secrets import redact, redact_text
from dlrecipes.errors import first_line
from dlrecipes.records.layout import RunDir

if TYPE_CHECKING:
    from composer.core import State
    from composer.loggers import Logger

    from dlrecipes.core.run_context import RunContext


ARTIFACT_CHOICES = ("files", "checkpoint", "export", "all", "none")
MAX_VALUE = 6000  # characters: MLflow's limit on a parameter's value, also plenty for the others


def flat_parameters(recipe: dict[str, Any]) -> dict[str, str]:
    """Every leaf of the resolved recipe, dotted, its value as text (YAML-like for lists and mappings)."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
            return
        text = "null" if node is None else json.dumps(node) if isinstance(node, (dict, list, bool)) else str(node)
        out[prefix] = text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."

    walk(recipe, "")
    return out


def run_tags(
    recipe: dict[str, Any], device: str, world_size: int, provenance: dict[str, Any] | None = None
) -> dict[str, str]:
    """The tags a tracker puts on the run: recipe, device, world size, and the run's provenance
    (:mod:`dlrecipes.records.provenance`: versions, GPU, host, command, git commit, ...) as ``dlrecipes.<item>``."""
    from dlrecipes.records.provenance import flat

    tags = {
        "dlrecipes.recipe": str(recipe.get("name")),
        "dlrecipes.device": device,
        "dlrecipes.world_size": str(world_size),
    }
    for key, value in flat(provenance or {}, "dlrecipes.").items():
        if value is not None:
            text = json.dumps(value) if isinstance(value, (bool, list)) else str(value)
            tags[key.replace("/", ".")] = text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."
    return tags


def artifact_paths(run: RunDir, which: str) -> list[Path]:
    """The run's files a tracker uploads for ``which`` (see :data:`ARTIFACT_CHOICES`)."""
    if which == "none":
        return []
    paths = [path for path in run.records if path.is_file()]
    paths += run.plots()
    if run.report.is_dir():
        paths.append(run.report)
    if which in ("checkpoint", "all") and run.best.is_file():
        paths.append(run.best)
    if which in ("export", "all") and run.exports.is_dir():
        paths.append(run.exports)
    return paths


class RecordsTheRun:
    """Mixin for a tracker destination (see the module docstring). Its factory gives it the run (:meth:`bind`, with
    the run's :class:`~dlrecipes.core.run_context.RunContext`: the directory, the recipe, tags from it, and the run's
    :class:`~dlrecipes.records.history.RunHistory`, whose ``status`` is the run's outcome); the tracker class
    supplies :meth:`record_parameters` and :meth:`record_end`."""

    tracker = "tracker"  # the recipe key named in warnings, e.g. loggers.mlflow
    log_artifacts = "files"

    def bind(self, run: RunContext) -> None:
        from dlrecipes.core.distributed import world_size

        # what a tracker is sent, parameters and W&B's config alike, is the recipe as recipe.yaml records it
        self.record_dir, self.record_recipe, self.record_history = Path(run.path), redact(run.recipe), run.history
        self.record_tags = run_tags(run.recipe, run.device, world_size(), getattr(run.history, "provenance", None))

    # --- what each tracker does -----------------------------------------------------------------------------

    def record_parameters(self, parameters: dict[str, str], tags: dict[str, str]) -> None:
        raise NotImplementedError

    def record_end(self, status: str, paths: list[Path]) -> None:
        raise NotImplementedError

    # --- guarded calls ----------------------------------------------------------------------------------------

    def _guarded(self, what: str, call: Callable[[], Any]) -> Any:
        if self.__dict__.get("_unreachable"):
            return None
        try:
            return call()
        except Exception as exc:  # a tracker that dropped out must not stop the training
            self._unreachable = True
            first = redact_text(first_line(exc))[:300]
            print(
                f"warning: {self.tracker}: {what} failed ({type(exc).__name__}: {first}); nothing more is sent to "
                "it, and training goes on (the run directory keeps everything)",
                file=sys.stderr,
            )
            return None

    def _rank_zero(self) -> bool:
        from composer.utils import dist

        return dist.get_global_rank() == 0

    def fit_start(self, state: State, logger: Logger) -> None:
        super().fit_start(state, logger)  # type: ignore[misc]
        if self._rank_zero() and getattr(self, "record_recipe", None) is not None:
            self._guarded(
                "logging the recipe",
                lambda: self.record_parameters(flat_parameters(self.record_recipe), self.record_tags),
            )

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self._guarded("logging metrics", lambda: super(RecordsTheRun, self).log_metrics(metrics, step))

    def post_close(self) -> None:
        if self.__dict__.get("_post_closed"):  # Composer closes every engine again at interpreter exit: files uploaded
            return  # and the run ended once
        self._post_closed = True
        history = getattr(self, "record_history", None)
        if self._rank_zero() and history is not None:
            status = getattr(history, "status", "finished")
            self._guarded(
                "uploading the run's files",
                lambda: self.record_end(status, artifact_paths(RunDir(self.record_dir), self.log_artifacts)),
            )
        self._guarded("closing the run", super().post_close)  # type: ignore[misc]


__all__ = ["ARTIFACT_CHOICES", "RecordsTheRun", "artifact_paths", "flat_parameters", "run_tags"]
