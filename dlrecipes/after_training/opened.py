"""The one sequence every command after training starts with (``eval``, ``export``, ``predict``; the notebook's
predict too): :func:`open_trained` opens the target where it lives (a run in a bucket: its records and the one
checkpoint downloaded), finds the run and the checkpoint in it, imports the training stack and resolves the
run's recorded recipe with the command's overrides, and yields one :class:`Trained`: what the rest of the command
takes."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dlrecipes.after_training.target import RunTarget, find_target, is_export_dir
from dlrecipes.config.resolving import resolve_recorded
from dlrecipes.recipe import load_recipe, override_strings
from dlrecipes.records.recorded_code import check_imports, check_plugin_files
from dlrecipes.records.store import ReadRun, open_for_reading
from dlrecipes.runtime import process_state

if TYPE_CHECKING:
    from dlrecipes.config import RecipeConfig


@dataclasses.dataclass
class Trained:
    """A trained run (or checkpoint, or export directory) opened for a command after training: what the store
    opened (``read``: a bucket's run as a local copy; the command's outputs go back beside it), the run and
    checkpoint found in it (``found``; None for an export directory), its recorded recipe with the command's
    ``overrides``, validated (``config``), and whether its checkpoints may be unpickled in full (``trust``:
    ``--trust-checkpoint``)."""

    read: ReadRun
    found: RunTarget | None = None
    config: RecipeConfig | None = None
    overrides: list[str] = dataclasses.field(default_factory=list)
    trust: bool = False

    @property
    def export_folder(self) -> Path | None:
        """The export directory this command was pointed at (None: a run or a checkpoint)."""
        return Path(self.read.target) if self.found is None else None


@contextlib.contextmanager
def open_trained(
    target: str | Path,
    checkpoint: str = "best",
    recipe: str | Path | None = None,
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    trust: bool = False,
    exports: bool = False,
) -> Iterator[Trained]:
    """``target`` (a run directory, a checkpoint file with ``recipe``, or, with ``exports``, an export directory;
    local or ``s3://BUCKET/PREFIX/RUN``) opened for a command after training; inside, errors name a bucket's files
    by their address."""
    read = open_for_reading(target, checkpoint)
    with read.named():
        if exports and is_export_dir(read.target):
            yield Trained(read, trust=trust)
            return
        found, overrides = find_target(read.target, read.checkpoint, recipe, trust), override_strings(overrides)
        if found.run is not None and Path(found.recipe).resolve() == found.run.recipe.resolve():
            _check_recorded_imports(found, read)  # the run's own recipe is data
        process_state.import_training_stack()
        config = resolve_recorded(found.recipe, overrides, plugins)
        if found.run is not None:
            from dlrecipes.records.provenance import plugin_files

            check_plugin_files(found.run.summary, read.address, plugin_files())
        yield Trained(read, found, config, overrides, trust)


def _check_recorded_imports(found: RunTarget, read: ReadRun) -> None:
    """The plugin files the run's recorded recipe names, checked before anything is imported
    (:func:`~dlrecipes.records.recorded_code.check_imports`); a recipe that cannot be read is left to
    :func:`~dlrecipes.config.resolving.resolve_recorded`, whose line names it."""
    from dlrecipes.errors import RecipeError

    try:
        imports = load_recipe(found.recipe).data.get("imports")
    except RecipeError:
        return
    check_imports(imports, Path(found.recipe), found.run.path, read.address, read.bring if read.pushes else None)


__all__ = ["Trained", "open_trained"]
