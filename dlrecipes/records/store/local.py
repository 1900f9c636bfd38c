"""Runs in a local folder (``runs_dir: runs``): the run directory is the run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dlrecipes.core.distributed import rank
from dlrecipes.records.layout import RunDir
from dlrecipes.records.store.interface import RunOptions, RunStore, SweepFolder, TrainingRun

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig


def open_in(runs: Path, config: RecipeConfig, device: str, options: RunOptions) -> TrainingRun:
    """The run ``config`` trains, in the local folder ``runs`` (a runs folder, or a bucket's staging folder): named
    (a new default name is made now), checked for ``--resume`` before anything is written, a run set aside for
    ``--restart`` or after a failure, made and locked (rank 0), and with ``--resume`` the checkpoint it continues
    from looked up under the lock (rank 0; refused here when there is none to continue, changing nothing)."""
    from dlrecipes.records import run_lock
    from dlrecipes.records.resume_check import check_resume
    from dlrecipes.records.run_dir import (
        choose_run_name,
        find_resume_point,
        make_run_dir,
        set_aside_failed_run,
        set_aside_for_restart,
    )

    resume = options.resume
    run = RunDir(runs / choose_run_name(config, resume, device, runs))
    accepted: list[str] = []
    if resume:  # before anything is built or written
        from dlrecipes.records.provenance import plugin_files
        from dlrecipes.records.recorded_code import check_plugin_files

        accepted = check_resume(run.path, config.to_dict())
        check_plugin_files(run.summary, str(run.path), plugin_files())  # the code that made its checkpoints
    elif options.restart:
        set_aside_for_restart(run.path)
    elif config.run_name:
        set_aside_failed_run(run.path)
    fresh = not resume and (not config.run_name or not run.path.exists())
    lock, point = None, None
    if rank() == 0:
        if config.run_name:  # made here, once (a default name names a run made as the name was chosen)
            make_run_dir(run)
        lock = run_lock.acquire(run.path)
        try:  # under the lock (a live run's files are not touched), before anything is written
            point = find_resume_point(run.path, config.trainer.max_duration, options.trust) if resume else None
        except BaseException:
            lock.release()
            raise
    return TrainingRun(run, config, device, options, resume_point=point, fresh=fresh, accepted=accepted, lock=lock)


class LocalStore(RunStore):
    """A runs folder on this machine's disk (shared between nodes or not)."""

    def check(self) -> None:
        """Nothing to ask: the folder is made, or refused in one line, as the run starts."""

    def open_for_training(self, config: RecipeConfig, device: str, options: RunOptions) -> TrainingRun:
        return open_in(Path(self.runs_dir), config, device, options)

    def check_resumable(self, name: str, first_node: bool) -> None:
        from dlrecipes.records.run_dir import check_run_exists

        if first_node:
            check_run_exists(Path(self.runs_dir), name)

    def runs(self, last: int | None) -> list[tuple[Path, str | None]]:
        from dlrecipes.records.runs import find_runs

        return [(path, None) for path in find_runs(self.runs_dir, last)]

    def sweep(self, name: str) -> SweepFolder:
        folder = Path(self.runs_dir) / name
        return SweepFolder(folder, str(folder), trains_into=str(folder))
