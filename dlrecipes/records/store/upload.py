"""Uploads that never stall training: a run's mirror to its bucket pushed by one background thread.

Each checkpoint (and the run's end) asks for a push (:meth:`BackgroundPush.request`) and training goes on at
once; the thread uploads what changed, in the order :meth:`RemoteRun.push` keeps (checkpoints first, oldest
first, the pointer moved only after its checkpoint's upload is confirmed). Requests made while a push runs are
served by one more pass, so at most one upload runs at a time (bounded: the network, not the host, is the
limit) and none is lost. The run's end waits for every push requested (:meth:`BackgroundPush.close`), so what
is not in the bucket then is what failed, and is named as before.

The thread keeps training's priority: a lower one (``nice`` +10, tried) made steps slower, not faster, since a
descheduled upload thread can hold the interpreter's lock that the training thread waits for (see BENCHMARKS.md).
A checkpoint goes up from a process of its own instead (:mod:`dlrecipes.records.store.upload_process`); the thread
waits for its answer, holding no lock training needs.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional


class BackgroundPush:
    """``remote.push()`` in one background thread (see the module docstring)."""

    def __init__(self, remote: Any):
        self.remote = remote
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._asked = self._served = 0
        self._closing = False
        self._thread: Optional[threading.Thread] = None

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
        while True:
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                asked = self._asked
            try:
                self.remote.push()
            except Exception as exc:  # a push's own failures are warned about and kept pending; this is the rest
                print(f"warning: uploading to {self.remote.root}/{self.remote.name} failed ({type(exc).__name__}: "
                      f"{str(exc)[:160]}); it is tried again at the next checkpoint and at the end", file=sys.stderr)
            with self._lock:
                self._served = asked
                if self._served >= self._asked:
                    self._idle.set()
                    if self._closing:
                        return

    def wait(self) -> None:
        """Until every push requested so far is done."""
        self._idle.wait()

    def close(self) -> None:
        """A last push, waited for; the thread ends."""
        with self._lock:
            self._closing = True
        self.request()
        self.wait()
        if self._thread is not None:
            self._thread.join(timeout=60)
