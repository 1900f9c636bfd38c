"""The writer's side of a bucket run (:class:`~.bucket.RemoteRun` as a training holding the run's lease writes it):
its checkpoints on keys of its own, written once; the pointer moved by one conditional write
(:mod:`~.commit`); history.csv never ahead of the commit; summary.json naming its writer; ``checkpoint.keep`` and a
fenced writer's strays deleted after each commit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.records.layout import (
    BEST_CHECKPOINT,
    BEST_INFO,
    CHECKPOINT_DIR,
    HISTORY_FILE,
    REMOTE_LATEST,
    SUMMARY_FILE,
    is_periodic,
    periodic_progress,
)
from dlrecipes.records.store.commit import lineage_checkpoints

if TYPE_CHECKING:
    from dlrecipes.records.store.backend import Backend
    from dlrecipes.records.store.commit import Commit
    from dlrecipes.records.store.lease import BucketLease

POINTER = f"{CHECKPOINT_DIR}/{REMOTE_LATEST}"


class Writer:
    """What :class:`~.bucket.RemoteRun` does as a writer (see the module docstring)."""

    local: Path
    lease: BucketLease | None
    commit: Commit | None
    start: tuple[int, int] | None
    keep: int
    resuming: bool
    abandoned: bool
    root: Any
    name: str
    pending: list[str]
    sent: dict[str, tuple[int, int]]

    if TYPE_CHECKING:

        def store(self) -> Backend: ...
        def key(self, relative: str) -> str: ...
        def _upload(self, relative: str) -> bool: ...
        def _failed(self, relative: str, exc: BaseException) -> None: ...

        record_tags: dict[str, str]

    @property
    def writer(self) -> str:
        """This training's writer tag (:mod:`~.commit`), "" where no lease is held (nothing is written as a writer)."""
        from dlrecipes.records.store.commit import writer_tag

        return writer_tag(self.lease.token) if self.lease is not None else ""

    def remote(self, relative: str) -> str:
        """The bucket's name for the run's file ``relative``: a periodic checkpoint carries its writer's tag."""
        from dlrecipes.records.store.commit import best_name, tagged

        if self.lease is None:
            return relative
        if relative == f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}":
            return f"{CHECKPOINT_DIR}/{best_name(self.writer)}"
        if not is_periodic(Path(relative)):
            return relative
        return f"{CHECKPOINT_DIR}/{tagged(Path(relative).name, self.writer)}"

    def take_over(self) -> None:
        """At a training's start, under its lease: the bucket's pointer read (:meth:`~.commit.Commit.start`: nothing
        is written until the first commit, which takes the run over only if no other writer committed since); this
        writer starts from the committed checkpoint, and uploads what is newer under its own tag."""
        from dlrecipes.records.store.commit import Commit

        commit = Commit(self.store(), self.key(POINTER), self.writer)
        self.lease.guard()
        self.start = commit.start(f"{self.root}/{self.name}/{POINTER}")
        if not self.resuming:  # a new run where a pointer was left (a run that ended before its recipe went up):
            commit.pointer, self.start = None, (0, 0)  # its own lineage, committed over that one's (If-Match)
        self.commit = commit
        if self.store().conditional_writes:  # each shared record's ETag as the run opens: its writes are made on it
            for relative in FENCED_RECORDS:
                self.record_tags[relative] = self.store().read_tagged(self.key(relative))[1]

    def take_commit(self) -> None:
        """As training starts (the checkpoint it resumes from loaded): the pointer an earlier writer left is written
        again with this writer's ``writer`` line, on the ETag read as the run opened, so that from now on a frozen
        earlier writer's commit lands nowhere; :class:`~.lease.LeaseLost` when another writer committed since the run
        opened (this one stops before it trains). A server that does not answer: done by the first commit."""
        from dlrecipes.records.store.commit import CommitMoved

        pointer = self.commit.pointer if self.commit is not None else None
        if self.lease is None or pointer is None or pointer.writer == self.writer:
            return
        try:
            self.lease.guard()
            self.commit.write(pointer.taken_over(self.writer, self.start))
        except CommitMoved:
            self._moved()
        except Exception as exc:
            from dlrecipes.records.store.lease import LeaseLost

            if isinstance(exc, LeaseLost):
                raise
            self._failed(POINTER, exc)
            self.pending.remove(POINTER)

    def write_record(self, relative: str, data: bytes) -> None:
        """A shared record written by this writer, on the ETag it last wrote or read as the run opened (absent where
        it found none). Where the record changed since, the lease is confirmed first: a writer fenced by a later one
        that has written the record since gets :class:`~.lease.LeaseLost` and writes nothing; the writer that holds
        the lease writes it over (a retry of its own write that the server answered as changed, or a hand-made
        object). An S3 ETag is its content's digest: until the later writer changes a record, the earlier one's
        write on it is not refused by the server (only by its lease check)."""
        from dlrecipes.records.store.backend import Conflict

        key, tag = self.key(relative), self.record_tags.get(relative)
        if self.store().conditional_writes and tag is not None:
            try:
                self.record_tags[relative] = self.store().write(key, data, if_absent=tag == "", if_match=tag or None)
                return
            except Conflict:
                self.lease.confirm()  # LeaseLost where another writer holds the run now
        self.record_tags[relative] = self.store().write(key, data)  # the first write of a new run's, or as above

    def _moved(self) -> None:
        """Another writer moved the pointer: this one has lost the run (one line naming the holder)."""
        holder = self.lease._holder()
        self.lease.lost = {"committed": True} if not holder or holder.get("token") == self.lease.token else holder
        raise self.lease.lost_error() from None

    def _committed_already(self, relative: str) -> bool:
        """Whether ``relative`` is a periodic checkpoint no newer than the commit this writer started from: the
        bucket has it as an earlier writer's (not uploaded again under this writer's tag)."""
        if self.lease is None or self.start is None or not is_periodic(Path(relative)):
            return False
        pointer = self.commit.pointer if self.commit is not None else None
        if pointer is not None and periodic_progress(Path(relative)) <= self.start:
            stat = (self.local / relative).stat()
            self.sent[relative] = (stat.st_size, stat.st_mtime_ns)
            return True
        return False

    def _bytes(self, relative: str) -> bytes:
        """What the bucket gets of the small file ``relative``: a training's summary names its writer (a reader
        takes it only from the writer holding the commit)."""
        data = (self.local / relative).read_bytes()
        if relative in (SUMMARY_FILE, f"{CHECKPOINT_DIR}/{BEST_INFO}") and self.lease is not None:
            import json

            try:
                summary = json.loads(data)
            except ValueError:
                return data
            if isinstance(summary, dict):
                mine = {"writer": self.writer}
                if relative != SUMMARY_FILE:  # best.json names its writer's best checkpoint in the bucket
                    mine["file"] = Path(self.remote(f"{CHECKPOINT_DIR}/{BEST_CHECKPOINT}")).name
                data = (json.dumps({**summary, **mine}, indent=2) + "\n").encode()
        return data

    def _commit(self, checkpoint: str) -> bool:
        """The bucket's pointer moved to this writer's ``checkpoint`` by one conditional write (:mod:`~.commit`);
        :class:`~.lease.LeaseLost` when another writer committed since (this one writes nothing more); a server that
        does not answer leaves the pointer pending."""
        if self.lease is None:  # no writer (a sweep's own files never move a pointer)
            return self._upload(POINTER)
        from dlrecipes.records.store.commit import CommitMoved

        try:
            if self.commit is None:  # the start's take-over found no server: done now, before the first commit
                self.take_over()
            self.commit.write(self.commit.next(Path(self.remote(f"{CHECKPOINT_DIR}/{checkpoint}")).name, self.start))
        except CommitMoved:
            self._moved()
        except Exception as exc:
            self._failed(POINTER, exc)
            return False
        if POINTER in self.pending:
            self.pending.remove(POINTER)
        return True

    def _history_upto(self, batch: int) -> None:
        """history.csv in the bucket as far as the commit: its rows up to ``batch`` (the rows after it describe
        epochs no committed checkpoint holds yet); failures said as any upload's, and tried at the next commit."""
        import csv
        import io

        if self.lease is None:
            return
        try:
            with open(self.local / HISTORY_FILE, newline="") as f:
                rows = list(csv.reader(f))
        except OSError:
            return
        if not rows or "step" not in rows[0]:
            return
        step = rows[0].index("step")
        kept = [rows[0]] + [r for r in rows[1:] if len(r) > step and r[step].isdigit() and int(r[step]) <= batch]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(kept)
        try:
            self.lease.guard()
            self.write_record(HISTORY_FILE, out.getvalue().encode())
        except Exception as exc:
            from dlrecipes.records.store.lease import LeaseLost

            if isinstance(exc, LeaseLost):
                raise
            self._failed(HISTORY_FILE, exc)

    def _rotate(self, newest: str) -> None:
        """``checkpoint.keep`` in the bucket: the run's periodic checkpoints older than the newest ``keep`` (the
        pointer's among them) deleted, now that the pointer names a newer one; and every periodic checkpoint the
        run's lineage does not hold (a fenced writer's late uploads: :mod:`~.commit`), which no reader follows; and,
        once this writer's best.json is up, the other writers' best checkpoints."""
        from dlrecipes.records.store.commit import best_name, is_best

        if not self.store().deletes or self.abandoned:
            return
        try:
            names = [key.rsplit("/", 1)[-1] for key in self.store().keys(self.key(CHECKPOINT_DIR) + "/")]
            pointer = self.commit.pointer if self.commit is not None else None
            if pointer is not None:
                stray = [n for n in names if is_periodic(Path(n)) and not pointer.follows(n)]
                older = lineage_checkpoints(names, pointer, pointer.checkpoint)
            else:
                stray, older = [], lineage_checkpoints(names, _untagged_run(newest))
            if f"{CHECKPOINT_DIR}/{BEST_INFO}" in self.sent and self.lease is not None:  # best.json names ours now
                stray += [n for n in names if is_best(n) and n != best_name(self.writer)]
            for name in stray + (older[max(self.keep, 1) - 1 :] if self.keep >= 0 else []):
                if self.lease is not None:
                    self.lease.guard()
                self.store().delete(self.key(f"{CHECKPOINT_DIR}/{name}"), "checkpoint.keep")
        except Exception as exc:  # tried again at the next checkpoint; nothing the pointer names is touched
            from dlrecipes.records.store.lease import LeaseLost

            if isinstance(exc, LeaseLost):
                raise
            print(
                f"warning: deleting old checkpoints from {self.root}/{self.name} failed ({type(exc).__name__}); "
                "they are deleted at the next checkpoint",
                file=sys.stderr,
            )


FENCED_RECORDS = (SUMMARY_FILE, HISTORY_FILE, f"{CHECKPOINT_DIR}/{BEST_INFO}")  # shared keys, written on ETags


def _untagged_run(newest: str):
    """The lineage of a run whose pointer this process has not read (no commit taken over): its untagged names, up to
    ``newest``."""
    from dlrecipes.records.store.commit import Pointer

    return Pointer(newest)
