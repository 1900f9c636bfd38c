"""The Trainer's life outside its steps: memory kept for reuse on a CPU, and what its close frees (the exit hook,
torch's cache of models, the loaders' worker processes)."""

from __future__ import annotations

import atexit
import weakref
from typing import Any

from composer.core import Engine, State


def keep_freed_memory_for_reuse() -> bool:
    """Tell glibc's malloc to keep large freed blocks for reuse (CPU training).

    Optimizers and autograd allocate parameter-sized temporaries every step.  glibc returns
    blocks above its (adaptive) mmap threshold to the kernel and faults fresh zeroed pages in
    on the next step; measured on 2 cores, that made AdamW on ResNet-18 2-3x slower in one of
    two identical loops in the same process.  Fixing the threshold at its maximum (32 MiB) and
    not trimming the heap keeps those blocks.  No effect (False) where libc is not glibc.
    """
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20)) and bool(libc.mallopt(m_trim_threshold, 2**30))
    except (OSError, AttributeError):
        return False


def forget_models() -> None:
    """Empty torch's cache of parameter names by model (``_get_fqns``, an unbounded ``lru_cache`` keyed by the
    model, filled when Composer reads the state dict for a checkpoint): it keeps every model it saw alive."""
    from torch.distributed.checkpoint import state_dict

    cached = getattr(state_dict, "_get_fqns", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


def stop_loader_workers(state: State) -> None:
    """End the worker processes of the run's data loaders (``persistent_workers`` keeps them between epochs).
    Left to the garbage collector, a loader is collected with the Trainer's other objects, in no set order: its
    queues can go first, and each worker's join then waits out torch's 5 s timeout, at a moment of the next
    training in the same process (a notebook, a sweep), while the workers stay alive until then."""
    for loader in [state.train_dataloader, *(evaluator.dataloader.dataloader for evaluator in state.evaluators)]:
        for _ in range(3):  # the loader, and the DataLoader a wrapper of ours holds as .loader (the tensor cache's)
            iterator = getattr(loader, "_iterator", None)  # torch's DataLoader: its workers' iterator, if kept
            if hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()  # what the iterator's __del__ calls, now, with its queues alive
                loader._iterator = None  # a later epoch (trainer.eval after close) starts workers of its own
            loader = getattr(loader, "loader", None)


def close_at_exit(engine: weakref.ref[Engine]) -> None:
    """At the process's end, the engine's close (its callbacks' close and post_close) if it is still open."""
    alive = engine()
    if alive is not None and not alive._is_closed:
        alive.close()


class Lifecycle:
    """The Trainer's close (a mixin of :class:`dlrecipes.engine.trainer.Trainer`)."""

    state: State
    _at_exit: Any

    def close(self) -> None:
        try:
            super().close()
        finally:
            atexit.unregister(self._at_exit)
            forget_models()
            stop_loader_workers(self.state)
