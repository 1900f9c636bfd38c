"""The bucket's side of opening a run for training, before anything is built: the bucket asked for, a name it holds a
run under claimed as a local runs folder would (refused, or the run moved aside; never under a live lease), and with
``--resume`` the run's records, logs and newest checkpoint that loads brought into the staging folder."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from dlrecipes.errors import UserError
from dlrecipes.records.layout import RECIPE_FILE, SUMMARY_FILE
from dlrecipes.records.store.bucket import PULL_LOCK, RemoteRoot, object_store, staged_run

if TYPE_CHECKING:
    from dlrecipes.records.store.backend import Backend


def prepare(root: RemoteRoot, run_name: Optional[str], resume: bool, restart: bool = False) -> None:
    """Before a training opens its run in the bucket (which its store has asked: one line if it cannot be used):
    refuse a name it holds a run under as a local runs folder would (:func:`claim_name`), and with ``resume`` bring
    the named run's records and newest checkpoint that loads into the staging folder."""
    if resume and not run_name:
        raise UserError(f"--resume: name the run to continue in {root} (run_name=...)")
    from dlrecipes.core.distributed import rank

    if run_name and not resume and rank() == 0:
        claim_name(root, run_name, restart)
    if resume and check_run_in_bucket(root, run_name):
        with _one_at_a_time(root.staging()):  # the processes of a node share its staging folder: one downloads
            staged_run(root, run_name).pull_for_resume()


def claim_name(root: RemoteRoot, name: str, restart: bool) -> None:
    """A new run under ``name`` where the bucket holds one: refused (a finished or running run is never overwritten,
    whichever machine asks; one whose lease is live is refused even with ``--restart``), unless ``restart``
    (``--restart``) or the run there failed: then it is moved aside in the bucket, to ``<name>.restarted-<time>``
    (``.failed-``, ``.diverged-``), with a warning."""
    from dlrecipes.records.run_dir import FAILED

    from dlrecipes.records.store.lease import live_holder, refusal

    store = object_store(root)
    if not store.keys(root.key(name, RECIPE_FILE)):
        return
    held = live_holder(store, root, name)  # a run another machine trains now: never moved aside under it
    if held is not None:
        raise refusal(root, name, held)
    status = _status_in_bucket(store, root, name)
    if not restart and status not in FAILED:
        raise UserError(
            f"run_name: {root}/{name} already holds a run; pass --resume to continue it, --restart to train "
            "it again from the beginning (the old run is kept under another name), or choose another "
            "run_name"
        )
    stem = f"{name}.{'restarted' if restart else status}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside = next(
        n for n in (stem if i == 1 else f"{stem}-{i}" for i in range(1, 1000)) if not store.keys(root.key(n) + "/")
    )
    why = (
        f"--restart: {root}"
        if restart
        else f"run_name: {root}/{name} holds a run that {status}; moving it aside needs a delete, and {root}"
    )
    if not store.deletes:  # said before anything is copied
        store.delete(root.key(name, RECIPE_FILE), why)
    keys = store.keys(root.key(name) + "/")
    try:
        for key in keys:  # a copy (S3: server-side, nothing passes through this machine), then the original goes
            store.copy(key, root.key(aside) + key[len(root.key(name)) :])
        for key in keys:
            store.delete(key, why)
    except Exception as exc:  # read-only keys, a full or silent server: one line (the run stays where it was)
        from dlrecipes.records.store.backend import write_refused

        refused = write_refused(exc, str(root)) if not isinstance(exc, UserError) else None
        if refused is None:
            raise
        raise refused from None
    why = "--restart: the run" if restart else f"the run that {'diverged' if status == 'diverged' else 'failed'}"
    print(
        f"warning: {why} that was in {root}/{name} is kept as {root}/{aside}; this run starts from the beginning",
        file=sys.stderr,
    )


def _status_in_bucket(store: Backend, root: RemoteRoot, name: str) -> Optional[str]:
    """The run's summary.json status in the bucket (None: no summary yet, or one that cannot be read)."""
    import json

    try:
        status = json.loads(store.read(root.key(name, SUMMARY_FILE)) or b"{}").get("status")
    except (ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None


def check_run_in_bucket(root: RemoteRoot, name: str) -> bool:
    """Whether the bucket has the run; ``--resume`` of a run it does not have is refused, as for a local runs_dir
    (unless ``DLRECIPES_RESUME_MISSING=start``: a requeued job whose first start uploaded nothing starts it)."""
    from dlrecipes.core.distributed import rank
    from dlrecipes.records.run_dir import RESUME_MISSING

    if object_store(root).keys(root.key(name, RECIPE_FILE)):
        return True
    if os.environ.get(RESUME_MISSING) == "start":
        if rank() == 0:
            print(f"note: no run {name!r} in {root} yet ({RESUME_MISSING}=start): starting it", file=sys.stderr)
            (root.staging() / name).mkdir(parents=True, exist_ok=True)  # said once: the staging folder has it
        return False
    raise UserError(
        f"run_name: --resume found no run {name!r} in {root} (`dlrecipes runs {root}` lists the runs "
        "there). Without --resume a new run starts under that name"
    )


@contextmanager
def _one_at_a_time(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder``'s pull lock file: the processes of one machine bring a run here in turn
    (the first downloads; the others find the files and download only the pointer). Each machine has its own
    staging folder, so nodes without a shared filesystem each bring their own copy."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / PULL_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
