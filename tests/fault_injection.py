"""A test plugin that breaks training on purpose: ``--plugin tests/fault_injection.py``.

``callbacks: {fault_injection: {...}}`` then kills the process (SIGKILL: no cleanup, no
``finally``) at a chosen point, or makes a checkpoint write fail as a full disk would:

- ``kill_at_batch: N``: after batch N's optimizer step, before any checkpoint of it;
- ``kill_in_save: K``: half-way through writing the K-th periodic checkpoint file;
- ``kill_before_link: K``: after the K-th checkpoint is complete under its name, before
  ``latest`` points at it;
- ``fail_save: K``: the K-th checkpoint write raises ENOSPC.
"""

from __future__ import annotations

import errno
import io
import os
import signal

from dlrecipes.registry import callbacks


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@callbacks.register("fault_injection")
def fault_injection(kill_at_batch: int = -1, kill_in_save: int = -1, kill_before_link: int = -1, fail_save: int = -1):
    """Kill the process or fail a checkpoint write at a chosen point (tests only)."""
    import torch
    from composer.core import Callback

    import dlrecipes.checkpoints as checkpoints

    real_save, real_relink = torch.save, checkpoints.relink
    saves = {"n": 0}

    def save(obj, f, *args, **kwargs):
        name = os.path.basename(str(getattr(f, "name", "")))
        if not (name.startswith("ep") and name.endswith(checkpoints.PARTIAL_SUFFIX)):  # periodic checkpoints only
            return real_save(obj, f, *args, **kwargs)
        saves["n"] += 1
        if saves["n"] == fail_save:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if saves["n"] == kill_in_save:
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            f.flush()
            _die()
        return real_save(obj, f, *args, **kwargs)

    def relink(link, target):
        if saves["n"] == kill_before_link and link.name.startswith("latest"):
            _die()
        return real_relink(link, target)

    torch.save = save
    checkpoints.relink = relink

    class FaultInjection(Callback):
        def batch_end(self, state, logger):
            if int(state.timestamp.batch) == kill_at_batch:  # batch N trained, its checkpoint not yet written
                _die()

    return FaultInjection()
