"""What a server's failures mean to a user: one line naming the server, the object and the operation, never
"unexpected": a server that could not be reached or failed an operation after the client's retries
(:func:`failed_at`, raised by :meth:`~.backend.Backend.waited`), and the first write's refusals (:func:`write_refused`:
credentials that cannot write, a full server, one that does not answer)."""

from __future__ import annotations

import os

from dlrecipes.errors import UserError, first_line

FULL = (
    "InsufficientStorage",
    "507",
    "XMinioStorageFull",
    "XMinioAdminBucketQuotaExceeded",
    "QuotaExceeded",
    "StorageFull",
)  # what S3-compatible servers answer a write they have no room for
UNANSWERED = ("ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError")


def error_code(exc: BaseException) -> str:
    """An S3 error's code ("" for one without an answer: a timeout's ``response`` is None)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


class ServerFailed(UserError):
    """The server could not be reached for an operation, or failed it after the client's retries (``cause``: what
    the client raised): one line naming the server and the operation, never "unexpected"."""

    def __init__(self, message: str, cause: BaseException):
        super().__init__(message)
        self.cause = cause


def failed_at(exc: BaseException, where: str, server: str, what: str) -> ServerFailed | None:
    """The line for an operation the server did not answer or failed (``where``: the object's address; ``what``: the
    operation, "downloading"), or None for any other error."""
    code, name = error_code(exc), type(exc).__name__
    if name in UNANSWERED:
        return ServerFailed(
            f"{where}: {server} could not be reached while {what} it ({name}); check that the server is up, then run "
            "the command again",
            exc,
        )
    if code in ("InternalError", "500", "ServiceUnavailable", "503", "SlowDown", "502", "504"):
        return ServerFailed(
            f"{where}: {server} failed while {what} it ({code}, after retries); it may be full (SeaweedFS answers "
            "so when it has no free volume) or failing: its log says why",
            exc,
        )
    return None


def write_refused(exc: BaseException, address: str, key_path: str = "runs_dir") -> UserError | None:
    """The one line for a first write to a bucket that failed in a way the user can fix (the lease's write: the
    probe before training), or None for anything else."""
    where = os.environ.get("S3_ENDPOINT_URL") or "AWS's default endpoint"
    code, name = error_code(exc), type(exc).__name__
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


__all__ = ["FULL", "UNANSWERED", "ServerFailed", "error_code", "failed_at", "write_refused"]
