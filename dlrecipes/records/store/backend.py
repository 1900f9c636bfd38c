"""A bucket through Composer's object-store layer: the store Composer's URI factory makes for the address's scheme
(``s3://``, ``gs://``, ``oci://``, ``azure://``), and the few operations the run store needs beyond Composer's
``ObjectStore`` interface.

:class:`Backend` uses that interface alone (``upload_object``, ``download_object``, ``get_object_size``,
``list_objects``): a small object is read and written through a temporary file, a copy is a download and an upload,
a listing has sizes but no times, there is no conditional write (the lease's read-back decides), and nothing can be
deleted (a lease is released by writing it released; moving a run aside is refused in one line).
:class:`S3Backend` uses boto3's client beneath Composer's S3 store for what S3 has: listings with times, conditional
writes (``If-None-Match``, ``If-Match``), server-side copies and deletes.  Every scheme works the same way through
these; S3 is the one tested against a server (SeaweedFS), the interface-only path included.
"""

from __future__ import annotations

import datetime
import functools
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dlrecipes.errors import UserError, first_line
from dlrecipes.records.store.refusals import error_code, failed_at

if TYPE_CHECKING:
    from composer.utils import ObjectStore


class CannotDelete(UserError):
    """The backend deletes nothing through Composer's interface."""


class Conflict(Exception):
    """A conditional write's condition did not hold: the object appeared (``if_absent``) or changed (``if_match``)."""


STALL_ENV = "DLRECIPES_BUCKET_STALL"
DEFAULT_STALL = 60.0  # seconds an operation on a bucket may go without an answer (or a byte) before it is given up


def seconds_setting(name: str, default: float) -> float:
    """The environment variable ``name`` as a positive number of seconds (``default`` when unset or not positive);
    one line when it is no number."""
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        raise UserError(f"{name}: {os.environ[name]!r} is not a number of seconds") from None
    return value if value > 0 else default


def stall() -> float:
    """Seconds a bucket operation may go without progress (``DLRECIPES_BUCKET_STALL``, else a minute)."""
    return seconds_setting(STALL_ENV, DEFAULT_STALL)


class ServerStalled(UserError):
    """A bucket's server stopped answering an operation: given up after :func:`stall` seconds without progress."""


class ServerInterrupted(UserError):
    """Ctrl-C while a command waited on a bucket's server: it ends at once, saying what it was doing."""

    exit_code = 130


_GAVE_UP: dict[str, tuple[float, float]] = {}  # server -> when an operation on it was given up, and until when
# the next are not tried (Backend.waited)
_WORKER = threading.local()  # in an operation's own thread: ``progress`` (call it as bytes arrive) and ``inside``
T = TypeVar("T")


def _answered(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A backend operation on ``key`` (its first argument), waited for by :meth:`Backend.waited`: bounded, and
    Ctrl-C ends the wait at once. ``what``: what it does, for the line (``downloading``)."""

    def decorate(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def bounded(self: Backend, key: str, *args: Any, **kwargs: Any) -> T:
            return self.waited(what, key, lambda: method(self, key, *args, **kwargs))

        return bounded

    return decorate


def progressed(*_: Any) -> None:
    """Called from inside an operation as its bytes arrive (a download's callback): the stall clock starts again."""
    note = getattr(_WORKER, "progress", None)
    if note is not None:
        note()


class Backend:
    """One bucket through Composer's ``ObjectStore`` interface (see the module docstring); keys are full keys."""

    conditional_writes = False
    deletes = False

    def __init__(self, store: ObjectStore, server: str = "its server", address: str = ""):
        self.store = store
        self.server, self.address = server, address  # for the lines: the endpoint, and scheme://bucket

    def waited(self, what: str, key: str, call: Callable[[], T]) -> T:
        """``call()`` (an operation on ``key``) in a thread of its own, waited for in short steps: given up
        (:class:`ServerStalled`, one line naming the server and the operation) when it makes no progress for
        :func:`stall` seconds, whatever the client's own retries would still do; Ctrl-C ends the wait at once
        (:class:`ServerInterrupted`). An operation inside another (a read through a download) runs as it is.

        A server that made one operation give up is not asked again by this process for :func:`stall` seconds: the
        next operations on it end at once, so a command that goes on after a failure (its cleanup, a training's
        records) is bounded in all, not per request."""
        if getattr(_WORKER, "inside", False):
            return call()
        where = f"{self.address}/{key}" if self.address else key
        gave_up, until = _GAVE_UP.get(self.server, (0.0, 0.0))
        if time.monotonic() < until:
            raise ServerStalled(
                f"{where}: not tried: {self.server} stopped answering {time.monotonic() - gave_up:.0f} s ago in this "
                "command; check that the server is up, then run the command again"
            )
        box: dict[str, Any] = {}
        last = [time.monotonic()]

        def run() -> None:
            _WORKER.inside, _WORKER.box = True, box
            _WORKER.progress = lambda: last.__setitem__(0, time.monotonic())
            try:
                box["value"] = call()
            except BaseException as exc:  # handed to the waiting thread as it is
                box["error"] = exc

        worker = threading.Thread(target=run, name="dlrecipes-bucket", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.2)
                if worker.is_alive() and time.monotonic() - last[0] > stall():
                    _GAVE_UP[self.server] = (time.monotonic(), time.monotonic() + stall())
                    raise ServerStalled(
                        f"{where}: {self.server} stopped answering while {what} it (nothing for {stall():.0f} s); "
                        "check that the server is up, then run the command again"
                    )
        except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C, or SIGINT/SIGTERM as Composer's handler exits
            if isinstance(stop, SystemExit) and stop.code not in (130, 143):
                raise
            cause = "SIGTERM" if isinstance(stop, SystemExit) and stop.code == 143 else "Ctrl-C"
            interrupted = ServerInterrupted(f"{where}: interrupted ({cause}) while {what} it at {self.server}")
            interrupted.exit_code = 143 if cause == "SIGTERM" else 130
            raise interrupted from None  # the operation's thread is a daemon: left behind, it ends with the process
        finally:
            if worker.is_alive() and "partial" in box:  # given up: what it was writing goes (it writes on unseen)
                Path(box["partial"]).unlink(missing_ok=True)
        if "error" in box:
            failed = failed_at(box["error"], where, self.server, what)
            if failed is not None:
                raise failed from None
            raise box["error"]
        return box["value"]

    def upload(self, key: str, path: str, once: bool = False) -> None:
        """The file ``path`` to ``key``; ``once``: only where there is none (:class:`Conflict` otherwise), where the
        backend can say so."""
        self.store.upload_object(key, path)

    def abort_uploads(self, prefix: str) -> int:
        """Abort every upload in parts still open under ``prefix`` (a fenced or killed writer's); how many. Composer's
        interface has none to abort."""
        return 0

    @_answered("downloading")
    def download(self, key: str, path: str) -> bool:
        """``key`` into ``path``; False when the bucket does not have it."""
        try:
            self.store.download_object(key, path, overwrite=True, callback=progressed)
        except FileNotFoundError:
            return False
        return True

    @_answered("listing")
    def keys(self, prefix: str) -> list[str]:
        return list(self.store.list_objects(prefix))

    @_answered("listing")
    def listing(self, prefix: str) -> dict[str, tuple[int, float]]:
        """Keys under ``prefix`` (relative to it) with their size and modified time (0: the interface has none)."""
        return {key[len(prefix) :]: (int(self.store.get_object_size(key)), 0.0) for key in self.keys(prefix)}

    @_answered("reading")
    def read(self, key: str) -> bytes | None:
        """A small object's bytes; None when there is none."""
        with tempfile.TemporaryDirectory() as folder:
            target = os.path.join(folder, "object")
            return Path(target).read_bytes() if self.download(key, target) else None

    @_answered("reading")
    def read_tagged(self, key: str) -> tuple[bytes | None, str, float | None]:
        """A small object's bytes (None when there is none), its ETag ("" where the backend cannot tell) and its age:
        seconds since it was written, on the server's clock (None where the backend cannot tell)."""
        return self.read(key), "", None

    @_answered("writing")
    def write(self, key: str, data: bytes, if_absent: bool = False, if_match: str | None = None) -> str:
        """A small object; returns its ETag ("" where the backend cannot tell).  ``if_absent``: only where there is
        none; ``if_match``: only while the object still has that ETag; where the backend can say so (else written:
        the caller reads it back).  Raises :class:`Conflict` when the condition did not hold."""
        with tempfile.TemporaryDirectory() as folder:
            source = Path(folder, "object")
            source.write_bytes(data)
            self.upload(key, str(source))
        return ""

    @_answered("copying")
    def copy(self, source: str, target: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            local = os.path.join(folder, "object")
            if self.download(source, local):
                self.upload(target, local)

    @_answered("deleting")
    def delete(self, key: str, why: str) -> None:
        """``why``: what needs the delete, naming the address (the line refusing it begins with it)."""
        raise CannotDelete(
            f"{why} is reached through Composer's object-store interface, which deletes nothing; choose "
            "another run_name"
        )


class S3Backend(Backend):
    """S3 (and compatible servers): Composer's S3 store, with its boto3 client for what the interface lacks."""

    conditional_writes = True
    deletes = True

    def upload(self, key: str, path: str, once: bool = False) -> None:
        if not (once and self.conditional_writes):
            return self.store.upload_object(key, path)
        from dlrecipes.records.store.write_once import refused_as_written, unconditional_here, write_once, written_once

        full = self.store.get_key(key)
        write_once(self.store.client, full)
        try:
            self.store.upload_object(key, path)
        except Exception as exc:
            if refused_as_written(exc):
                raise Conflict(key) from None
            if unconditional_here(exc):
                self.conditional_writes = False
                return self.store.upload_object(key, path)
            raise
        finally:
            written_once(full)

    @_answered("aborting the open uploads under")
    def abort_uploads(self, prefix: str) -> int:
        uploads = []
        pages = self.store.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.store.bucket, Prefix=self.store.get_key(prefix)
        )
        for page in pages:
            uploads += [(upload["Key"], upload["UploadId"]) for upload in page.get("Uploads", ())]
        for key, upload in uploads:  # its parts' storage reclaimed; its completion, if it ever comes, lands nowhere
            self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=key, UploadId=upload)
        return len(uploads)

    @_answered("downloading")
    def download(self, key: str, path: str) -> bool:
        """As Composer's store downloads (a temporary file renamed into place), with each part's bytes marking
        progress (:func:`progressed`) and without its extra request for the size."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}-{threading.get_ident()}.partial")
        getattr(_WORKER, "box", {})["partial"] = partial  # removed by the wait that gives it up
        try:
            self.store.client.download_file(
                Bucket=self.store.bucket,
                Key=self.store.get_key(key),
                Filename=str(partial),
                Callback=progressed,
                Config=self.store.transfer_config,
            )
        except Exception as exc:
            partial.unlink(missing_ok=True)
            if error_code(exc) in ("NoSuchKey", "404", "403"):
                return False
            raise
        os.replace(partial, target)
        return True

    @_answered("listing")
    def listing(self, prefix: str) -> dict[str, tuple[int, float]]:
        found: dict[str, tuple[int, float]] = {}
        pages = self.store.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.store.bucket, Prefix=self.store.get_key(prefix)
        )
        for page in pages:
            for item in page.get("Contents", ()):
                relative = item["Key"][len(self.store.get_key(prefix)) :]
                modified = item["LastModified"]
                stamp = modified.timestamp() if isinstance(modified, datetime.datetime) else float(modified)
                found[relative] = (int(item["Size"]), stamp)
        return found

    @_answered("reading")
    def read(self, key: str) -> bytes | None:
        try:
            return self.store.client.get_object(Bucket=self.store.bucket, Key=self.store.get_key(key))["Body"].read()
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise

    @_answered("reading")
    def read_tagged(self, key: str) -> tuple[bytes | None, str, float | None]:
        try:
            answer = self.store.client.get_object(Bucket=self.store.bucket, Key=self.store.get_key(key))
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return None, "", None
            raise
        return answer["Body"].read(), str(answer.get("ETag", "")), _age(answer)

    @_answered("writing")
    def write(self, key: str, data: bytes, if_absent: bool = False, if_match: str | None = None) -> str:
        extra: dict[str, str] = {}
        if self.conditional_writes and (if_absent or if_match):
            extra = {"IfNoneMatch": "*"} if if_absent else {"IfMatch": str(if_match)}
        try:
            answer = self.store.client.put_object(
                Bucket=self.store.bucket, Key=self.store.get_key(key), Body=data, **extra
            )
        except Exception as exc:
            if extra and (
                error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict")
                or if_match
                and error_code(exc) in ("NoSuchKey", "404")
            ):  # AWS: If-Match on a deleted key
                raise Conflict(key) from None
            if extra and (
                error_code(exc) in ("NotImplemented", "501", "InvalidArgument")  # no conditional writes here
                or type(exc).__name__ == "ParamValidationError"
            ):  # nor in a boto3 older than 1.35
                self.conditional_writes = False  # (the lease reads its token back instead)
                return self.write(key, data)
            raise
        return str(answer.get("ETag", ""))

    @_answered("copying")
    def copy(self, source: str, target: str) -> None:  # server-side: nothing passes through this machine
        self.store.client.copy_object(
            Bucket=self.store.bucket,
            Key=self.store.get_key(target),
            CopySource={"Bucket": self.store.bucket, "Key": self.store.get_key(source)},
        )

    @_answered("deleting")
    def delete(self, key: str, why: str) -> None:
        self.store.client.delete_object(Bucket=self.store.bucket, Key=self.store.get_key(key))


def _age(answer: dict) -> float | None:
    """Seconds between an object's Last-Modified and the response's Date: both the server's clock, so no writer's or
    reader's clock enters (None where either is missing or unreadable)."""
    from email.utils import parsedate_to_datetime

    modified = answer.get("LastModified")
    date = (answer.get("ResponseMetadata") or {}).get("HTTPHeaders", {}).get("date")
    if not isinstance(modified, datetime.datetime) or not isinstance(date, str):
        return None
    try:
        return max(0.0, (parsedate_to_datetime(date) - modified).total_seconds())
    except (TypeError, ValueError):
        return None


_MADE: dict[tuple, Backend] = {}
# every S3 client's: bounded retries and timeouts (the training's mirror and its upload process alike)
S3_CLIENT_CONFIG = {"retries": {"max_attempts": 3, "mode": "standard"}, "connect_timeout": 5.0, "read_timeout": 30.0}
TRANSFER_THREADS = 10  # threads one upload or download of a large object uses at most (its parts at once)


def make_backend(scheme: str, bucket: str, address: str, key_path: str = "runs_dir") -> Backend:
    """The bucket's backend, made once per process, bucket and credentials (a store's client costs a quarter of a
    second to make; ``runs`` over many runs would pay it per run)."""
    asked = (os.getpid(), scheme, bucket, *(os.environ.get(name, "") for name in _CREDENTIALS))
    if asked not in _MADE:
        _MADE[asked] = _new_backend(scheme, bucket, address, key_path)
    return _MADE[asked]


_CREDENTIALS = (
    "S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_PROFILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "OCI_CONFIG_FILE",
    "AZURE_ACCOUNT_NAME",
    "AZURE_ACCOUNT_ACCESS_KEY",
)


def _new_backend(scheme: str, bucket: str, address: str, key_path: str) -> Backend:
    """Composer's store from its URI factory (for S3 with bounded retries and timeouts)."""
    try:
        from composer.utils.file_helpers import maybe_create_object_store_from_uri
        from composer.utils.object_store import S3ObjectStore
    except ImportError as exc:  # boto3 missing
        raise UserError(f"{key_path}: {address} needs boto3: pip install 'dlrecipes[s3]' ({exc})") from None
    if scheme == "s3":
        transfer = {"max_concurrency": TRANSFER_THREADS}  # bounded (2 made uploads longer and steps slower)
        server = f"the S3 endpoint {endpoint() or 'of AWS'}"
        store = S3ObjectStore(bucket=bucket, client_config=S3_CLIENT_CONFIG, transfer_config=transfer)
        return S3Backend(store, server, f"s3://{bucket}")
    try:
        store = maybe_create_object_store_from_uri(f"{scheme}://{bucket}/")
        return Backend(store, f"Composer's {scheme}:// store", f"{scheme}://{bucket}")
    except (ImportError, ValueError, KeyError) as exc:  # the backend's library or its credentials missing
        raise UserError(
            f"{key_path}: {address}: Composer's {scheme}:// store cannot be made here: "
            f"{type(exc).__name__}: {first_line(exc, 200, '')}"
        ) from None


def endpoint() -> str | None:
    """``S3_ENDPOINT_URL`` (None: AWS's own), refused in one line when it is no http:// or https:// address."""
    from dlrecipes.core.addresses import control_character

    url = os.environ.get("S3_ENDPOINT_URL") or None
    if url is None:
        return None
    bad = control_character(url)
    if bad is not None:
        raise UserError(f"S3_ENDPOINT_URL: {url!r} holds a control character ({bad}); set it to the server's address")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise UserError(f"S3_ENDPOINT_URL: {url!r} has no scheme; give http://{url} or https://{url}")
    if scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
        raise UserError(
            f"S3_ENDPOINT_URL: {url!r} is not an http:// or https:// address (give http://HOST:PORT or https://HOST)"
        )
    return url
