"""A test plugin that breaks training on purpose: ``--plugin tests/fault_injection.py``.

``callbacks: {fault_injection: {...}}`` then kills the process (SIGKILL: no cleanup, no
``finally``) at a chosen point, or makes a checkpoint write fail as a full disk would:

- ``kill_at_batch: N``: after batch N's optimizer step, before any checkpoint of it (on every
  rank, or only on ``kill_rank``);
- ``kill_in_save: K``: half-way through writing the K-th periodic checkpoint file;
- ``kill_before_link: K``: after the K-th checkpoint is complete under its name, before
  ``latest`` points at it;
- ``fail_save: K``: the K-th checkpoint write raises ENOSPC;
- ``signal_at_batch: N`` (with ``signal_name``, default SIGTERM, and ``signal_rank``, default
  all ranks): the process sends itself that signal after batch N, as a cluster would.

``callbacks: {slow_batches: {seconds: S}}`` makes every batch take at least S seconds, so that a run
lasts a known time (a signal or a time limit then lands inside it).
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
def fault_injection(
    kill_at_batch: int = -1,
    kill_in_save: int = -1,
    kill_before_link: int = -1,
    fail_save: int = -1,
    signal_at_batch: int = -1,
    signal_name: str = "SIGTERM",
    signal_rank: int = -1,
    kill_rank: int = -1,
):
    """Kill the process or fail a checkpoint write at a chosen point (tests only)."""
    import torch
    from composer.core import Callback

    import dlrecipes.records.checkpoints as checkpoints

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
            from composer.utils import dist

            if int(state.timestamp.batch) == kill_at_batch and kill_rank in (-1, dist.get_global_rank()):
                _die()  # batch N trained, its checkpoint not yet written
            if int(state.timestamp.batch) == signal_at_batch and signal_rank in (-1, dist.get_global_rank()):
                os.kill(os.getpid(), getattr(signal, signal_name))

    return FaultInjection()


@callbacks.register("slow_batches")
def slow_batches(seconds: float = 0.05):
    """Every batch takes at least ``seconds`` (tests only)."""
    import time

    from composer.core import Callback

    class Slow(Callback):
        def batch_end(self, state, logger):
            time.sleep(seconds)

    return Slow()
