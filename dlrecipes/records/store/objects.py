"""Runs in an object store (``runs_dir: s3://BUCKET/PREFIX``): each staged in a local folder and kept in step with
the bucket (:mod:`dlrecipes.records.store.bucket`), one writer at a time (:mod:`dlrecipes.records.store.lease`),
uploads in the background (:mod:`dlrecipes.records.store.upload`), read back through local copies
(:mod:`dlrecipes.records.store.reading`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.errors import UserError
from dlrecipes.records.store.access import check_access
from dlrecipes.records.store.bucket import POINTER, RemoteRoot, RemoteRun, object_store, staged_run
from dlrecipes.records.store.interface import (
    ReadRun,
    RunOptions,
    RunStore,
    SweepFolder,
    TrainingRun,
    named_by_address,
)
from dlrecipes.records.store.mirror import uploader

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig
    from dlrecipes.records.store.interface import RunEnded
    from dlrecipes.records.store.lease import BucketLease


class IncompleteUpload(UserError):
    """A run ended with files the bucket does not have (they are in its staging folder)."""

    exit_code = 1


class BucketStore(RunStore):
    """The runs under ``s3://BUCKET/PREFIX`` (the address checked as the store is made, before anything else)."""

    def __init__(self, runs_dir: str):
        super().__init__(runs_dir)
        self.root = RemoteRoot.parse(runs_dir)
        self.answered = False  # whether the bucket answered this store (one store per command: asked once)

    def check(self) -> None:
        """The bucket asked (:func:`~.access.check_access`) the first time this store needs it; a command makes one
        store, so the bucket is asked once per command."""
        if not self.answered:
            check_access(self.root)
            self.answered = True

    def check_room(self, config: RecipeConfig) -> None:
        """The run's longest key within the object store's limit and its staging paths within this file system's
        (:meth:`~.bucket.RemoteRoot.check_room`); a default name is as long as ``<recipe>-YYYYMMDD-HHMMSS``."""
        self.root.check_room(config.run_name or f"{config.name}-{'0' * 8}-{'0' * 6}")

    def open_for_training(self, config: RecipeConfig, device: str, options: RunOptions) -> TrainingRun:
        """As a local folder's (:func:`dlrecipes.records.store.local.open_in`, in the staging folder), after the
        bucket's side: a name it holds a run under refused or the run moved aside (:func:`~.opening.claim_name`),
        with ``resume`` the run's records and newest checkpoint that loads downloaded here; the lock goes with the
        run's lease in the bucket, and a callback uploads the run as it goes."""
        from dlrecipes.core.distributed import stopped_together
        from dlrecipes.records.store.local import open_in
        from dlrecipes.records.store.opening import prepare

        def bucket_side() -> BucketLease | None:
            self.check()
            return prepare(self.root, config.run_name, options.resume, options.restart)

        claimed = stopped_together(bucket_side, device, config.trainer.dist_timeout, _release)
        try:
            with named_by_address({self.root.staging(): str(self.root)}):  # errors name the bucket's files
                opened = open_in(self.root.staging(), config, device, options)
        except BaseException:
            if claimed is not None:
                claimed.release()
            raise
        name, lock = opened.run.name, opened.lock
        mirror = staged_run(self.root, name)
        mirror.resuming = options.resume
        if lock is not None:
            from dlrecipes.records.store.lease import leased

            try:
                lock = leased(lock, object_store(self.root), self.root, name, claimed)
            except UserError:
                if opened.fresh:  # nothing of it is left behind here (the staging folders made for it)
                    _remove_fresh(opened.run.path)
                raise
            mirror.lease = lock.lease  # every write to the bucket is made under it
            try:
                _take_over(mirror)
            except BaseException:
                lock.release()
                raise
        mirror.keep = config.checkpoint.keep
        return dataclasses.replace(
            opened,
            shown_as=f"{self.root}/{name}",
            addresses={self.root.staging(): str(self.root)},
            lock=lock,
            keep_in_step=lambda: [uploader(mirror, config.checkpoint.upload_wait)],
            stored=lambda result: _all_uploaded(result, mirror),
        )

    def check_resumable(self, name: str, first_node: bool) -> None:
        from dlrecipes.records.store.opening import check_run_in_bucket

        self.check()
        check_run_in_bucket(self.root, name)

    def runs(self, last: int | None) -> list[tuple[Path, str | None]]:
        from dlrecipes.records.runs import newest_first
        from dlrecipes.records.store.reading import pull_runs_dir

        self.check()
        addresses = pull_runs_dir(self.root)
        return [(path, addresses[path]) for path in newest_first(list(addresses), last)]

    def rows_shown(self, rows: list[dict[str, Any]], addresses: dict[Path, str]) -> list[dict[str, Any]]:
        from dlrecipes.records.store.reading import shown_paths

        return shown_paths(rows, addresses, str(self.root))

    def sweep(self, name: str) -> SweepFolder:
        """The sweep staged here (what the bucket has of it brought first); its points train into
        ``s3://.../<sweep>``, and its own files are uploaded after each point and at its end."""
        from dlrecipes.records.store.reading import sweep_mirror

        self.check()
        mirror = sweep_mirror(self.root, name)
        mirror.pull_missing()

        def finish() -> list[str]:
            mirror.push()
            return mirror.incomplete()

        return SweepFolder(mirror.local, mirror.url, trains_into=mirror.url, after_point=mirror.push, finish=finish)


def _take_over(mirror: RemoteRun) -> None:
    """The run's pointer taken over by this training as it opens (:meth:`~.writer.Writer.take_over`); a server that
    does not answer now: it is done before the first commit instead (with one warning, as for a failed upload)."""
    try:
        mirror.take_over()
    except UserError:  # a damaged pointer, a lease lost meanwhile: one line
        raise
    except Exception as exc:
        mirror._failed(POINTER, exc)
        mirror.pending.remove(POINTER)


def _remove_fresh(run: Path) -> None:
    """A fresh run's staging folder removed, and the folders above it up to the staging base that it leaves empty."""
    import shutil

    from dlrecipes.records.store.bucket import staging_base

    shutil.rmtree(run, ignore_errors=True)
    base = staging_base()
    for folder in (run.parent, *run.parent.parents):
        if folder == base or base not in folder.parents:
            break
        try:
            folder.rmdir()
        except OSError:  # not empty: something else lives there
            break


def _all_uploaded(result: RunEnded, mirror: RemoteRun) -> None:
    """A run that ends with files not uploaded: one line naming them, exit code 1 (a run whose lease was taken over:
    the line naming the holder)."""
    if mirror.lease is not None and mirror.lease.lost is not None:
        raise mirror.lease.lost_error()
    missing = mirror.incomplete()
    if missing:
        raise IncompleteUpload(
            f"training {result.status}, but {len(missing)} file(s) of the run are not in {mirror.root}/{mirror.name}: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} (they are in {mirror.local}, as its "
            "summary says; run the same command with --resume to upload them)"
        )


def read_from_bucket(url: str, checkpoint: str | None, asked: set[str] | None = None) -> ReadRun:
    """A run (or an export) at ``url``: its records, and the one ``checkpoint`` (None: none) the command needs,
    brought into a local copy; the command's outputs are uploaded beside it. ``asked``: as
    :func:`~.reading.open_run`'s."""
    from dlrecipes.records.layout import RECIPE_FILE
    from dlrecipes.records.store.reading import open_run

    run = open_run(url, asked)
    listing = run.pull_records()
    if checkpoint is not None and RECIPE_FILE in listing:  # not an export directory
        checkpoint = run.pull_checkpoint(checkpoint, listing)
    return ReadRun(run.local, checkpoint, run.url, push=run.push_outputs, pushes=True, bring=run.bring)


def _release(claimed: BucketLease | None) -> None:
    """A lease this process took as it opened a run that another rank then refused: given back."""
    if claimed is not None:
        claimed.release()
