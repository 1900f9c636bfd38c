"""Uploads written once: ``If-None-Match: *`` added to boto3's requests for the keys being uploaded so (one
``PutObject``, or the ``CompleteMultipartUpload`` that ends an upload in parts), for the training's own client and
its upload process's alike; and the two answers that matter, told apart from the rest."""

from __future__ import annotations

from typing import Any

from dlrecipes.records.store.refusals import error_code

_ONCE: set[str] = set()  # keys being uploaded write-once (If-None-Match: *), by any client of this process


def _if_absent(params: dict, **_: Any) -> None:
    if params.get("Key") in _ONCE:
        params["IfNoneMatch"] = "*"


def write_once(client: Any, key: str) -> None:
    """The next uploads of ``key`` through ``client`` (boto3's transfer: one PutObject, or parts completed by
    CompleteMultipartUpload) hold only where the key has no object (``If-None-Match: *``); the caller says when they
    are done (:func:`written_once`)."""
    if not getattr(client, "_dlrecipes_once", False):
        for operation in ("PutObject", "CompleteMultipartUpload"):
            client.meta.events.register(f"before-parameter-build.s3.{operation}", _if_absent)
        client._dlrecipes_once = True
    _ONCE.add(key)


def written_once(key: str) -> None:
    """The uploads of ``key`` are done: later ones are as any."""
    _ONCE.discard(key)


def refused_as_written(exc: BaseException) -> bool:
    """Whether an upload failed because its condition did not hold (the key had an object)."""
    text = f"{error_code(exc)} {exc}"
    return any(mark in text for mark in ("PreconditionFailed", "(412)", "ConditionalRequestConflict"))


def unconditional_here(exc: BaseException) -> bool:
    """Whether the server refused a write for its condition alone (it has no conditional writes)."""
    text = f"{error_code(exc)} {exc}"
    return any(mark in text for mark in ("NotImplemented", "(501)"))


__all__ = ["refused_as_written", "unconditional_here", "write_once", "written_once"]
