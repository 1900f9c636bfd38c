"""Uploads that never stall training: a run's mirror to its bucket pushed by one background thread.

Each checkpoint (and the run's end) asks for a push (:meth:`BackgroundPush.request`) and training goes on at
once; the thread uploads what changed, in the order :meth:`RemoteRun.push` keeps (checkpoints first, oldest
first, the pointer moved only after its checkpoint's upload is confirmed). Requests made while a push runs are
served by one more pass, so at most one upload runs at a time (bounded: the network, not the host, is the
limit) and none is lost. The run's end waits for every push requested (:meth:`BackgroundPush.close`), at most
``checkpoint.upload_wait`` seconds and until the first Ctrl-C, so what is not in the bucket then is what failed or
was not waited for, and is named.

The thread keeps training's priority: a lower one (``nice`` +10, tried) made steps slower, not faster, since a
descheduled upload thread can hold the interpreter's lock that the training thread waits for (see BENCHMARKS.md).
A checkpoint goes up from a process of its own instead (:mod:`dlrecipes.records.store.upload_process`); the thread
waits for its answer, holding no lock training needs.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlrecipes.records.store.bucket import RemoteRun

SAID_AFTER = 2.0  # seconds the end waits for its uploads before it says what it waits for


class BackgroundPush:
    """``remote.push()`` in one background thread (see the module docstring)."""

    def __init__(self, remote: RemoteRun):
        self.remote = remote
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._asked = self._served = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        """Ask for a push of what changed; returns at once."""
        with self._lock:
            self._asked += 1
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="dlrecipes-upload", daemon=True)
                self._thread.start()
        self._wanted.set()

    def _serve(self) -> None:
        from dlrecipes.records.store.lease import LeaseLost

        while True:
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                asked = self._asked
            try:
                self.remote.push()
            except LeaseLost:  # the lease says so: the training stops at its next batch, the end names the holder
                pass
            except Exception as exc:  # a push's own failures are warned about and kept pending; this is the rest
                print(
                    f"warning: uploading to {self.remote.root}/{self.remote.name} failed ({type(exc).__name__}: "
                    f"{str(exc)[:160]}); it is tried again at the next checkpoint and at the end",
                    file=sys.stderr,
                )
            with self._lock:
                self._served = asked
                if self._served >= self._asked:
                    self._idle.set()
                    if self._closing:
                        return

    def wait(self) -> None:
        """Until every push requested so far is done."""
        self._idle.wait()

    def close(self, wait: float = 120.0) -> bool:
        """A last push, waited for at most ``wait`` seconds (one line says what is waited for, once the wait is
        longer than a moment); the first Ctrl-C stops the wait. Returns whether every push was done (then the
        thread has ended); False: the caller names what is not uploaded, and no further file is started."""
        import time

        with self._lock:
            self._closing = True
        self.request()
        try:
            if not self._idle.wait(min(SAID_AFTER, wait)):
                self._say_waiting(wait)
                deadline = time.monotonic() + max(0.0, wait - SAID_AFTER)
                while not self._idle.wait(0.2) and time.monotonic() < deadline:
                    pass
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C (Composer's handler exits): the wait stops, what is
            print("", file=sys.stderr)  # missing is named, and --resume uploads it
        if not self._idle.is_set():
            self.remote.abandoned = True
            return False
        if self._thread is not None:
            self._thread.join(timeout=5)
        return True

    def _say_waiting(self, wait: float) -> None:
        remote = self.remote
        what = sorted(set(remote.pending) | set(remote._changed()))
        shown = ", ".join(what[:4]) + (f" and {len(what) - 4} more" if len(what) > 4 else "") or "the last files"
        print(
            f"waiting up to {wait:.0f} s (checkpoint.upload_wait) for the uploads to {remote.root}/{remote.name}: "
            f"{shown}; Ctrl-C stops waiting (--resume uploads the rest later)",
            file=sys.stderr,
        )
