"""One writer per run in a bucket: a lease, as the run directory's ``run.lock`` is on one disk.

Machines without a shared disk each have their own lock file, so the bucket holds the lease: ``<run>/run.lease``,
``{"token", "host", "pid", "expires"}``. Taking it writes this process's token with a conditional write where the
server supports one (``If-None-Match: *``), reads it back, and refuses while another live writer's lease has not
expired (naming its host and pid); an expired lease is taken over with a warning. A thread renews it every
:data:`RENEW_EVERY` seconds to :data:`TERM` ahead, so a writer that dies stops renewing and its lease runs out;
it is deleted on every exit path (``release``). Between two machines that write at the same instant on a server
without conditional writes, the read-back decides: the later token stands, and the earlier writer is refused.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Optional

from dlrecipes.errors import UserError
from dlrecipes.records.layout import LEASE_FILE
TERM = 300.0  # seconds a lease holds without renewal
RENEW_EVERY = 60.0


class BucketLease:
    """This process's lease on ``root/name`` (see the module docstring)."""

    def __init__(self, store: Any, root: Any, name: str):
        self.store, self.root, self.name = store, root, name
        self.key = root.key(name, LEASE_FILE)
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _read(self) -> Optional[dict]:
        try:
            lease = json.loads(self.store.read(self.key) or b"null")
        except Exception:  # unreadable: no live writer says so
            return None
        return lease if isinstance(lease, dict) and not lease.get("released") else None

    def _write(self, conditional: bool) -> bool:
        """Write this lease; ``conditional``: only where there is none (False when the server says one appeared;
        a backend without conditional writes writes it, and the read-back decides)."""
        body = json.dumps({"token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                           "expires": time.time() + TERM}).encode()
        return self.store.write(self.key, body, if_absent=conditional)

    def take(self) -> "BucketLease":
        held = self._read()
        if held is not None and held.get("expires", 0) > time.time() and not _dead_here(held):
            self._refuse(held)
        if held is not None:
            print(f"warning: the lease of {self.root}/{self.name} held by {held.get('host')} (pid {held.get('pid')}) "
                  "expired without being released; this process takes the run over", file=sys.stderr)
            self._write(False)
        elif not self._write(True):
            self._refuse(self._read() or {})
        mine = self._read()
        if not mine or mine.get("token") != self.token:  # another machine wrote after this one
            self._refuse(mine or {})
        self._thread = threading.Thread(target=self._renew, name="dlrecipes-lease", daemon=True)
        self._thread.start()
        return self

    def _refuse(self, held: dict) -> None:
        left = max(0, int(held.get("expires", time.time()) - time.time()))
        raise UserError(f"run_name: {self.root}/{self.name} is being trained by {held.get('host', 'another machine')} "
                        f"(pid {held.get('pid', '?')}; its lease runs {left} s more unless renewed); wait for it to "
                        "end, or choose another run_name")

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY):
            try:
                self._write(False)
            except Exception as exc:  # the server went away: the upload's own warning says so; try again later
                print(f"warning: renewing the lease of {self.root}/{self.name} failed ({type(exc).__name__})",
                      file=sys.stderr)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        held = self._read()
        if held is not None and held.get("token") == self.token:
            try:  # deleted; where the backend deletes nothing, written released
                if self.store.deletes:
                    self.store.delete(self.key, "releasing the lease")
                else:
                    self.store.write(self.key, json.dumps({"released": True}).encode())
            except Exception:  # it expires on its own
                pass


def _dead_here(held: dict) -> bool:
    """A lease written on this machine by a process that is gone (killed before it could release it), or by this
    process in an earlier call that could not release it (a notebook's kernel, the server gone meanwhile)."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    if held["pid"] == os.getpid():
        return True
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeasedLock:
    """The run directory's local lock and the bucket's lease, released together."""

    def __init__(self, lock: Any, lease: BucketLease):
        self.lock, self.lease = lock, lease

    @property
    def path(self):
        return self.lock.path

    @path.setter
    def path(self, value) -> None:
        self.lock.path = value

    def release(self) -> None:
        try:
            self.lease.release()
        finally:
            self.lock.release()


def leased(lock: Any, root: Any, name: str) -> Any:
    """``lock`` with the bucket's lease on ``root/name`` taken too (refused while another machine writes the run)."""
    from dlrecipes.records.store.bucket import object_store

    try:
        lease = BucketLease(object_store(root), root, name).take()
    except BaseException:
        lock.release()
        raise
    return LeasedLock(lock, lease)
