"""One training process group per run directory: a lock file that names its holder.

``runs/<run>/run.lock`` is created with ``O_CREAT | O_EXCL`` (atomic: of two runs started at
the same moment exactly one gets it) and holds the host, pid, the process's start time and
when training started.  A second run for the same directory is refused at once, naming the
holder.  A lock whose holder is gone (same host, no such process, or the pid now belongs to a
process that started later) was left by a killed run: it is taken over with a warning.  A
holder on another host cannot be checked from here; the message says which file to delete once
that run is known to be dead.  With several ranks, rank 0 holds the lock.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Protocol

from dlrecipes.errors import UserError
from dlrecipes.records.layout import RunDir


class RunLockedError(UserError):
    """Another training run holds this run directory."""


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name


def _alive(holder: dict) -> bool | None:
    """Whether the holder still runs: True/False on this host, None when it is on another one."""
    if holder.get("host") != socket.gethostname():
        return None
    pid = int(holder.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = holder.get("process_start")
    return started is None or _process_start(pid) in (None, started)


def _describe(holder: dict) -> str:
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


class HeldLock(Protocol):
    """What holds a run while it trains: its :class:`RunLock`, or in a bucket that lock and the run's lease together
    (:class:`dlrecipes.records.store.lease.LeasedLock`)."""

    path: Path

    def release(self) -> None: ...


class RunLock:
    """The lock on ``run_dir`` while a run trains there (:func:`acquire` makes one)."""

    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder

    def release(self) -> None:
        """Remove the lock if it is still ours (a takeover by another run leaves theirs alone)."""
        try:
            if json.loads(self.path.read_text()) == self.holder:
                self.path.unlink()
        except (OSError, ValueError):
            pass


def acquire(run_dir: Path) -> RunLock:
    """Take ``run_dir``'s lock, or raise :class:`RunLockedError` naming the holder."""
    path = RunDir(run_dir).lock
    me = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": _process_start(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    for _ in range(20):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder is None:  # released meanwhile, or being written by the run that just created it
                time.sleep(0.05)
                continue
            alive = _alive(holder)
            if alive is False:
                print(
                    f"warning: {run_dir} was locked by a run that no longer exists ({_describe(holder)}); "
                    "taking it over",
                    file=sys.stderr,
                )
                path.unlink(missing_ok=True)
                continue
            where = "" if alive else f" on another host; if that run is dead, delete {path}"
            raise RunLockedError(
                f"run_name: {run_dir} is in use by another training run ({_describe(holder)}){where}; "
                "wait for it to finish or choose another run_name"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
            f.flush()
            os.fsync(f.fileno())
        return RunLock(path, me)
    raise RunLockedError(f"run_name: could not take the lock {path} (it keeps changing); try again")


def _read(path: Path) -> dict | None:
    """The holder recorded in ``path``; None while it is missing or still being written."""
    try:
        holder = json.loads(path.read_text())
        return holder if isinstance(holder, dict) else _dead_writer()
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # empty or half-written: its writer is mid-write, or died there
        try:
            recent = time.time() - path.stat().st_mtime < 5
        except FileNotFoundError:
            return None
        return None if recent else _dead_writer()


def _dead_writer() -> dict:
    return {"host": socket.gethostname(), "pid": -1, "started": "unknown (unreadable lock file)"}


def read_holder(run_dir: Path) -> dict | None:
    """Who holds ``run_dir``'s lock (host, pid, start), or None when nobody does."""
    return _read(RunDir(run_dir).lock)


def holder_alive(holder: dict) -> bool | None:
    """Whether ``holder`` still runs: True or False on this host, None when it ran on another one."""
    return _alive(holder)
