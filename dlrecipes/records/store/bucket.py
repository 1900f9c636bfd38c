"""Run directories in S3-compatible object storage: ``runs_dir: s3://BUCKET/PREFIX``.

A run is staged in a local folder (``$DLRECIPES_STAGING_DIR``, default ``~/.cache/dlrecipes/staging``, then
``BUCKET/PREFIX/<run name>``) and mirrored to the bucket as it goes: at each checkpoint and at the end, every file of
the run directory that changed since it was last uploaded (checkpoints first, then the records). The remote
pointer ``checkpoints/latest.txt`` names the newest checkpoint and is written only after that checkpoint's
upload is confirmed (the commit: one conditional write, each writer's checkpoints on keys of its own, written
once: :mod:`~.commit`, :mod:`~.writer`), so a run killed at any moment leaves a remote run that ``--resume`` can
continue: on a
machine with nothing local, the run's records, its logs and that checkpoint are downloaded into the staging folder
first (a resume appends to the logs, here and in the bucket). Every record that describes other files goes up only
after them: the pointer after its checkpoint, ``best.json`` after the ``best.pt`` it describes (it holds best.pt's
SHA-256, which readers check), ``summary.json`` after everything else; so however uploads fail or land late, the
bucket never claims more than it holds. ``checkpoint.keep`` holds in the bucket too: once the pointer has moved past
them, periodic checkpoints beyond the newest ``keep`` are deleted there. Every write is made under the run's lease
(:mod:`dlrecipes.records.store.lease`), which fences a writer that lost it.

The client is Composer's object-store layer (:class:`composer.utils.object_store.S3ObjectStore`, boto3 underneath):
the endpoint comes from ``S3_ENDPOINT_URL`` (MinIO, SeaweedFS, R2, ...), credentials from the standard AWS chain.
Before anything is built the bucket is asked for once, with short timeouts (:mod:`dlrecipes.records.store.access`):
wrong credentials, a missing bucket or an unreachable endpoint are one line within seconds, and nothing is created.

An upload that fails (the server went away) does not stop training: one warning, the file stays pending and is
tried again at the next checkpoint and at the end. The end waits for the uploads at most ``checkpoint.upload_wait``
seconds (saying what it waits for; the first Ctrl-C stops the wait); what is still not uploaded then is named in
summary.json (``upload_incomplete``, locally and in the bucket when it answers) and by :meth:`RemoteRun.incomplete`,
which the fit stage turns into one line and a non-zero exit; a later ``--resume`` uploads it and clears the mark.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.core.addresses import check_address, check_key_room, scheme_of, shortened
from dlrecipes.core.secrets import credential_home, redact_uri
from dlrecipes.errors import UserError, first_line
from dlrecipes.records.layout import (
    BEST_CHECKPOINT,
    BEST_INFO,
    CHECKPOINT_DIR,
    HISTORY_FILE,
    LOCK_FILE,
    LOG_FILE,
    RECIPE_FILE,
    REMOTE_LATEST,
    SUMMARY_FILE,
    RunDir,
    is_periodic,
    longest_relative_path,
    periodic_progress,
)
from dlrecipes.records.store.commit import Pointer, lineage_checkpoints, read_pointer, untagged
from dlrecipes.records.store.writer import FENCED_RECORDS, Writer

if TYPE_CHECKING:
    from dlrecipes.records.store.backend import Backend
    from dlrecipes.records.store.commit import Commit
    from dlrecipes.records.store.lease import BucketLease
    from dlrecipes.records.store.upload_process import UploadProcess

STAGING_ENV = "DLRECIPES_STAGING_DIR"
RECORDS_FOR_RESUME = (RECIPE_FILE, SUMMARY_FILE)  # besides history.csv and the pointer's checkpoint
POINTER = f"{CHECKPOINT_DIR}/{REMOTE_LATEST}"
BEST = f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}"
BEST_RECORD = f"{CHECKPOINT_DIR}/{BEST_INFO}"
LOG_PREFIX = LOG_FILE.split("{", 1)[0]  # train-rank: each process's log (train-rank0.log, ...)
PULL_LOCK = ".pull.lock"  # in a staging folder: its processes download a run one at a time
PULL_FAILED = ".pull-failed"  # beside it: the line of a download its server did not answer, for the node's others
_BUCKET_NAMES = {  # each service's rules (S3's: what every compatible server takes)
    "s3": (
        r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
        "3 to 63 lowercase letters, digits, dots and hyphens, beginning and ending with a letter or digit",
    ),
    "gs": (
        r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$",
        "3 to 63 lowercase letters, digits, dots, hyphens and underscores, beginning and ending with a letter or digit",
    ),
    "oci": (r"^[A-Za-z0-9._-]{1,256}$", "letters, digits, dots, hyphens and underscores"),
    "azure": (
        r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$",
        "3 to 63 lowercase letters, digits and single hyphens, beginning and ending with a letter or digit",
    ),
}
_IP_ADDRESS = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def upload_order(relative: str) -> tuple:
    """Periodic checkpoints first, oldest first; then the rest by name."""
    return (not is_periodic(Path(relative)), periodic_progress(Path(relative)), relative)


def is_remote(runs_dir: Any) -> bool:
    return scheme_of(runs_dir) is not None


@dataclass(frozen=True)
class RemoteRoot:
    """``s3://bucket/prefix`` (or ``gs://``, ``oci://``, ``azure://``): where a remote ``runs_dir`` keeps its runs."""

    bucket: str
    prefix: str
    scheme: str = "s3"

    @classmethod
    def parse(cls, url: str, key_path: str = "runs_dir") -> RemoteRoot:
        check_address(url, key_path)
        scheme = scheme_of(url) or "s3"
        bucket, _, prefix = url[len(scheme) + 3 :].partition("/")
        example = f"{scheme}://BUCKET/PREFIX"
        if "@" in bucket:  # boto3 reads no credentials from an address: it would take them for the bucket's name
            raise UserError(
                f"{key_path}: {redact_uri(url)}: {scheme.upper()} credentials are not taken from the address; "
                f"set {credential_home('runs_dir')} in the environment instead, and give {example}"
            )
        if not bucket:
            raise UserError(f"{key_path}: {url!r} names no bucket (expected {scheme}://BUCKET or {example})")
        pattern, rules = _BUCKET_NAMES[scheme]
        if not re.match(pattern, bucket) or ".." in bucket or _IP_ADDRESS.match(bucket):
            raise UserError(f"{key_path}: {url!r}: {bucket!r} is not a valid bucket name ({rules})")
        segments = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
        bad = next((s for s in segments if s in ("", ".", "..")), None)
        if bad is not None:
            what = "an empty segment (//)" if bad == "" else f"a {bad!r} segment"
            raise UserError(f"{key_path}: {url!r}: the prefix has {what}; give {example} with plain folder names")
        return cls(bucket, prefix.strip("/"), scheme)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p)

    def local_part(self) -> Path:
        """Where this root's copies go under a local folder: ``BUCKET/PREFIX`` (another scheme's: ``.gs/BUCKET/...``,
        which no bucket's name can be)."""
        return Path(*([] if self.scheme == "s3" else [f".{self.scheme}"]), self.bucket, self.prefix)

    def staging(self) -> Path:
        """The local folder runs of this root are staged in."""
        return staging_base() / self.local_part()

    def check_room(self, run_name: str, key_path: str = "runs_dir") -> None:
        """One line when a run ``run_name`` here could not be written whole: its longest key over the object store's
        limit, or its staging path over this file system's (a name over NAME_MAX bytes, a path over PATH_MAX)."""
        longest = longest_relative_path()
        check_key_room(str(self), self.key(run_name, longest), key_path)
        path = self.staging() / run_name / longest
        existing = next(p for p in (path, *path.parents) if p.exists())
        name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
        long_name = next((part for part in path.parts if len(os.fsencode(part)) > name_max), None)
        if long_name is not None:
            raise UserError(
                f"{key_path}: the staging folder would hold a name of {len(os.fsencode(long_name))} bytes "
                f"({shortened(long_name, 30)}), over this file system's {name_max}; choose shorter prefix "
                f"folders or run_name for {shortened(str(self), 40)}"
            )
        if len(os.fsencode(str(path))) >= path_max:
            raise UserError(
                f"{key_path}: a run's staging path would be {len(os.fsencode(str(path))):,} bytes, over this "
                f"file system's {path_max:,}; choose a shorter prefix, run_name or {STAGING_ENV} for "
                f"{shortened(str(self), 40)}"
            )


def _limit(path: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError):
        return default


def staging_base() -> Path:
    return Path(os.environ.get(STAGING_ENV) or Path.home() / ".cache" / "dlrecipes" / "staging")


def object_store(root: RemoteRoot, key_path: str = "runs_dir") -> Backend:
    """``root``'s bucket through Composer's object-store layer (a :class:`dlrecipes.records.store.backend.Backend`)."""
    from dlrecipes.records.store.backend import make_backend

    return make_backend(root.scheme, root.bucket, str(root), key_path)


@dataclass
class RemoteRun(Writer):
    """One run directory staged at ``local`` and mirrored to ``root``/``name``."""

    root: RemoteRoot
    name: str
    local: Path
    sent: dict[str, tuple[int, int]] = field(default_factory=dict)  # relative path -> (size, mtime_ns) uploaded
    pending: list[str] = field(default_factory=list)  # relative paths whose upload failed
    warned: bool = False
    offload: UploadProcess | None = None  # a training's (store.upload_process): its large files go up through it
    lease: BucketLease | None = None  # a training's: every write is made under it (a sweep's own files have none)
    keep: int = -1  # checkpoint.keep: periodic checkpoints kept in the bucket once the pointer is past them
    abandoned: bool = False  # the end stopped waiting: no further file is started
    commit: Commit | None = None  # a training's: the pointer it holds (store.commit), taken over at its start
    start: tuple[int, int] | None = None  # a training's: the progress it started from (its lineage entry)
    resuming: bool = False  # a training's: it continues the run the bucket has (else a new run under the name)
    record_tags: dict[str, str] = field(default_factory=dict)  # a training's: each shared record's ETag (store.writer)
    _store: Backend | None = None

    def store(self) -> Backend:
        if self._store is None:
            self._store = object_store(self.root)
        return self._store

    def key(self, relative: str) -> str:
        return self.root.key(self.name, relative)

    # --- up -----------------------------------------------------------------------------------------------

    def _changed(self) -> list[str]:
        """Files of the run directory that changed since they were last uploaded: checkpoints first (oldest
        first), then the rest. Links, the lock and partial files are not mirrored."""
        files = []
        for path in self.local.rglob("*"):
            if path.is_symlink() or not path.is_file() or path.name == LOCK_FILE or ".partial" in path.name:
                continue
            relative = path.relative_to(self.local).as_posix()
            if relative == POINTER:  # uploaded by _point_to alone, after its checkpoint
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # rotated away (checkpoint.keep) while the folder was listed
                continue
            if self.sent.get(relative) != (stat.st_size, stat.st_mtime_ns):
                files.append(relative)
        return sorted(files, key=upload_order)

    def _upload(self, relative: str) -> bool:
        path = self.local / relative
        try:
            stat = path.stat()
        except FileNotFoundError:  # rotated away (checkpoint.keep) before its turn: nothing to upload
            return False
        from dlrecipes.records.store.lease import LeaseLost

        try:
            if self.lease is not None:
                self.lease.guard()
            self._send(relative, stat.st_size)
        except LeaseLost:
            raise
        except Exception as exc:  # server gone: training goes on, one warning, tried again later
            if not path.exists():  # rotated away while it was uploaded: not a failure
                return False
            self._failed(relative, exc)
            return False
        self.sent[relative] = (stat.st_size, stat.st_mtime_ns)
        if relative in self.pending:
            self.pending.remove(relative)
        return True

    def _failed(self, relative: str, exc: BaseException) -> None:
        """``relative`` stays pending and is tried again at the next push; the first failure prints a warning."""
        if relative not in self.pending:
            self.pending.append(relative)
        if not self.warned:
            self.warned = True
            print(
                f"warning: uploading to {self.root}/{self.name} failed ({type(exc).__name__}: "
                f"{first_line(exc, 160, '')}); training goes on, the upload is tried "
                "again at the next checkpoint and at the end",
                file=sys.stderr,
            )

    def _send(self, relative: str, size: int) -> None:
        """A large file through the upload process (when there is one that works), a small one in one request from
        here, any other through the client's transfer from here."""
        from dlrecipes.records.store.backend import Conflict
        from dlrecipes.records.store.upload_process import LARGE

        key = self.key(self.remote(relative))
        once = self.lease is not None and is_periodic(Path(relative))  # a writer's own periodic key: written once
        try:
            if self.offload is not None and self.offload.usable() and size >= LARGE:
                try:
                    return self.offload.upload(key, str(self.local / relative), once)
                except OSError:  # upload process gone (one warning): this thread uploads, unless the end gave up
                    if self.abandoned:
                        raise
            if size < LARGE and self.lease is not None and relative in FENCED_RECORDS:  # on the ETag it last wrote
                return self.write_record(relative, self._bytes(relative))
            if size < LARGE:  # one request from this (daemon) thread: nothing a hung server can hold the exit on
                self.store().write(key, self._bytes(relative), if_absent=once)
                return
            self.store().upload(key, str(self.local / relative), once)
        except Conflict:  # this writer's own key is there: an earlier try of this upload landed, or it is refused
            if size < LARGE:
                same = self.store().read(key) == (self.local / relative).read_bytes()
            else:  # (as large as a checkpoint: its size says it)
                same = self.store().listing(key).get("", (None,))[0] == size
            if not same:
                raise RuntimeError(
                    f"{key} is in the bucket already, as other bytes; it is never written over"
                ) from None

    def push(self) -> None:
        """Upload what changed, each record after what it describes (see the module docstring): after each
        periodic checkpoint whose upload is confirmed, move the pointer to it (and delete what ``keep`` rotated
        away); ``best.json`` once its ``best.pt`` is up; ``summary.json`` last, once nothing else is missing."""
        self.pending = [r for r in self.pending if (self.local / r).exists()]  # rotated away: nothing to upload
        changed = self._changed()
        for relative in changed:
            if self.abandoned:
                return
            if relative in (BEST_RECORD, SUMMARY_FILE) or relative == HISTORY_FILE and self.lease is not None:
                continue  # (a training's history goes up with its commits: never ahead of them)
            if self._committed_already(relative):
                continue
            if self._upload(relative) and is_periodic(Path(relative)):
                self._point_to(Path(relative).name)
        if POINTER in self.pending and not self.abandoned:  # its move failed: tried again, to what it names here
            self._point_to(_local_pointer(self.local / POINTER))
        for record, after in ((BEST_RECORD, (BEST,)), (SUMMARY_FILE, None)):
            if record not in changed or self.abandoned:
                continue
            # what it describes and is not up: what failed, and the checkpoints (not another rank's log, which
            # its own process may still be writing)
            missing = [
                r
                for r in self.pending + [c for c in self._changed() if c.startswith(CHECKPOINT_DIR + "/")]
                if r not in (record, HISTORY_FILE) and (after is None or r in after)
            ]
            if missing:  # what it describes is not up: it waits, named as not uploaded
                if record not in self.pending:
                    self.pending.append(record)
                continue
            if self._still_held(record):
                if record == SUMMARY_FILE and HISTORY_FILE in self._changed() and not self._upload(HISTORY_FILE):
                    continue  # the whole history before the summary that ends it
                self._upload(record)

    def _point_to(self, checkpoint: str) -> None:
        """The pointer moved to ``checkpoint`` (only forward: an older checkpoint whose upload was late does not
        take it back), then what ``keep`` rotated away deleted."""
        if self.abandoned:
            return
        current = self.local / POINTER
        named = _local_pointer(current) if current.is_file() else ""
        if (
            named
            and named != checkpoint
            and is_periodic(Path(named))
            and periodic_progress(Path(named)) > periodic_progress(Path(checkpoint))
        ):
            return
        current.write_text(checkpoint + "\n")
        if self._still_held(POINTER) and self._commit(checkpoint):
            self._history_upto(periodic_progress(Path(checkpoint))[1])
            self._rotate(checkpoint)

    def _still_held(self, record: str) -> bool:
        """Before a record that describes other files moves: the lease confirmed (:class:`LeaseLost` when it was
        taken); a server that does not answer leaves ``record`` pending, as a failed upload does."""
        from dlrecipes.records.store.lease import LeaseLost

        if self.lease is None:
            return True
        try:
            self.lease.confirm()
            return True
        except LeaseLost:
            raise
        except Exception as exc:
            self._failed(record, exc)
            return False

    def _pull_older_than(self, pointer: Pointer) -> None:
        """The run's periodic checkpoints older than ``pointer``'s (its lineage's: never a fenced writer's late
        upload), newest first, downloaded until one loads."""
        from dlrecipes.records.store.safe_keys import staged_path

        names = [key.rsplit("/", 1)[-1] for key in self.store().keys(self.key(CHECKPOINT_DIR) + "/")]
        for name in lineage_checkpoints(names, pointer, pointer.checkpoint):
            relative = f"{CHECKPOINT_DIR}/{untagged(name)}"
            local = staged_path(self.local, relative, f"{self.root}/{self.name}")
            if (local.is_file() or self._download(f"{CHECKPOINT_DIR}/{name}", relative)) and damage(local) is None:
                return

    def incomplete(self) -> list[str]:
        """What is not in the bucket as it is here (checkpoints first)."""
        return sorted(self.pending, key=upload_order)

    # --- down ---------------------------------------------------------------------------------------------

    def _download(self, relative: str, local: str | None = None) -> bool:
        """``relative`` from the bucket into the staging folder (as ``local``: a checkpoint there carries no writer
        tag); False when the bucket does not have it.  A key that would land outside the folder is refused first
        (:func:`~.safe_keys.staged_path`), nothing created."""
        from dlrecipes.records.store.safe_keys import staged_path

        local = local or relative
        target = staged_path(self.local, local, f"{self.root}/{self.name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not self.store().download(self.key(relative), str(target)):
            return False
        stat = target.stat()
        self.sent[local] = (stat.st_size, stat.st_mtime_ns)  # the bucket has it as it is
        return True

    def pull_for_resume(self) -> Path | None:
        """The run's records and its newest complete checkpoint (the pointer's), downloaded into the staging
        folder where they are missing; returns that checkpoint's local path (None: the bucket has no such run, or
        no checkpoint of it yet)."""
        from dlrecipes.records.layout import HISTORY_FILE

        pointer = POINTER
        if not self._download(pointer):  # no checkpoint yet (or no such run): its records, if any
            for relative in (*RECORDS_FOR_RESUME, HISTORY_FILE, *self._logs()):
                self._download(relative)
            return None
        committed = read_pointer(self.local / pointer, f"{self.root}/{self.name}/{pointer}", "--resume")
        name = committed.checkpoint
        checkpoint = f"{CHECKPOINT_DIR}/{untagged(name)}"
        if not (self.local / checkpoint).is_file():
            if not self._download(f"{CHECKPOINT_DIR}/{name}", checkpoint):
                raise UserError(
                    f"--resume: {self.root}/{self.name}: the pointer names {name}, which the bucket does not have"
                )
        if damage(self.local / checkpoint):  # as locally: the newest one that loads (--resume says which it skipped)
            self._pull_older_than(committed)
        for relative in (*RECORDS_FOR_RESUME, HISTORY_FILE, *self._logs()):
            if not (self.local / relative).is_file():
                self._download(relative)
        return self.local / checkpoint

    def _logs(self) -> list[str]:
        """The run's process logs in the bucket (a resume appends to them)."""
        relatives = (key[len(self.key("")) + 1 :] for key in self.store().keys(self.key(LOG_PREFIX)))
        return [relative for relative in relatives if "/" not in relative]


def _local_pointer(path: Path) -> str:
    """The checkpoint a pointer here names, as the run's folder names it (the bucket's pointer downloaded here holds
    its writer's tag and lines: :mod:`~.commit`)."""
    from dlrecipes.records.store.commit import untagged

    text = path.read_text(errors="replace").strip()
    return untagged(text.split("\n", 1)[0].strip())


def damage(path: Path, key: str = "--resume") -> str | None:
    """Why a checkpoint fails to load (tensors-only), or None; one holding objects beyond tensors is not damaged:
    the command refuses it as it would a local one."""
    from dlrecipes.records.checkpoint_safety import UntrustedCheckpoint
    from dlrecipes.records.checkpoints import loadable

    try:
        return loadable(path, False, key)
    except UntrustedCheckpoint:
        return None


def older_checkpoints(keys: list[str], newest: str) -> list[str]:
    """The periodic checkpoints among ``keys`` older than ``newest``, newest first (their names)."""
    names = {key.rsplit("/", 1)[-1] for key in keys}
    limit = periodic_progress(Path(newest))
    return sorted(
        (n for n in names if is_periodic(Path(n)) and periodic_progress(Path(n)) < limit),
        key=lambda n: periodic_progress(Path(n)),
        reverse=True,
    )


def staged_run(root: RemoteRoot, name: str) -> RemoteRun:
    return RemoteRun(root, name, RunDir(root.staging() / name).path)
