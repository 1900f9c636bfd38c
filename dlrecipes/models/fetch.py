"""Downloading pretrained weights: fail at once, in one line, where a download cannot succeed.

Offline (no network, or ``HF_HUB_OFFLINE=1``), the Hugging Face hub retries for about a minute
before giving up.  :func:`fetching_weights` first asks whether the hub answers (a connection with a
short timeout); when it does not, the fetch runs with the hub in offline mode, so weights already in
the local cache still load and missing ones fail at once, with one line naming
``model.pretrained_path``, the offline alternative.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Iterator

from dlrecipes.errors import DataError

HUB = ("huggingface.co", 443)


def reachable(address: tuple[str, int] = HUB, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``address`` opens within ``timeout`` seconds (name lookup included)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    result: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection(address, timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=connect, daemon=True)  # a name lookup has no timeout of its own
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def fetching_weights(what: str) -> Iterator[None]:
    """Run a download of ``what``'s pretrained weights; offline, from the local cache or not at all."""
    online = reachable()
    previous = os.environ.get("HF_HUB_OFFLINE")
    hub = _hub_constants()
    hub_before = getattr(hub, "HF_HUB_OFFLINE", None)
    if not online:
        os.environ["HF_HUB_OFFLINE"] = "1"
        if hub is not None:  # read once at import by huggingface_hub: tell the loaded module too
            hub.HF_HUB_OFFLINE = True
    try:
        yield
    except (OSError, RuntimeError, ValueError) as exc:
        why = "offline, and not in the local cache" if not online else f"{type(exc).__name__}: {str(exc)[:200]}"
        raise DataError(f"model.pretrained: cannot download the pretrained weights of {what} ({why}); download "
                        "them on a connected machine and set model.pretrained_path to the file") from None
    finally:
        if not online:
            if hub is not None:
                hub.HF_HUB_OFFLINE = hub_before
            if previous is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = previous


def _hub_constants():
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    return constants
