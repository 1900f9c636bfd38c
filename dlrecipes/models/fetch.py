"""Downloading pretrained weights: fail at once, in one line, where a download cannot succeed.

Offline (no network, or ``HF_HUB_OFFLINE=1``), the Hugging Face hub retries for about a minute
before giving up.  :func:`fetching_weights` runs the fetch in
:func:`dlrecipes.runtime.hub.hub_offline_unless_reachable`, so weights already in the local cache still
load and missing ones fail at once, with one line naming ``model.pretrained_path``, the offline alternative.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dlrecipes.errors import DataError
from dlrecipes.runtime.hub import HUB, hub_offline_unless_reachable, reachable

__all__ = ["HUB", "fetching_weights", "reachable"]


@contextlib.contextmanager
def fetching_weights(what: str) -> Iterator[None]:
    """Run a download of ``what``'s pretrained weights; offline, from the local cache or not at all."""
    with hub_offline_unless_reachable() as online:
        try:
            yield
        except (OSError, RuntimeError, ValueError) as exc:
            why = "offline, and not in the local cache" if not online else f"{type(exc).__name__}: {str(exc)[:200]}"
            raise DataError(
                f"model.pretrained: cannot download the pretrained weights of {what} ({why}); download "
                "them on a connected machine and set model.pretrained_path to the file"
            ) from None
