"""Where a run lives, decided once, behind one interface: a local runs folder (:class:`~.local.LocalStore`) or an
object store (:class:`~.objects.BucketStore`: ``s3://BUCKET/PREFIX``), whose runs are staged in a local folder
and kept in step with the bucket.

- :func:`store_for` chooses the store of a recipe's ``runs_dir``; :func:`open_for_reading` that of a run, a
  checkpoint or an export a command names.
- :meth:`RunStore.open_for_training` names the run (a new name, ``--resume`` or ``--restart``; a finished or running
  run is never overwritten), takes its lock (in a bucket, its lease too) and returns a :class:`TrainingRun`: the
  local :class:`~dlrecipes.records.layout.RunDir` training writes in, the callbacks that keep the store in step
  (built with the run's other callbacks), and what its end checks.
- :func:`open_for_reading` brings here exactly what a command needs (a run's records and the one checkpoint it
  reads) and returns a :class:`ReadRun`, whose :meth:`ReadRun.outputs_written` puts what the command wrote
  beside the run.
- :meth:`RunStore.runs` finds the runs under the store's root (``runs``, ``compare --last``); :meth:`RunStore.sweep`
  the folder a sweep keeps its own files in.

No module outside this package asks whether a run is local or in a bucket (``tests/test_architecture.py``).

Modules:
- :mod:`.access`: whether a bucket can be used, asked once, before anything is built or written
- :mod:`.backend`: a bucket through Composer's object-store layer (its URI factory's store)
- :mod:`.commit`: the pointer: one conditional write moves a run; writers' keys of their own, written once
- :mod:`.mirror`: a training's mirror to its bucket, the end's bounded wait, upload_incomplete
- :mod:`.opening`: the bucket's side of opening a run: its name claimed, a resume's files downloaded
- :mod:`.reading`: s3:// runs for the commands after training; a sweep's mirror
- :mod:`.refusals`: a server's failures as one line: unreachable, failing, refusing the first write
- :mod:`.safe_keys`: a bucket's pointer and keys checked before they name a local file
- :mod:`.upload`: uploads to the bucket by one background thread, never stalling training
- :mod:`.upload_process`: large uploads from a process of their own, at a lower priority than training
- :mod:`.write_once`: uploads written once (If-None-Match: *), for boto3's single and multipart uploads
- :mod:`.writer`: a training as the run's writer: its own keys, its commits, history never ahead of them
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.core.addresses import RUNS_DIR
from dlrecipes.errors import UserError
from dlrecipes.records.store.interface import (
    ReadRun,
    RunOptions,
    RunStore,
    SweepFolder,
    TrainingRun,
    addressed_row,
    named_by_address,
)

if TYPE_CHECKING:
    from dlrecipes.records.store.backend import Backend
    from dlrecipes.records.store.bucket import RemoteRoot


def store_for(runs_dir: str | Path) -> RunStore:
    """The store of ``runs_dir``: a local folder, or an object store for ``s3://...`` (what only looks like an address
    refused: :func:`dlrecipes.core.addresses.check_address`)."""
    from dlrecipes.core.addresses import check_address
    from dlrecipes.records.store.bucket import is_remote

    check_address(runs_dir, "runs_dir")
    if isinstance(runs_dir, str) and is_remote(runs_dir):
        from dlrecipes.records.store.objects import BucketStore

        return BucketStore(runs_dir)
    from dlrecipes.records.store.local import LocalStore

    return LocalStore(runs_dir)


def open_for_reading(target: str | Path, checkpoint: str | None = "best", asked: set[str] | None = None) -> ReadRun:
    """What a command after training reads (``target``: a run directory, a checkpoint file or an export folder,
    local or ``s3://BUCKET/PREFIX/RUN``), downloaded here: its records and the one ``checkpoint`` it needs (None:
    records only). ``asked``: the buckets this command has asked already (a command reading several runs asks each
    bucket once); the one asked here is added."""
    from dlrecipes.core.addresses import check_address
    from dlrecipes.records.store.bucket import is_remote

    check_address(target, "run")
    if not is_remote(str(target)):
        return ReadRun(target, checkpoint, str(target))
    from dlrecipes.records.store.objects import read_from_bucket

    return read_from_bucket(str(target), checkpoint, asked)


def pulled_recipe(recipe: str | Path | Mapping[str, Any]) -> str | Path | Mapping[str, Any]:
    """A recipe named by its address in a bucket, ``s3://BUCKET/PREFIX/RUN/recipe.yaml`` (a run's recorded recipe,
    as ``runs/RUN/recipe.yaml`` names one here): that file, downloaded with the run's records (as ``eval`` of the
    run reads them, so a rerun compares with the run's summary); any other recipe as it is. Where it cannot be
    read (no such run, an export that holds no recipe): one line naming the address."""
    from dlrecipes.core.addresses import check_address
    from dlrecipes.errors import RecipeError
    from dlrecipes.records.layout import RECIPE_FILE
    from dlrecipes.records.store.bucket import is_remote

    if not isinstance(recipe, str) or "://" not in recipe:
        return recipe
    run, _, name = recipe.rpartition("/")
    if name != RECIPE_FILE:
        raise RecipeError(
            f"recipe: {recipe} is no run's recorded recipe; a recipe in a bucket is read from its run, "
            f"as s3://BUCKET/PREFIX/RUN/{RECIPE_FILE}"
        )
    try:
        check_address(run, "run")
        if not is_remote(run):  # not in a bucket the store knows: a path, as it always was
            return recipe
        read = open_for_reading(run, None)
        local = Path(read.target) / RECIPE_FILE
    except UserError as exc:  # its line names the run (or the bucket): say which recipe could not be read
        exc.args = (f"recipe: {recipe} cannot be read: {str(exc).removeprefix('run: ')}",)
        raise
    if not local.is_file():
        raise UserError(f"recipe: {recipe} cannot be read: {run} holds no {RECIPE_FILE} (an export?)")
    _check_pulled_imports(local, read)
    return str(local)


def _check_pulled_imports(local: Path, read: ReadRun) -> None:
    """A bucket's recipe is data: a plugin file it names is refused before anything imports it
    (:func:`dlrecipes.records.recorded_code.check_imports`); one that cannot be read is the loader's to name."""
    from dlrecipes.errors import RecipeError
    from dlrecipes.recipe import load_recipe
    from dlrecipes.records.recorded_code import check_imports

    try:
        imports = load_recipe(local).data.get("imports")
    except RecipeError:
        return
    check_imports(imports, local, local.parent, read.address, read.bring)


def read_records(targets: Sequence[Any]) -> tuple[list[Path], dict[Path, str]]:
    """Run directories as given, each in a bucket replaced by a local copy of its records (each bucket asked once);
    returns them and, for the copies, their addresses."""
    local, addresses, asked = [], {}, set()
    for target in targets:
        read = open_for_reading(target, None, asked)
        local.append(Path(read.target))
        if read.pushes:
            addresses[Path(read.target)] = read.address
    return local, addresses


def select_runs(
    run_dirs: Sequence[Any], last: int | None, runs_dir: str | Path = RUNS_DIR
) -> tuple[list[Path], dict[Path, str]]:
    """``compare``'s selection: the runs given, or the ``last`` newest under ``runs_dir`` (a local folder or a
    bucket), as local folders (copies of the records of runs that live in a bucket), and the addresses of those."""
    if run_dirs and last is not None:
        raise UserError("give run directories or --last N, not both")
    if not run_dirs and last is None:
        raise UserError("give the run directories to compare, or --last N for the newest N runs")
    if run_dirs:
        return read_records(list(run_dirs))
    found = store_for(runs_dir).runs(last)
    return [path for path, _ in found], {path: address for path, address in found if address is not None}


class DatasetBucket:
    """A dataset kept in an object store (``dlrecipes.data.shards.dataset``): its address (``root``: bucket, prefix,
    ``key()``), the bucket through Composer's object-store layer (``backend``: ``upload``, ``read``, ``write``,
    ``listing``, ``delete``), and the S3 endpoint the run store uses (``S3_ENDPOINT_URL``; None: AWS's own)."""

    def __init__(self, root: RemoteRoot, backend: Backend, endpoint: str | None):
        self.root, self.backend, self.endpoint = root, backend, endpoint

    def __getstate__(self) -> dict:  # a spawned DataLoader worker makes its own client
        return {**self.__dict__, "backend": None}

    def client(self) -> Backend:
        """The bucket's backend in this process (made once per process: a forked worker's is its own)."""
        from dlrecipes.records.store.bucket import object_store

        return object_store(self.root, "dataset.remote")

    def download(self, key: str, path: str) -> bool:
        """``key`` into ``path`` (False when the bucket does not have it); a server that sends nothing for
        :meth:`stall` seconds raises what :meth:`stalled` recognises."""
        return self.client().download(key, path)

    @staticmethod
    def stall() -> float:
        from dlrecipes.records.store.backend import stall

        return stall()

    @staticmethod
    def stalled(exc: BaseException) -> bool:
        """Whether ``exc`` says the bucket's server stopped answering an operation (given up after :meth:`stall`)."""
        from dlrecipes.records.store.backend import ServerStalled

        return isinstance(exc, ServerStalled)

    @property
    def server(self) -> str:
        return self.client().server

    def check_writable(self, key: str, key_path: str) -> None:
        """One line when the bucket will not take a write (read-only credentials, a full server): a small object
        written at ``key``, then deleted."""
        from dlrecipes.records.store.refusals import write_refused

        try:
            self.backend.write(key, b"")
            self.backend.delete(key, f"{key_path}: the write check")
        except Exception as exc:  # botocore's ClientError and the like, answered by the bucket
            refused = write_refused(exc, str(self.root), key_path)
            if refused is None:
                raise
            raise refused from None


def dataset_bucket(address: Any, key_path: str) -> DatasetBucket | None:
    """The bucket a dataset address names, asked once (one line for wrong credentials, a missing bucket, an endpoint
    that does not answer), with the credentials and endpoint a ``runs_dir`` takes; None for a local path (what only
    looks like an address refused: :func:`dlrecipes.core.addresses.check_address`)."""
    from dlrecipes.core.addresses import check_address
    from dlrecipes.records.store.access import check_access
    from dlrecipes.records.store.backend import endpoint
    from dlrecipes.records.store.bucket import RemoteRoot, is_remote, object_store

    check_address(address, key_path)
    if not (isinstance(address, str) and is_remote(address)):
        return None
    root = RemoteRoot.parse(address, key_path)
    check_access(root, key_path)
    return DatasetBucket(root, object_store(root, key_path), endpoint() if root.scheme == "s3" else None)


__all__ = [
    "DatasetBucket",
    "ReadRun",
    "RunOptions",
    "RunStore",
    "SweepFolder",
    "TrainingRun",
    "addressed_row",
    "dataset_bucket",
    "named_by_address",
    "open_for_reading",
    "pulled_recipe",
    "read_records",
    "select_runs",
    "store_for",
]
