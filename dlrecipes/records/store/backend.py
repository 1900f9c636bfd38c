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
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dlrecipes.errors import UserError, first_line

if TYPE_CHECKING:
    from composer.utils import ObjectStore


class CannotDelete(UserError):
    """The backend deletes nothing through Composer's interface."""


class Conflict(Exception):
    """A conditional write's condition did not hold: the object appeared (``if_absent``) or changed (``if_match``)."""


class Backend:
    """One bucket through Composer's ``ObjectStore`` interface (see the module docstring); keys are full keys."""

    conditional_writes = False
    deletes = False

    def __init__(self, store: ObjectStore):
        self.store = store

    def upload(self, key: str, path: str) -> None:
        self.store.upload_object(key, path)

    def download(self, key: str, path: str) -> bool:
        """``key`` into ``path``; False when the bucket does not have it."""
        try:
            self.store.download_object(key, path, overwrite=True)
        except FileNotFoundError:
            return False
        return True

    def keys(self, prefix: str) -> list[str]:
        return list(self.store.list_objects(prefix))

    def listing(self, prefix: str) -> dict[str, tuple[int, float]]:
        """Keys under ``prefix`` (relative to it) with their size and modified time (0: the interface has none)."""
        return {key[len(prefix) :]: (int(self.store.get_object_size(key)), 0.0) for key in self.keys(prefix)}

    def read(self, key: str) -> Optional[bytes]:
        """A small object's bytes; None when there is none."""
        with tempfile.TemporaryDirectory() as folder:
            target = os.path.join(folder, "object")
            return Path(target).read_bytes() if self.download(key, target) else None

    def read_tagged(self, key: str) -> tuple[Optional[bytes], str]:
        """A small object's bytes (None when there is none) and its ETag ("" where the backend cannot tell)."""
        return self.read(key), ""

    def write(self, key: str, data: bytes, if_absent: bool = False, if_match: Optional[str] = None) -> str:
        """A small object; returns its ETag ("" where the backend cannot tell).  ``if_absent``: only where there is
        none; ``if_match``: only while the object still has that ETag; where the backend can say so (else written:
        the caller reads it back).  Raises :class:`Conflict` when the condition did not hold."""
        with tempfile.TemporaryDirectory() as folder:
            source = Path(folder, "object")
            source.write_bytes(data)
            self.upload(key, str(source))
        return ""

    def copy(self, source: str, target: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            local = os.path.join(folder, "object")
            if self.download(source, local):
                self.upload(target, local)

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

    def read(self, key: str) -> Optional[bytes]:
        try:
            return self.store.client.get_object(Bucket=self.store.bucket, Key=self.store.get_key(key))["Body"].read()
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise

    def read_tagged(self, key: str) -> tuple[Optional[bytes], str]:
        try:
            answer = self.store.client.get_object(Bucket=self.store.bucket, Key=self.store.get_key(key))
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None, ""
            raise
        return answer["Body"].read(), str(answer.get("ETag", ""))

    def write(self, key: str, data: bytes, if_absent: bool = False, if_match: Optional[str] = None) -> str:
        extra: dict[str, str] = {}
        if self.conditional_writes and (if_absent or if_match):
            extra = {"IfNoneMatch": "*"} if if_absent else {"IfMatch": str(if_match)}
        try:
            answer = self.store.client.put_object(
                Bucket=self.store.bucket, Key=self.store.get_key(key), Body=data, **extra
            )
        except Exception as exc:
            if extra and (
                _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict")
                or if_match
                and _code(exc) in ("NoSuchKey", "404")
            ):  # AWS: If-Match on a deleted key
                raise Conflict(key) from None
            if extra and (
                _code(exc) in ("NotImplemented", "501", "InvalidArgument")  # no conditional writes here
                or type(exc).__name__ == "ParamValidationError"
            ):  # nor in a boto3 older than 1.35
                self.conditional_writes = False  # (the lease reads its token back instead)
                return self.write(key, data)
            raise
        return str(answer.get("ETag", ""))

    def copy(self, source: str, target: str) -> None:  # server-side: nothing passes through this machine
        self.store.client.copy_object(
            Bucket=self.store.bucket,
            Key=self.store.get_key(target),
            CopySource={"Bucket": self.store.bucket, "Key": self.store.get_key(source)},
        )

    def delete(self, key: str, why: str) -> None:
        self.store.client.delete_object(Bucket=self.store.bucket, Key=self.store.get_key(key))


def _code(exc: BaseException) -> str:
    """An S3 error's code ("" for one without an answer: a timeout's ``response`` is None)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


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
        return S3Backend(S3ObjectStore(bucket=bucket, client_config=S3_CLIENT_CONFIG, transfer_config=transfer))
    try:
        return Backend(maybe_create_object_store_from_uri(f"{scheme}://{bucket}/"))
    except (ImportError, ValueError, KeyError) as exc:  # the backend's library or its credentials missing
        raise UserError(
            f"{key_path}: {address}: Composer's {scheme}:// store cannot be made here: "
            f"{type(exc).__name__}: {first_line(exc, 200, '')}"
        ) from None


FULL = (
    "InsufficientStorage",
    "507",
    "XMinioStorageFull",
    "XMinioAdminBucketQuotaExceeded",
    "QuotaExceeded",
    "StorageFull",
)  # what S3-compatible servers answer a write they have no room for
UNANSWERED = ("ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError")


def endpoint() -> Optional[str]:
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


def write_refused(exc: BaseException, address: str, key_path: str = "runs_dir") -> Optional[UserError]:
    """The one line for a first write to a bucket that failed in a way the user can fix (the lease's write: the
    probe before training), or None for anything else."""
    where = os.environ.get("S3_ENDPOINT_URL") or "AWS's default endpoint"
    code, name = _code(exc), type(exc).__name__
    if code in ("AccessDenied", "403", "AllAccessDisabled", "AccountProblem"):
        return UserError(
            f"{key_path}: {address}: the credentials found can read the bucket but not write to it "
            f"({code}; check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the bucket's policy)"
        )
    if code in FULL:
        return UserError(
            f"{key_path}: {address}: the server at {where} refused the write: it is full ({code}); "
            "free space there, or choose another bucket"
        )
    if code in ("InternalError", "500"):  # SeaweedFS full says only this (its reason is in its log)
        return UserError(
            f"{key_path}: {address}: the server at {where} failed the write ({code}); it may be full "
            "(SeaweedFS answers so when it has no free volume) or failing: its log says why"
        )
    if name in UNANSWERED:
        return UserError(
            f"{key_path}: {address}: the S3 endpoint {where} (S3_ENDPOINT_URL) did not answer a write "
            f"({name}); check that the server is up and answering"
        )
    if code:
        first = first_line(exc, 200, code)
        return UserError(f"{key_path}: {address}: the server at {where} refused the write ({first})")
    return None
