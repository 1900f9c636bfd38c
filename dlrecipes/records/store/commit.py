"""A bucket run's commit: the pointer ``checkpoints/latest.txt``, the one object whose write moves a run forward.

Each writer (a training holding the run's lease) uploads its periodic checkpoints to keys of its own, carrying its
writer tag (``ep2-ba6-rank0.w3f9a0c12.pt``: ``w`` and the first 8 hex digits of its lease's token), each written
once (``If-None-Match: *`` where the server takes it). No writer ever writes another's keys, so a fenced writer's
late upload (a frozen process that wakes, a multipart upload completed after its lease was taken) lands on a key of
its own that no commit names.

The pointer's text, three lines::

    ep2-ba6-rank0.w3f9a0c12.pt       the committed checkpoint, a key of checkpoints/
    writer w5b7e1d20                 the writer holding the commit
    lineage -@0-0 w3f9a0c12@0-0 w5b7e1d20@2-6

``lineage`` names, oldest first, each writer the run has had and the progress (epochs-batches) it started from: a
writer's checkpoint belongs to the run when its progress lies between its writer's start and the next writer's
(``-``: the untagged names of runs written before writer tags). A reader falling back from a damaged checkpoint
takes only those (:meth:`Pointer.follows`), never a fenced writer's late object.

The pointer is written only with ``If-Match`` on the ETag its writer last read or wrote (:class:`Commit`). A writer
that takes a run over reads the pointer as it opens the run and, as its training starts (the checkpoint it resumes
from loaded), writes it again with its own ``writer`` line on that ETag: from then on a frozen earlier writer's
commit finds the ETag changed and lands nowhere (and one that landed in between stops the new writer before it
trains). Where the server has no conditional writes, the pointer is read back before and after the write (the
window left is measured in docs/object-storage.md).
A pointer of one line (written by older versions) is still read: it names a checkpoint, no writer, and every
untagged name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlrecipes.errors import shown
from dlrecipes.records.layout import BEST_CHECKPOINT, periodic_progress

if TYPE_CHECKING:
    from dlrecipes.records.store.backend import Backend

POINTER_LIMIT = 4096  # bytes: three lines, the lineage of up to LINEAGE_MOST writers
LINEAGE_MOST = 64  # writers the pointer remembers (older ones' checkpoints are not fallen back to)
LEGACY = "-"  # the writer of untagged names
_TAG = r"w[0-9a-f]{8}"
_NAME = re.compile(rf"ep[0-9]+-ba[0-9]+-rank0(?:\.({_TAG}))?\.pt")
_ENTRY = re.compile(rf"({_TAG}|-)@([0-9]+)-([0-9]+)")

Progress = tuple[int, int]


def writer_tag(token: str) -> str:
    """A lease token's writer tag: ``w`` and its first 8 hex digits."""
    return "w" + token[:8]


def tagged(name: str, writer: str) -> str:
    """``ep2-ba6-rank0.pt`` as ``writer`` names it in the bucket (no ``writer``: as it is)."""
    return f"{name[: -len('.pt')]}.{writer}.pt" if writer and writer != LEGACY else name


def untagged(name: str) -> str:
    """A bucket's checkpoint name as the run's folder names it (``ep2-ba6-rank0.pt``)."""
    match = _NAME.fullmatch(name)
    return name.replace(f".{match.group(1)}", "") if match and match.group(1) else name


_BEST = re.compile(rf"{re.escape(Path(BEST_CHECKPOINT).stem)}\.({_TAG})\.pt")


def best_name(writer: str) -> str:
    """The bucket's name of ``writer``'s best checkpoint (each writer's its own: a fenced writer's late one replaces
    no other's)."""
    return f"{Path(BEST_CHECKPOINT).stem}.{writer}.pt" if writer else BEST_CHECKPOINT


def is_best(name: str) -> bool:
    """Whether ``name`` is a best checkpoint's name in the bucket (a writer's, or the untagged ``best.pt``)."""
    return name == BEST_CHECKPOINT or _BEST.fullmatch(name) is not None


def writer_of(name: str) -> str | None:
    """The writer tag a periodic checkpoint's name carries (``-``: none), None for any other name."""
    match = _NAME.fullmatch(name)
    return None if match is None else (match.group(1) or LEGACY)


@dataclass(frozen=True)
class Pointer:
    """A pointer's contents (see the module docstring)."""

    checkpoint: str
    writer: str = LEGACY
    lineage: tuple[tuple[str, Progress], ...] = field(default=((LEGACY, (0, 0)),))

    def text(self) -> str:
        entries = " ".join(f"{w}@{p[0]}-{p[1]}" for w, p in self.lineage[-LINEAGE_MOST:])
        return f"{self.checkpoint}\nwriter {self.writer}\nlineage {entries}\n"

    def follows(self, name: str) -> bool:
        """Whether the periodic checkpoint ``name`` (a key of checkpoints/) belongs to the run this pointer commits:
        its writer is in the lineage and its progress lies between that writer's start and the next writer's."""
        writer = writer_of(name)
        return writer is not None and self.holds(writer, periodic_progress(Path(name)))

    def holds(self, writer: str, progress: Progress) -> bool:
        """Whether ``writer``'s file of ``progress`` (its best checkpoint, a periodic one) belongs to the run: the
        writer is in the lineage and the progress lies between its start and the next writer's."""
        for i, (who, start) in enumerate(self.lineage):
            end = self.lineage[i + 1][1] if i + 1 < len(self.lineage) else None
            if who == writer and start <= progress and (end is None or progress <= end):
                return True
        return False

    def taken_over(self, writer: str, start: Progress) -> Pointer:
        """The same commit held by ``writer``, which starts from ``start``."""
        return Pointer(self.checkpoint, writer, (*self.lineage, (writer, start))[-LINEAGE_MOST:])

    def moved(self, checkpoint: str) -> Pointer:
        return Pointer(checkpoint, self.writer, self.lineage)


def parse_pointer(raw: bytes, address: str, key: str) -> Pointer:
    """A pointer's bytes checked as data (``address``: its bucket address; ``key``: the option or argument that
    asked): :class:`~.safe_keys.UnsafeKey` in one line unless it names a plain periodic checkpoint name of this run
    (no ``/``, no ``..``, no control characters) with well-formed writer and lineage lines."""
    from dlrecipes.records.store.safe_keys import UnsafeKey

    text = raw[: POINTER_LIMIT + 1].decode("utf-8", "replace")
    lines = text.strip().split("\n")
    name = lines[0].strip()
    problem = None
    if len(raw) > POINTER_LIMIT:
        problem = f"is over {POINTER_LIMIT} bytes, more than a pointer holds"
    elif not _NAME.fullmatch(name):
        problem = f"names {shown(name)}, which is not a checkpoint file name of this run (ep<E>-ba<B>-rank0.pt)"
    elif len(lines) == 1:
        return Pointer(name)
    elif len(lines) != 3 or not lines[1].startswith("writer ") or not lines[2].startswith("lineage "):
        problem = "is not a pointer dlrecipes wrote (a checkpoint name, then its writer and lineage lines)"
    else:
        writer = lines[1][len("writer ") :].strip()
        entries = lines[2][len("lineage ") :].split()
        matches = [_ENTRY.fullmatch(entry) for entry in entries]
        if not re.fullmatch(_TAG, writer) or not entries or not all(matches):
            problem = f"has a writer or lineage line that is no writer tag ({shown(lines[1][:60])})"
        else:
            lineage = tuple((m.group(1), (int(m.group(2)), int(m.group(3)))) for m in matches if m)
            return Pointer(name, writer, lineage)
    raise UnsafeKey(f"{key}: {address} {problem}; nothing was downloaded for it")


def read_pointer(path: Path, address: str, key: str) -> Pointer:
    """The pointer downloaded to ``path`` (see :func:`parse_pointer`)."""
    with open(path, "rb") as f:
        return parse_pointer(f.read(POINTER_LIMIT + 1), address, key)


def lineage_checkpoints(names: list[str], pointer: Pointer, newest: str | None = None) -> list[str]:
    """The periodic checkpoints among ``names`` that ``pointer``'s run holds (older than ``newest`` where given),
    newest first."""
    limit = periodic_progress(Path(newest)) if newest is not None else None
    found = [n for n in set(names) if pointer.follows(n) and (limit is None or periodic_progress(Path(n)) < limit)]
    order = {writer: i for i, (writer, _) in enumerate(pointer.lineage)}  # of one progress: the later writer's first
    return sorted(found, key=lambda n: (periodic_progress(Path(n)), order.get(writer_of(n) or "", -1)), reverse=True)


class CommitMoved(Exception):
    """The pointer is not as this writer last left it: another writer committed since."""


class Commit:
    """The pointer of one writer's run (``key``): the last one it read or wrote and that object's ETag; each write
    conditional on it (see the module docstring)."""

    def __init__(self, store: Backend, key: str, writer: str):
        self.store, self.key, self.writer = store, key, writer
        self.pointer: Pointer | None = None
        self.etag = ""
        self.raw: bytes | None = None  # the pointer's bytes as this writer last saw them

    def read(self, address: str) -> Pointer | None:
        """The pointer as the bucket has it now (None: none yet), its ETag kept."""
        raw, tag, _ = self.store.read_tagged(self.key)
        self.etag, self.raw = (tag if raw is not None else ""), raw
        self.pointer = None if raw is None else parse_pointer(raw, address, "--resume")
        return self.pointer

    def start(self, address: str) -> Progress:
        """As a writer opens the run: the pointer read (its ETag kept: this writer's first commit, which takes the run
        over with its ``writer`` line, holds only if no other writer committed since) and the progress this writer
        starts from, the commit's (nothing committed: the beginning). Nothing is written."""
        pointer = self.read(address)
        return periodic_progress(Path(pointer.checkpoint)) if pointer is not None else (0, 0)

    def next(self, checkpoint: str, start: Progress) -> Pointer:
        """The pointer that commits this writer's ``checkpoint`` (a key of checkpoints/)."""
        if self.pointer is None:
            return Pointer(checkpoint, self.writer, ((self.writer, start),))
        if self.pointer.writer != self.writer:
            return self.pointer.taken_over(self.writer, start).moved(checkpoint)
        return self.pointer.moved(checkpoint)

    def write(self, pointer: Pointer) -> None:
        """``pointer`` written where the bucket's pointer is still the one this writer last saw; :class:`CommitMoved`
        when it is not (nothing written)."""
        from dlrecipes.records.store.backend import Conflict

        data = pointer.text().encode()
        if self.store.conditional_writes:
            try:
                self.etag = self.store.write(self.key, data, if_absent=not self.etag, if_match=self.etag or None)
            except Conflict:
                raise CommitMoved(self.key) from None
            if self.store.conditional_writes:  # (a server found to ignore conditions reads back, below)
                self.pointer, self.raw = pointer, data
                return
        raw, tag, _ = self.store.read_tagged(self.key)  # no conditional writes: read back before and after
        if raw != self.raw and raw != data:
            raise CommitMoved(self.key)
        self.store.write(self.key, data)
        raw, tag, _ = self.store.read_tagged(self.key)
        if raw != data:
            raise CommitMoved(self.key)
        self.etag, self.pointer, self.raw = tag, pointer, data


__all__ = [
    "Commit",
    "CommitMoved",
    "POINTER_LIMIT",
    "Pointer",
    "best_name",
    "is_best",
    "lineage_checkpoints",
    "parse_pointer",
    "read_pointer",
    "tagged",
    "untagged",
    "writer_of",
    "writer_tag",
]
