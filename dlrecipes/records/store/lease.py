"""One writer per run in a bucket: a lease, as the run directory's ``run.lock`` is on one disk, that fences its writer.

Machines without a shared disk each have their own lock file, so the bucket holds the lease: ``<run>/run.lease``,
``{"token", "host", "pid", "expires"}``. Taking it writes this process's token with a conditional write where the
server supports one (``If-None-Match: *`` for a new lease, ``If-Match`` on the ETag of an expired one it takes
over), reads it back, and refuses while another live writer's lease has not expired (naming its host and pid). A
thread renews it every fifth of its term (:func:`term`, five minutes; ``DLRECIPES_LEASE_TERM`` shortens it, as the
tests do), so a writer that dies stops renewing and its lease runs out; it is deleted on every exit path
(``release``).

**The lease fences its writer.** Each renewal is a conditional write on the ETag this process last wrote
(``If-Match``; where the server has no conditional writes, the token is read back before and after the write), and
so is the check the run's mirror makes before the pointer or the summary moves (:meth:`BucketLease.confirm`); any
other file is written only while the last confirmation is younger than most of the term (:meth:`BucketLease.guard`,
on a clock that counts a frozen machine's time: a writer paused past its term confirms before it writes again).
A writer that finds its lease taken (a machine that took the run over while this one was paused) writes nothing
more: :class:`LeaseLost`, one line naming the holder, and the training stops with its local checkpoints kept.
S3 has no write conditional on another object, so between a confirmation and the write it guards there is a window
of one file; what a writer in that window can still write lands on keys of its own that no commit names
(:mod:`~.commit`): the lease decides who may write, the commit what a reader follows.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from dlrecipes.errors import UserError
from dlrecipes.records.layout import LEASE_FILE

if TYPE_CHECKING:
    from dlrecipes.records.run_lock import RunLock
    from dlrecipes.records.store.backend import Backend


TERM_ENV = "DLRECIPES_LEASE_TERM"
DEFAULT_TERM = 300.0  # seconds a lease holds without renewal
FRESH = 0.6  # a confirmation younger than this part of the term lets a file be written without another
MAX_TERM = 86400.0  # seconds: the longest term a lease may state (a day); longer is a damaged lease
CLOCK_SLACK = 300.0  # seconds two machines' clocks may differ by before a lease's expiry is judged out of range
FIELDS = {"token": str, "host": str, "pid": int, "expires": float}


def term() -> float:
    """Seconds a lease holds without renewal (``DLRECIPES_LEASE_TERM``, else five minutes)."""
    from dlrecipes.records.store.backend import seconds_setting

    return seconds_setting(TERM_ENV, DEFAULT_TERM)


def _clock() -> float:
    """Seconds on a clock that goes on while the machine is suspended (a frozen VM), unlike ``time.monotonic``."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


class LeaseLost(UserError):
    """Another process took the run over while this one trained it: this one stopped writing to the bucket."""

    exit_code = 1


class LeaseEnded(LeaseLost):
    """This process released the lease (its run ended): a push still under way (a notebook's, after the end gave up
    waiting) writes nothing more."""


class DamagedLease(UserError):
    """A lease that is not one dlrecipes writes: not a JSON object with its fields, or an expiry that is not finite
    or lies further ahead than its term allows."""


def lease_data(raw: bytes, address: str, age: float | None = None) -> dict | None:
    """A lease object's bytes checked as data (``address``: its key's address, ``age``: seconds since it was
    written on the server's clock, None where the server does not say): the lease, None when released, or
    :class:`DamagedLease` naming the key and how to clear it. Never a crash, never a lock that cannot end: an expiry
    must be finite and within its term (plus the clocks' slack) of now, and a lease the server says was written
    longer ago than its term is expired whatever its expiry says (the server's clock judges, not the writer's)."""
    import math

    try:
        held = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        held = None
    problem = None
    if not isinstance(held, dict):
        problem = "it is not a JSON object"
    elif held.get("released") is True:
        return None
    else:
        for field, kind in FIELDS.items():
            value = held.get(field)
            if not (isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)):
                problem = f"its {field!r} is {_brief(value)}, not {'a number' if kind is float else kind.__name__}"
                break
        else:
            stated = held.get("term", DEFAULT_TERM)
            if not (isinstance(stated, (int, float)) and not isinstance(stated, bool) and 0 < stated <= MAX_TERM):
                problem = f"its term is {_brief(stated)}, not a number of seconds up to {MAX_TERM:.0f}"
            elif not math.isfinite(held["expires"]):
                problem = f"its expiry is {held['expires']}"
            elif held["expires"] - time.time() > stated + CLOCK_SLACK:
                problem = (
                    f"its expiry lies {held['expires'] - time.time():.3g} s ahead, more than its term of "
                    f"{stated:.0f} s allows"
                )
            else:
                held = {**held, "term": float(stated)}
                if age is not None and age > stated:  # not renewed within its term, by the server's clock
                    held["expires"] = min(held["expires"], time.time() - 1)
                return held
    raise DamagedLease(
        f"run_name: {address} is damaged ({problem}): it is no lease dlrecipes wrote. If no process trains the run, "
        f"delete that object (for example `aws s3 rm {address}`) and run the command again; nothing was written"
    )


def _brief(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_live(held: dict | None) -> bool:
    """Whether ``held`` (a lease's contents, checked by :func:`lease_data`) names a writer that may still write: not
    released, not expired, and not a process of this machine that is gone."""
    return (
        isinstance(held, dict) and not held.get("released") and held["expires"] > time.time() and not _dead_here(held)
    )


def describe_holder(held: dict) -> str:
    """``machine-a (pid 4242; its lease runs 57 s more unless renewed)``."""
    left = max(0, int(held.get("expires", time.time()) - time.time()))
    return (
        f"{held.get('host', 'another machine')} (pid {held.get('pid', '?')}; its lease runs {left} s more unless "
        "renewed)"
    )


def read_lease(store: Backend, key: str, address: str) -> tuple[dict | None, str, bool]:
    """The lease at ``key`` (``address``: its address, for the line about a damaged one): (its contents, None when
    absent or released; its ETag; whether an object is there at all). A read that fails raises: "no lease" is never
    concluded from a server that did not answer; a damaged lease raises :class:`DamagedLease`."""
    data, tag, age = store.read_tagged(key)
    if data is None:
        return None, "", False
    return lease_data(data, address, age), tag, True


def live_holder(store: Backend, root: Any, name: str) -> dict | None:
    """The live lease on ``root/name`` (see :func:`is_live`), or None; :class:`DamagedLease` for a damaged one."""
    held, _, _ = read_lease(store, root.key(name, LEASE_FILE), f"{root}/{name}/{LEASE_FILE}")
    return held if is_live(held) else None


def refusal(root: Any, name: str, held: dict) -> UserError:
    """The line refusing to write ``root/name`` while ``held`` is live (as the local lock refuses)."""
    return UserError(
        f"run_name: {root}/{name} is being trained by {describe_holder(held)}; wait for it to end, or "
        "choose another run_name"
    )


class BucketLease:
    """This process's lease on ``root/name`` (see the module docstring)."""

    def __init__(self, store: Backend, root: Any, name: str):
        self.store, self.root, self.name = store, root, name
        self.key = root.key(name, LEASE_FILE)
        self.address = f"{root}/{name}/{LEASE_FILE}"
        self.token = uuid.uuid4().hex
        self.etag = ""  # of the lease as this process last wrote it
        self.confirmed_at: float | None = None  # _clock() at the last confirmation
        self.lost: dict | None = None  # the holder found when the lease was found taken
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the renewal and the mirror confirm one at a time
        self._thread: threading.Thread | None = None
        self._warned = False
        self._ended = False

    def _body(self) -> bytes:
        lease = {"token": self.token, "host": socket.gethostname(), "pid": os.getpid(), "term": term()}
        return json.dumps({**lease, "expires": time.time() + term()}).encode()

    def _read(self) -> tuple[dict | None, str, bool]:
        return read_lease(self.store, self.key, self.address)

    def _holder(self) -> dict:
        """Who holds the lease now, for a line: its contents, ``{}`` when there is none, ``{"damaged": ...}``."""
        try:
            return self._read()[0] or {}
        except DamagedLease as exc:
            return {"damaged": str(exc)}

    def _mine(self) -> bool:
        try:
            held, tag, _ = self._read()
        except DamagedLease:  # written over by something that is no lease: not this process's
            return False
        if held is not None and held.get("token") == self.token:
            self.etag = tag or self.etag
            return True
        return False

    def take(self) -> BucketLease:
        from dlrecipes.records.store.backend import Conflict

        held, tag, exists = self._read()
        if is_live(held):
            raise refusal(self.root, self.name, held)
        if held is not None:
            print(
                f"warning: the lease of {self.root}/{self.name} held by {held.get('host')} (pid {held.get('pid')}) "
                "expired without being released; this process takes the run over",
                file=sys.stderr,
            )
        try:  # another machine taking the same expired lease at the same moment: one of the two writes holds
            self.etag = self.store.write(self.key, self._body(), if_absent=not exists, if_match=tag or None)
        except Conflict:
            if not self._mine():  # (a retried write of this process's own lands as a conflict)
                raise refusal(self.root, self.name, self._read()[0] or {}) from None
        if not self._mine():  # another machine wrote after this one (a server without conditional writes)
            raise refusal(self.root, self.name, self._read()[0] or {})
        self._check_conditions()
        self.confirmed_at = _clock()
        self._abort_stale_uploads()
        self._thread = threading.Thread(target=self._renew, name="dlrecipes-lease", daemon=True)
        self._thread.start()
        return self

    def _abort_stale_uploads(self) -> None:
        """Uploads in parts left open under the run by an earlier writer (killed, or frozen past its term) are
        aborted as this one takes the run: their storage is reclaimed, and a frozen writer's upload that completes
        when it wakes lands nowhere (it cannot replace what this writer writes). Where the server cannot list them,
        nothing is aborted (said)."""
        try:
            aborted = self.store.abort_uploads(self.root.key(self.name) + "/")
        except UserError:
            raise
        except Exception as exc:
            print(
                f"warning: {self.root}/{self.name}: the uploads an earlier writer left open could not be aborted "
                f"({type(exc).__name__}); a writer frozen in an upload could still complete it",
                file=sys.stderr,
            )
            return
        if aborted:
            print(
                f"note: {self.root}/{self.name}: {aborted} upload(s) an earlier writer left open aborted",
                file=sys.stderr,
            )

    def _check_conditions(self) -> None:
        """A server that takes ``If-Match`` and ignores it would let a paused writer overwrite its successor's lease:
        one write on an ETag the lease cannot have tells; where it lands, renewals read the token back instead."""
        from dlrecipes.records.store.backend import Conflict

        if not (self.store.conditional_writes and self.etag):
            return
        try:
            self.etag = self.store.write(self.key, self._body(), if_match='"0"')
        except Conflict:
            return
        self.store.conditional_writes = False

    def confirm(self) -> None:
        """Renew the lease by a write that holds only while it is still this process's (see the module docstring);
        :class:`LeaseLost` when it is not. A server that does not answer raises what the client raised (nothing is
        confirmed: the caller writes nothing)."""
        from dlrecipes.records.store.backend import Conflict

        with self._lock:
            if self._ended:
                raise LeaseEnded(f"{self.root}/{self.name}: the lease was released")
            if self.lost is not None:
                raise self.lost_error()
            if self.store.conditional_writes and self.etag:
                try:
                    self.etag = self.store.write(self.key, self._body(), if_match=self.etag)
                except Conflict:
                    if not self._mine():  # (a retried write of this process's own lands as a conflict)
                        self._lose()
            else:
                if not self._mine():
                    self._lose()
                self.etag = self.store.write(self.key, self._body())
                if not self._mine():
                    self._lose()
            self.confirmed_at = _clock()

    def guard(self) -> None:
        """Before a file is written: :class:`LeaseLost` when the lease is gone, a confirmation when the last one is
        not recent (a pause, a hung server), nothing otherwise."""
        if self._ended:
            raise LeaseEnded(f"{self.root}/{self.name}: the lease was released")
        if self.lost is not None:
            raise self.lost_error()
        if self.confirmed_at is None or _clock() - self.confirmed_at > FRESH * term():
            self.confirm()

    def _lose(self) -> None:
        self.lost = self._holder()
        raise self.lost_error()

    def lost_error(self) -> LeaseLost:
        held = self.lost or {}
        if "damaged" in held:
            what = f"this process's lease was replaced by an object that is no lease ({self.address})"
        elif "committed" in held:
            what = "the run's pointer was moved by another writer"
        elif held:
            what = (
                f"this process's lease was taken over by {held.get('host', 'another machine')} "
                f"(pid {held.get('pid', '?')})"
            )
        else:  # a successor that took the run over and has ended since releases (deletes) the lease
            what = "this process's lease is gone from the bucket (another process took the run over, or it was deleted)"
        return LeaseLost(
            f"run_name: {self.root}/{self.name}: {what} while it trained the run (paused, or cut off from the "
            "server, past the lease's term); it stopped writing to the bucket, and its checkpoints since are kept "
            "in its staging folder only"
        )

    def _renew(self) -> None:
        while not self._stop.wait(term() / 5):
            try:
                self.confirm()
                self._warned = False
            except LeaseLost:
                return  # the mirror and the training say so, at their next step
            except Exception as exc:  # the server went away: one warning per outage; tried again at the next renewal
                if not self._warned:
                    self._warned = True
                    print(
                        f"warning: renewing the lease of {self.root}/{self.name} failed ({type(exc).__name__}); "
                        "uploads wait until it is renewed",
                        file=sys.stderr,
                    )

    def release(self, wait: float = 5.0) -> None:
        """Stop renewing and delete the lease (where this process still holds it), waiting at most ``wait`` seconds
        for the server: a lease not deleted expires by itself. Nothing is written under it afterwards."""
        self._ended = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)  # a renewal stuck on a hung server is a daemon: left behind
        if self.lost is not None:
            return
        done = threading.Thread(target=self._delete, name="dlrecipes-lease-release", daemon=True)
        done.start()
        done.join(timeout=wait)

    def _delete(self) -> None:
        try:
            if not self._mine():
                return
            if self.store.deletes:  # deleted; where the backend deletes nothing, written released
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

    def __init__(self, lock: RunLock, lease: BucketLease):
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


def leased(lock: RunLock, store: Backend, root: Any, name: str, taken: BucketLease | None = None) -> LeasedLock:
    """``lock`` with the bucket's lease on ``root/name`` (in ``store``, its backend) taken too (refused while another
    machine writes the run); ``taken``: the lease this process took already (to move an old run aside)."""
    from dlrecipes.records.store.refusals import write_refused

    try:  # the lease's write is the probe: read-only keys, a full or silent server are one line before training
        if taken is not None and taken.name != name:  # (a run opened under another name than the one claimed)
            taken.release()
            taken = None
        lease = taken if taken is not None else BucketLease(store, root, name).take()
    except BaseException as exc:
        lock.release()
        refused = (
            write_refused(cause, f"{root}")
            if isinstance(cause := getattr(exc, "cause", exc), Exception) and not isinstance(cause, UserError)
            else None
        )
        if refused is not None:
            raise refused from None
        raise
    return LeasedLock(lock, lease)
