"""The Hugging Face hub, asked once whether it answers: offline, its libraries use their local cache at once.

Offline (no network, or ``HF_HUB_OFFLINE=1``), ``huggingface_hub`` and ``datasets`` retry for about a
minute before giving up.  :func:`hub_offline_unless_reachable` first asks whether the hub answers (a
connection with a short timeout); when it does not, what runs inside it runs with the hub in offline
mode, so what is in the local cache still loads and what is not fails at once.  Pretrained weights
(:mod:`dlrecipes.models.fetch`) and Hugging Face datasets (:mod:`dlrecipes.data.hf_dataset`) both use it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator

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


def _hub_configs() -> list:
    """The modules that read ``HF_HUB_OFFLINE`` once, at their import (so the variable alone is too late):
    ``huggingface_hub``'s constants (imported here, so that they are set back afterwards) and ``datasets``' config
    when it is loaded (a caller imports ``datasets`` before the hub is asked)."""
    with contextlib.suppress(ImportError):
        import huggingface_hub.constants  # noqa: F401
    return [
        module
        for module in (sys.modules.get("huggingface_hub.constants"), sys.modules.get("datasets.config"))
        if module is not None
    ]


@contextlib.contextmanager
def hub_offline_unless_reachable() -> Iterator[bool]:
    """Run the body with the hub in offline mode unless it answers; yields whether it does."""
    online = reachable()
    if online:
        yield True
        return
    previous = os.environ.get("HF_HUB_OFFLINE")
    configs = _hub_configs()
    before = [getattr(config, "HF_HUB_OFFLINE", None) for config in configs]
    os.environ["HF_HUB_OFFLINE"] = "1"
    for config in configs:
        config.HF_HUB_OFFLINE = True
    try:
        yield False
    finally:
        for config, value in zip(configs, before):
            config.HF_HUB_OFFLINE = value
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous
