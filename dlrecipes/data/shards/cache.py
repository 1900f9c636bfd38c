"""A shards dataset's samples read from its shard files, and a node's cache of a bucket's shards kept within its
limit: dlrecipes's own, not litdata's reader.

Reading (:func:`shard_table`, :func:`read_from`): a shard is litdata's chunk file, in either of the layouts
litdata 0.2.76 writes for samples of an image's bytes and an int label: the sample table (``uint32`` count,
``count + 1`` offsets, then each sample as one ``uint32`` size per field and the fields' bytes) or, where pyarrow
was installed when it was written, the same table left empty and an Arrow IPC file of the rows at the end (its
length and litdata's magic last). Both are read as data: sizes and offsets are checked against the file, the Arrow
rows against the two columns dlrecipes writes; nothing is unpickled.

The cache (:class:`ShardCache`, one folder per split and node, shared by every process and DataLoader worker there):

- A sample is read from a shard held open under a shared ``flock`` for that one read; the shard's time of last use
  (its mtime) is set as it is read.
- A shard not in the cache is downloaded by one process at a time (an exclusive ``flock`` on the folder's lock
  file), to a partial file renamed into place once its size is right. Before it starts, shards are evicted least
  recently used first until the new one fits the limit; a shard being read (its shared lock held) is never evicted.
  If every other shard is being read at that moment, the download waits for one to be released when the cache is
  already at its limit, so the cache holds at most ``limit`` plus one shard.
- A limit that cannot hold the shards the training order reads at once (:func:`shards_read_at_once`) is refused
  before training (:meth:`dlrecipes.data.shards.dataset.ShardsDataset.check_cache`), so that no shard is
  downloaded twice in an epoch.
- Waits are bounded: a download by the bucket's stall bound (``DLRECIPES_BUCKET_STALL``, a minute), a wait for
  another process's download by the same bound without progress in its partial file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from math import ceil
from pathlib import Path

from dlrecipes.errors import DataError

LOCK = ".dlrecipes-cache.lock"
IDENTITY = ".dlrecipes-cache-of"  # the dataset and split whose shards the folder holds
PARTIAL = ".partial"  # a download in progress (or left by a process killed during one): not yet a shard
ARROW_MAGIC = b"LDARW01\0"  # litdata's Arrow rows at a chunk's end: [IPC file][uint32 its length][magic]
ARROW_FIELDS = (("image", "binary"), ("label", "int64"))
SHARD_NAME = re.compile(r"chunk-[0-9]+-[0-9]+\.bin")  # litdata's names for the shards data convert writes
POLL = 0.02  # seconds between looks at a lock or a download held by another process


class Damaged(Exception):
    """A shard's bytes are not what its index says (the caller names the shard and sample)."""


Table = list  # a shard's samples where they lie: (offset, bytes, label) each, in order


def shard_table(fd: int, size: int, count: int) -> Table:
    """Where each of the ``count`` samples of the shard open as ``fd`` (``size`` bytes) lies in it, and its label
    (:class:`Damaged` when the shard's bytes do not agree with its index)."""
    if size < 12:
        raise Damaged(f"{size} bytes is no shard")
    tail = os.pread(fd, 12, size - 12)
    if tail[4:] == ARROW_MAGIC:
        return _arrow_table(fd, size, struct.unpack("<I", tail[:4])[0], count)
    held = struct.unpack("<I", os.pread(fd, 4, 0))[0]
    if held != count:
        raise Damaged(f"it holds {held} samples where its index says {count}")
    offsets = struct.unpack(f"<{count + 1}I", os.pread(fd, 4 * (count + 1), 4))
    table = []
    for begin, end in zip(offsets, offsets[1:]):
        if not 4 + 4 * (count + 1) <= begin <= end <= size or end - begin < 16:
            raise Damaged(f"sample offsets {begin}-{end} lie outside its {size} bytes")
        image_size, label_size = struct.unpack("<II", os.pread(fd, 8, begin))
        if label_size != 8 or 8 + image_size + label_size != end - begin:
            raise Damaged(f"a sample's fields ({image_size} and {label_size} bytes) do not fill its {end - begin}")
        table.append((begin + 8, image_size, struct.unpack("<q", os.pread(fd, 8, end - 8))[0]))
    return table


def _arrow_table(fd: int, size: int, length: int, count: int) -> Table:
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise DataError(
            f"shards written with Arrow rows need pyarrow: pip install 'dlrecipes[shards]' ({exc})"
        ) from None
    if not 0 < length <= size - 12:
        raise Damaged(f"its Arrow rows' length {length} does not fit its {size} bytes")
    try:
        with pa.memory_map(f"/proc/self/fd/{fd}") as mapped:  # mapped, not read: the rows' buffers point into it
            whole = mapped.read_buffer()
            rows = pa.ipc.open_file(pa.BufferReader(whole.slice(size - 12 - length, length)))
            return _arrow_rows(rows, count, whole.address, size)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise Damaged(f"its Arrow rows cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None


def _arrow_rows(rows, count: int, base: int, size: int) -> Table:
    """The table of litdata's Arrow rows (an open IPC file over the shard mapped at ``base``): its two columns
    checked, each image's bytes found where they lie in the file (uncompressed rows only)."""
    import numpy as np

    fields = tuple((field.name, str(field.type)) for field in rows.schema)
    if fields != ARROW_FIELDS:
        raise Damaged(f"its Arrow rows are {fields}, not an image's bytes and its label")
    table: Table = []
    for k in range(rows.num_record_batches):
        batch = rows.get_record_batch(k)
        images, labels = batch.column(0), batch.column(1)
        _, ends, data = images.buffers()
        if (
            images.null_count
            or labels.null_count
            or not base <= data.address <= data.address + data.size <= base + size
        ):
            raise Damaged("its Arrow rows are compressed or incomplete, which dlrecipes never writes")
        ends = np.frombuffer(ends, dtype=np.int32)[images.offset : images.offset + len(images) + 1]
        start = data.address - base
        table += [(start + int(a), int(b - a), int(v)) for a, b, v in zip(ends, ends[1:], labels.to_pylist())]
    if len(table) != count:
        raise Damaged(f"it holds {len(table)} samples where its index says {count}")
    return table


def read_from(tables: dict, fd: int, name: str, size: int, count: int, index: int) -> tuple[bytes, int]:
    """Sample ``index`` (image bytes, label) of shard ``name`` open as ``fd``, its table kept in ``tables``
    (a process's, at most :data:`TABLES` shards)."""
    table = tables.get(name)
    if table is None:
        if len(tables) >= TABLES:
            tables.clear()
        table = tables[name] = shard_table(fd, size, count)
    offset, length, label = table[index]
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise Damaged(f"it ends before sample {index}'s {length} bytes at {offset}")
    return data, label


TABLES = 256  # shards whose tables a process keeps (a 2,000-sample shard's is about 200 KB)


def shards_read_at_once(sizes: Sequence[tuple[int, int]], span: int, window: int | None) -> tuple[int, int]:
    """The most shards (and their bytes) that ``span`` consecutive samples of an epoch's order can fall in, for
    shards of ``sizes`` ((samples, bytes) each): in index order (``window`` None, evaluation's), or in
    :func:`dlrecipes.data.order.epoch_order`'s (shards shuffled, samples shuffled within runs of ``window``
    shards): a bound over every epoch's order, from the smallest shards' samples and the largest shards' bytes."""
    samples = sorted(count for count, _ in sizes)
    largest = sorted((size for _, size in sizes), reverse=True)
    group = window or 1  # shards read together: a window's, or one in index order
    least = sum(samples[:group])  # the fewest samples a group can have (a last, shorter window aside)
    groups = 1 + ceil(max(span - 1, 0) / least) + (1 if window and len(sizes) % window else 0)
    shards = min(len(sizes), groups * group)
    return shards, sum(largest[:shards])


def samples_in_flight(batch_size: int, eval_batch_size: int, workers: int) -> dict[str, tuple[int, bool]]:
    """Each split's samples the loaders hold at once (global batches: each worker's two prefetched, the one
    training and the next), and whether the split is read in training's shuffled order."""
    batches = 2 * workers + 2
    return {"train": (batches * batch_size, True), "val": (batches * eval_batch_size, False)}


def check_room(shards: Sequence[dict], limit: int, span: int, shuffled: bool, split: str) -> None:
    """One line when ``limit`` cannot hold the shards (``dlrecipes-shards.json``'s entries) that ``span``
    consecutive samples of the split's order fall in (``shuffled``: training's order, in windows of shards; else
    index order), with the least that can."""
    from dlrecipes.data.order import SHARD_WINDOW

    sizes = [(shard["samples"], shard["bytes"]) for shard in shards]
    count, needed = shards_read_at_once(sizes, span, SHARD_WINDOW if shuffled else None)
    if limit < needed:
        raise DataError(
            f"dataset.cache_limit: {limit:,} bytes cannot hold the shards the {split} split reads at once ({span:,} "
            f"samples in flight fall in up to {count} shards, {needed:,} bytes); give at least {needed:,}, or fewer "
            "trainer.num_workers or a smaller batch"
        )


class ShardCache:
    """A node's cache of one split's shards in ``folder``, within ``limit`` bytes plus at most one shard;
    ``fetch(name, path)`` downloads shard ``name`` to ``path`` (bounded; its errors are the caller's)."""

    def __init__(
        self,
        folder: str,
        limit: int,
        fetch: Callable[[str, str], None],
        stall: Callable[[], float],
        identity: str = "",
    ):
        self.folder, self.limit, self.fetch, self.stall = Path(folder), int(limit), fetch, stall
        self.identity = identity  # which dataset's split the folder holds (its address and shards), in IDENTITY
        self.downloads = 0  # by this process
        self.tables: dict = {}  # each shard's table, read once per process
        self.claimed_by: int | None = None  # the process that checked the folder's identity

    def __getstate__(self) -> dict:
        return {**self.__dict__, "downloads": 0, "tables": {}}

    def sample(self, name: str, size: int, count: int, index: int) -> tuple[bytes, int]:
        """Sample ``index`` of shard ``name`` (``size`` bytes, ``count`` samples), downloaded first if it is not
        here."""
        if self.claimed_by != os.getpid():
            self._claim()
        while True:
            fd = self._pinned(name, size)
            if fd is None:
                self._download(name, size)
                continue
            try:
                os.utime(fd)  # its last use, for eviction
                return read_from(self.tables, fd, name, size, count, index)
            finally:
                os.close(fd)  # its shared lock goes with it

    def _claim(self) -> None:
        """The folder made this dataset's, once per process: shards another dataset (or an earlier conversion at
        the same address) left there are removed, since their names may be this one's; one line when that other
        dataset is being read from it now."""
        with self._locked("the cache's identity"):
            marker = self.folder / IDENTITY
            held = marker.read_text() if marker.is_file() else None
            if held != self.identity:
                for _, _, path in self.held():
                    if not _evicted(path):
                        raise DataError(
                            f"dataset.cache_dir: {self.folder} holds another dataset's shards, being read now; give "
                            "each dataset a cache_dir of its own"
                        )
                partial = marker.with_name(f"{IDENTITY}{PARTIAL}")
                partial.write_text(self.identity)
                os.replace(partial, marker)
        self.claimed_by = os.getpid()

    def _pinned(self, name: str, size: int) -> int | None:
        """Shard ``name`` open under a shared lock, or None when it is not (or no longer) here whole."""
        try:
            fd = os.open(self.folder / name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        held = os.fstat(fd)
        if held.st_nlink == 0 or held.st_size != size:  # evicted between open and lock, or not what it should be
            os.close(fd)
            return None
        return fd

    def _download(self, name: str, size: int) -> None:
        with self._locked(name):
            path = self.folder / name
            if path.is_file() and path.stat().st_size == size:
                return  # another process brought it while this one waited
            for left in self.folder.glob(f"*{PARTIAL}"):  # a killed download's; none is running: the lock is ours
                left.unlink(missing_ok=True)
            path.unlink(missing_ok=True)  # not whole (a shard replaced by hand): fetched again
            self._make_room(size)
            partial = self.folder / f"{name}{PARTIAL}"
            try:
                self.fetch(name, str(partial))
                got = partial.stat().st_size
                if got != size:
                    raise Damaged(f"it arrived as {got:,} bytes where its index says {size:,}")
                os.replace(partial, path)
            except OSError as exc:
                raise self.unwritable(exc, size) from None
            finally:
                partial.unlink(missing_ok=True)
            self.downloads += 1

    def held(self) -> list[tuple[float, int, Path]]:
        """The shards here: (last use, bytes, path), least recently used first."""
        found = []
        for path in self.folder.iterdir():
            if SHARD_NAME.fullmatch(path.name):
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                found.append((stat.st_mtime, stat.st_size, path))
        return sorted(found)

    def _make_room(self, size: int) -> None:
        """Evict least recently used shards that are not being read until ``size`` more bytes fit the limit; where
        the others are being read, wait while the cache is over its limit (bounded: reads are short)."""
        deadline = time.monotonic() + self.stall()
        while True:
            shards = self.held()
            used = sum(held for _, held, _ in shards)
            for _, held, path in shards:
                if used + size <= self.limit:
                    break
                if _evicted(path):
                    used -= held
            if used + size <= self.limit or used <= self.limit:
                return  # within the limit, or at most one shard over it
            if time.monotonic() > deadline:
                raise DataError(
                    f"dataset.cache_limit: {self.limit:,} bytes cannot hold the shards being read at once in "
                    f"{self.folder} ({used:,} bytes in use); give a larger limit"
                )
            time.sleep(POLL)

    @contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """The folder's download lock, waited for while the download holding it makes progress (its partial file
        grows), for at most the stall bound without progress."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self.unwritable(exc, 0) from None
        try:
            seen, since = None, time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    mark = _partials(self.folder)
                    if mark != seen:
                        seen, since = mark, time.monotonic()
                    elif time.monotonic() - since > self.stall():
                        raise DataError(
                            f"dataset.cache_dir: {self.folder}: another process on this machine has been downloading "
                            f"a shard with no progress for {self.stall():.0f} s while this one waited for {name}; the "
                            "run's checkpoints are kept: --resume when the bucket answers again"
                        ) from None
                    time.sleep(POLL)
            yield
        finally:
            os.close(fd)

    def unwritable(self, exc: OSError, size: int) -> DataError:
        """The one line for a cache folder that cannot take a shard: full, read-only, not permitted."""
        reason = {
            errno.ENOSPC: "the disk is full",
            errno.EDQUOT: "the disk quota is used up",
            errno.EROFS: "it is on a read-only file system",
            errno.EACCES: "it cannot be written by this user",
            errno.EPERM: "it cannot be written by this user",
        }.get(exc.errno or 0, f"{type(exc).__name__}: {exc.strerror or exc}")
        need = f" (a shard of {size:,} bytes was being stored)" if size else ""
        return DataError(
            f"dataset.cache_dir: {self.folder}: {reason}{need}; give a cache_dir with room for cache_limit "
            f"({self.limit:,} bytes) and one shard, or free space there; the run's checkpoints are kept: --resume"
        )


def _partials(folder: Path) -> list[tuple[str, int]]:
    """The downloads in progress in ``folder``, with the bytes each has so far (one may end as it is looked at)."""
    found = []
    for path in folder.glob(f"*{PARTIAL}"):
        try:
            found.append((path.name, path.stat().st_size))
        except FileNotFoundError:
            continue
    return found


def _evicted(path: Path) -> bool:
    """Whether ``path`` was removed: only when no process is reading it (its exclusive lock taken at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)
    return True
