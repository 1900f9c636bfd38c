"""What a training call may change in the process that calls it, put back when the call returns or raises.

A notebook kernel (or a script) lives on after ``dlrecipes.train``: Composer's Trainer installs its own
SIGINT/SIGTERM handler (a later Ctrl-C would raise ``SystemExit``), deterministic mode switches torch's global
flags, FFCV sets the thread count to 1, and libraries add logging handlers.  :func:`kept` restores all of it.

And what the process's collector does around the work: the training stack imported with it paused
(:func:`import_training_stack`), and no sweep of it at the exit (:func:`skip_the_exit_sweep`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2") if hasattr(signal, name)
)
LOGGERS = ("", "composer", "dlrecipes", "py.warnings")  # "": the root logger
ENVIRONMENT = ("CUBLAS_WORKSPACE_CONFIG",)  # set by Composer's deterministic mode


def _torch_flags() -> dict[str, Any]:
    import torch

    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "threads": torch.get_num_threads(),
        "grad": torch.is_grad_enabled(),
        "dtype": torch.get_default_dtype(),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }


def _set_torch_flags(flags: dict[str, Any]) -> None:
    import torch

    torch.use_deterministic_algorithms(flags["deterministic"], warn_only=flags["deterministic_warn_only"])
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    if torch.get_num_threads() != flags["threads"]:
        torch.set_num_threads(flags["threads"])
    torch.set_grad_enabled(flags["grad"])
    torch.set_default_dtype(flags["dtype"])
    torch.set_float32_matmul_precision(flags["matmul_precision"])


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Signal handlers, logging handlers and levels, torch's global flags and the variables Composer sets: as they
    were before the block, however it ends."""
    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    handlers = {s: signal.getsignal(s) for s in SIGNALS} if main else {}
    loggers = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level) for name in LOGGERS}
    environment = {name: os.environ.get(name) for name in ENVIRONMENT}
    flags = _torch_flags()
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)
        for name, (kept_handlers, level) in loggers.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = kept_handlers
            logger.setLevel(level)
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _set_torch_flags(flags)


def skip_the_exit_sweep() -> None:
    """For a process whose command has ended and which exits now: as a Python exits, its teardown sweeps every object
    torch and Composer made (about 400,000 in 4,500 modules) with its cycle collector, several times: 1.5-1.9 s of CPU
    on 2 cores after the work is done. What is garbage now is collected once (its finalizers run: files closed), then
    the rest is frozen (:func:`freeze_survivors`: left out of later sweeps); the exit still runs atexit handlers,
    flushes and closes files as usual. A process forked from the fork server ends without a teardown (``os._exit``), so
    it is left alone: a sweep there would only copy pages."""
    from dlrecipes.runtime.fork_server import forked_from_server

    if forked_from_server():
        return
    freeze_survivors()


def freeze_survivors() -> None:
    """Collect what is garbage now (its finalizers run), then freeze the rest (``gc.freeze``): objects alive now are
    left out of every later collection, in this process and in any forked from it."""
    import gc

    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off in the block, back as it was after it."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_OWNS_PROCESS = False  # set by the CLI's command that is the process's own (api.invoked(..., ends_process=True))


def command_owns_process() -> None:
    """Say that the running command is the process's own: it ends with it (the console script, ``python -m
    dlrecipes``, a launched rank), as opposed to a call from a notebook or a script that lives on."""
    global _OWNS_PROCESS
    _OWNS_PROCESS = True


def import_training_stack() -> None:
    """Import torch and Composer (once a process) with the cycle collector paused: the import makes about 400,000
    objects, all alive as long as the process, which the collector walked again each time their number grew by a
    quarter. In a command that owns its process they are then frozen (:func:`freeze_survivors`, after one
    collection of what is garbage) so that no later collection walks them either: ``dlrecipes train`` of the tests'
    tiny recipe in a new Python, 5.3 s -> 4.6 s of CPU. (A notebook's objects are left as they are.) Called by the
    commands that train or build a network, after the checks that need neither (a bad recipe still fails in a
    fraction of a second); a process that has them already returns at once."""
    import importlib
    import sys

    if "composer" in sys.modules:
        return
    with collector_paused():
        importlib.import_module("composer")
        if _OWNS_PROCESS:
            freeze_survivors()
