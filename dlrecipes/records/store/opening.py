"""The bucket's side of opening a run for training, before anything is built: the bucket asked for, a name it holds a
run under claimed as a local runs folder would (refused, or the run moved aside; never under a live lease), and with
``--resume`` the run's records, logs and newest checkpoint that loads brought into the staging folder."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from dlrecipes.errors import UserError
from dlrecipes.records.layout import LEASE_FILE, RECIPE_FILE, SUMMARY_FILE
from dlrecipes.records.store.bucket import PULL_FAILED, PULL_LOCK, RemoteRoot, object_store, staged_run

if TYPE_CHECKING:
    from dlrecipes.records.store.backend import Backend
    from dlrecipes.records.store.lease import BucketLease


def prepare(root: RemoteRoot, run_name: str | None, resume: bool, restart: bool = False) -> BucketLease | None:
    """Before a training opens its run in the bucket (which its store has asked: one line if it cannot be used):
    refuse a name it holds a run under as a local runs folder would, or move that run aside under this process's
    lease (:func:`claim_name`: the lease it took is returned, for the training to hold), and with ``resume`` bring
    the named run's records and newest checkpoint that loads into the staging folder."""
    if resume and not run_name:
        raise UserError(f"--resume: name the run to continue in {root} (run_name=...)")
    from dlrecipes.core.distributed import rank

    claimed = None
    if run_name and not resume and rank() == 0:
        claimed = claim_name(root, run_name, restart)
    if resume and check_run_in_bucket(root, run_name):
        with _one_at_a_time(root.staging()):  # the processes of a node share its staging folder: one downloads
            _pull_once(root, run_name)
    return claimed


def _pull_once(root: RemoteRoot, run_name: str) -> None:
    """The run brought into the staging folder for ``--resume``, by one process of the node at a time. Where the
    server did not answer one of them (given up after the bound), the node's other processes do not try again for
    the same bound: each ends at once with that line, so every rank stops within the bound, not one bound each."""
    import time

    from dlrecipes.records.store.backend import ServerStalled, stall
    from dlrecipes.records.store.refusals import ServerFailed

    failed = root.staging() / f"{PULL_FAILED}.{run_name.replace('/', '_')}"
    if failed.is_file() and time.time() - failed.stat().st_mtime < stall():
        raise ServerStalled(f"{failed.read_text().strip()} (given up by another process on this machine)")
    try:
        staged_run(root, run_name).pull_for_resume()
    except (ServerStalled, ServerFailed) as exc:
        failed.write_text(str(exc))
        raise
    failed.unlink(missing_ok=True)


def claim_name(root: RemoteRoot, name: str, restart: bool) -> BucketLease | None:
    """A new run under ``name`` where the bucket holds one: refused (a finished or running run is never overwritten,
    whichever machine asks; one whose lease is live is refused even with ``--restart``), unless ``restart``
    (``--restart``) or the run there failed: then this process takes the run's lease first and, under it, moves the
    run aside to ``<name>.restarted-<time>`` (``.failed-``, ``.diverged-``), with a warning (:func:`_move_aside`).
    Returns the lease taken (None where the name was free: the training takes it as it opens the run)."""
    from dlrecipes.records.run_dir import FAILED
    from dlrecipes.records.store.lease import BucketLease, live_holder, refusal

    store = object_store(root)
    found = _marker(store, root, name)
    unfinished = bool(found) and not found.get("copying")  # a move cut off while deleting: the run is aside already
    if not found and not store.keys(root.key(name, RECIPE_FILE)):
        return None
    held = live_holder(store, root, name)  # a run another machine trains now: never moved aside under it
    if held is not None:
        raise refusal(root, name, held)
    status = _status_in_bucket(store, root, name)
    if not unfinished and not restart and status not in FAILED:
        raise UserError(
            f"run_name: {root}/{name} already holds a run; pass --resume to continue it, --restart to train "
            "it again from the beginning (the old run is kept under another name), or choose another "
            "run_name"
        )
    why = (
        f"--restart: {root}"
        if restart
        else f"run_name: {root}/{name} holds a run that {status}; moving it aside needs a delete, and {root}"
    )
    if not store.deletes:  # said before anything is written
        store.delete(root.key(name, RECIPE_FILE), why)
    lease = BucketLease(store, root, name).take()  # refused while another process holds it (it won the race)
    try:
        marker = _marker(store, root, name)
        if marker.get("copying"):  # an earlier move cut off while copying: its partial copy goes, the run stays
            _clear_cut_copy(store, root, name, lease, marker.get("aside"))
            marker = {}
        if marker:  # an earlier move cut off while deleting: finished, not redone
            _finish_move(store, root, name, lease, why)
        elif store.keys(root.key(name, RECIPE_FILE)):
            _move_aside(store, root, name, lease, status, restart, why)
    except BaseException:
        lease.release()
        raise
    return lease


ASIDE_MARKER = "moving-aside.json"  # in a run being moved aside: where it goes ("copying": not all of it yet)


def _move_aside(
    store: Backend, root: RemoteRoot, name: str, lease: BucketLease, status: str | None, restart: bool, why: str
) -> None:
    """Move the run under ``name`` aside, under ``lease``: every key copied (S3: server-side), the lease confirmed
    before each; then a marker naming where it went; then the originals deleted, the recipe last, and the marker.
    A process paused past its lease's term writes nothing when it wakes (:class:`~.lease.LeaseLost`, one line):
    cut off while copying, it deletes its own partial copy; cut off while deleting, the process that took the lease
    over finds the marker and finishes the deletes (:func:`_finish_move`), so the run aside is always whole."""
    from dlrecipes.records.store.lease import LeaseLost

    stem = f"{name}.{'restarted' if restart else status}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside = next(
        n for n in (stem if i == 1 else f"{stem}-{i}" for i in range(1, 1000)) if not store.keys(root.key(n) + "/")
    )
    keys = [key for key in store.keys(root.key(name) + "/") if key != lease.key]
    keys.sort(key=lambda key: key == root.key(name, RECIPE_FILE))  # the recipe last: a run is there until the end
    copied: list[str] = []
    with _refusals(root):
        try:
            lease.guard()  # where the copy goes, said first: a process killed while copying leaves it named
            store.write(root.key(name, ASIDE_MARKER), json.dumps({"aside": aside, "copying": True}).encode())
            for key in keys:
                lease.guard()
                copied.append(root.key(aside) + key[len(root.key(name)) :])
                store.copy(key, copied[-1])
        except LeaseLost:
            for key in copied:  # this process's partial copy (the marker names it for whoever takes the run next)
                _delete_quietly(store, key)
            raise
        lease.confirm()
        store.write(root.key(name, ASIDE_MARKER), json.dumps({"aside": aside}).encode())
        _delete_moved(store, root, name, lease, keys, why)
    why = "--restart: the run" if restart else f"the run that {'diverged' if status == 'diverged' else 'failed'}"
    print(
        f"warning: {why} that was in {root}/{name} is kept as {root}/{aside}; this run starts from the beginning",
        file=sys.stderr,
    )


def _marker(store: Backend, root: RemoteRoot, name: str) -> dict:
    """The move-aside marker of ``root/name`` (``{}``: none, or one that is no object)."""
    try:
        marker = json.loads(store.read(root.key(name, ASIDE_MARKER)) or b"{}")
    except ValueError:
        return {"aside": None}
    return marker if isinstance(marker, dict) else {"aside": None}


def _clear_cut_copy(store: Backend, root: RemoteRoot, name: str, lease: BucketLease, aside: object) -> None:
    """A move aside cut off while copying (its process killed, or paused past its term): the run is whole where it
    was; the partial copy the marker names is deleted (never a folder that holds a recipe: that is a run), then the
    marker. The marker is data: an aside name with a ``/`` is refused in one line."""
    if not isinstance(aside, str) or not aside or "/" in aside or aside in (".", ".."):
        raise UserError(
            f"run_name: {root}/{name}/{ASIDE_MARKER} names {aside!r}, which is no folder a move aside makes; it is no "
            "marker dlrecipes wrote: delete it, or choose another run_name"
        )
    keys = store.keys(root.key(aside) + "/")
    with _refusals(root):
        if root.key(aside, RECIPE_FILE) not in keys:  # (a whole copy has the recipe, copied last: kept)
            for key in keys:
                lease.guard()
                store.delete(key, f"{root}/{aside}")
        lease.guard()
        store.delete(root.key(name, ASIDE_MARKER), f"{root}/{name}")
    print(
        f"note: an earlier move of {root}/{name} aside was cut off while copying; its partial copy "
        f"{root}/{aside} was removed",
        file=sys.stderr,
    )


def _finish_move(store: Backend, root: RemoteRoot, name: str, lease: BucketLease, why: str) -> None:
    """A move aside whose process was cut off while deleting (its marker is there): the rest deleted, once each of
    it is found in the folder the marker names with the same size (the marker is data: one naming a folder that does
    not hold the run is refused in one line), with a warning naming that folder."""
    try:
        aside = json.loads(store.read(root.key(name, ASIDE_MARKER)) or b"{}").get("aside")
    except (ValueError, AttributeError):
        aside = None
    left = {
        relative: size
        for relative, (size, _) in store.listing(root.key(name) + "/").items()
        if relative not in (LEASE_FILE, ASIDE_MARKER)
    }
    copied = store.listing(root.key(aside) + "/") if isinstance(aside, str) and "/" not in aside else {}
    if not copied or any(copied.get(relative, (None,))[0] != size for relative, size in left.items()):
        raise UserError(
            f"run_name: {root}/{name}/{ASIDE_MARKER} names {aside!r}, which does not hold the rest of the run; it is "
            "no marker dlrecipes wrote: delete it, or choose another run_name"
        )
    keys = [root.key(name, relative) for relative in left]
    keys.sort(key=lambda key: key == root.key(name, RECIPE_FILE))
    with _refusals(root):
        _delete_moved(store, root, name, lease, keys, why)
    print(
        f"warning: an earlier move of the run in {root}/{name} was cut off; it is kept whole as {root}/{aside}, "
        "and this run starts from the beginning",
        file=sys.stderr,
    )


def _delete_moved(store: Backend, root: RemoteRoot, name: str, lease: BucketLease, keys: list[str], why: str) -> None:
    """The originals of a run copied aside deleted under ``lease`` (confirmed before each), then the marker."""
    for key in keys:
        lease.guard()
        store.delete(key, why)
    lease.guard()
    store.delete(root.key(name, ASIDE_MARKER), why)


def _delete_quietly(store: Backend, key: str) -> None:
    try:
        store.delete(key, key)
    except Exception:  # left for whoever lists the bucket: a partial copy under a name no run has
        pass


@contextmanager
def _refusals(root: RemoteRoot) -> Iterator[None]:
    """Read-only keys, a full or silent server: one line (the run stays where it was, or whole where it went)."""
    try:
        yield
    except Exception as exc:
        from dlrecipes.records.store.refusals import write_refused

        cause = getattr(exc, "cause", exc)  # (a write the server failed: said as the first write's refusal)
        refused = write_refused(cause, str(root)) if not isinstance(cause, UserError) else None
        if refused is None:
            raise
        raise refused from None


def _status_in_bucket(store: Backend, root: RemoteRoot, name: str) -> str | None:
    """The run's summary.json status in the bucket (None: no summary yet, one that cannot be read, or one whose
    writer does not hold the run's commit: a fenced writer's late upload, which is not the run's)."""
    import json

    from dlrecipes.records.layout import CHECKPOINT_DIR, REMOTE_LATEST
    from dlrecipes.records.store.commit import LEGACY, parse_pointer

    try:
        summary = json.loads(store.read(root.key(name, SUMMARY_FILE)) or b"{}")
        status, writer = summary.get("status"), summary.get("writer")
        if isinstance(writer, str):
            raw = store.read(root.key(name, CHECKPOINT_DIR, REMOTE_LATEST))
            committed = parse_pointer(raw, f"{root}/{name}", "runs_dir").writer if raw is not None else LEGACY
            if committed not in (LEGACY, writer):
                return None
    except (ValueError, AttributeError, UserError):
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
            (root.staging() / name).mkdir(parents=True, exist_ok=True)  # made by rank 0 only
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
