"""``python -m dlrecipes ARGS`` as a process forked from one that has imported torch, Composer and dlrecipes once.

A new Python spends 5-10 s of CPU importing torch and Composer before it trains anything; for a sweep of short
runs on a CPU that is most of each point. Here the imports are paid once, by a server process
(``multiprocessing``'s forkserver), and each training is a process forked from it: a process of its own (pid,
exit code, signals, session, environment, working directory, output file), started in milliseconds.

Only where no GPU is used: CUDA cannot be used in a process forked from one that has initialised it, and a
GPU run's start-up is small beside its training, so GPU runs start a new Python process for each training.

A process that was itself forked from such a server (a sweep started that way, as the tests start commands) has
the imports already: while it runs one thread, it forks its trainings itself, as the server would, instead of
starting a second server that pays them again.

What a forked process runs and what the server imports first come from the caller, as a :class:`Program`: the
``dlrecipes`` command's is :data:`dlrecipes.api.FORKED` (its server imports :mod:`dlrecipes.preload`); the
tests start their processes with programs of their own (tests/forked.py: another module, a pseudo-terminal handed
over). This module imports nothing of dlrecipes and names no module.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext
    from multiprocessing.process import BaseProcess


@dataclass(frozen=True)
class Program:
    """What a forked process runs: ``main(args)`` (a module-level function or a ``functools.partial`` of one: it
    crosses to the server by reference), forked from a server that imported the modules ``preload`` names once, the
    last of which calls :func:`mark_preloaded`. One server per process: the first program started sets its imports."""

    main: Callable[[list[str]], Any]
    preload: tuple[str, ...]


_CONTEXT: ForkServerContext | None = None
_PRELOADED = False  # set in the server by its preload (mark_preloaded); its forks, and theirs, inherit it


def _server(program: Program) -> ForkServerContext:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(list(program.preload))
    return _CONTEXT


def mark_preloaded() -> None:
    """Called by a server's preload once its imports are done: this process, and every process forked from it, has
    them."""
    global _PRELOADED
    _PRELOADED = True


def forked_from_server() -> bool:
    """Whether this process was forked from the server, or from a process that was (only a preload marks it)."""
    return _PRELOADED


def forks_itself() -> bool:
    """Whether this process has what the server imports (it was forked from one) and runs one thread, so that a
    fork of it is what the server's would be: a fork copies only the thread that calls it, and no other thread can
    hold a lock the copy would wait on. Linux only (/proc)."""
    if not forked_from_server():
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def start_server(program: Program) -> None:
    """Start ``program``'s server now (its imports go on in the background); ``start`` would otherwise start it and
    wait."""
    from multiprocessing import forkserver

    if forks_itself():
        return
    _server(program)
    forkserver.ensure_running()


class Started:
    """A started training, with the part of ``subprocess.Popen``'s interface a caller needs."""

    def __init__(self, process: BaseProcess):
        self._process = process
        self.pid: int = process.pid
        self.args: list[str] = []

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # it ended in between
                pass

    def kill(self) -> None:
        self._process.kill()


def _stdio(out: str | None, err: str | None, append: bool) -> None:
    """stdout and stderr to the files (stderr to stdout's when ``err`` is None); unbuffered, as PYTHONUNBUFFERED=1
    makes them."""
    if out is not None:
        mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        os.dup2(os.open(out, mode), 1)
        os.dup2(os.open(err, mode) if err else 1, 2)
    sys.stdout, sys.stderr = (
        io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False), write_through=True, encoding="utf-8", errors="backslashreplace"
        )
        for fd in (1, 2)
    )


def _fresh_signals() -> None:
    """The signal handling a new Python starts with (what the server's forks get back), in place of the forking
    process's own: its handlers, wakeup file descriptor and blocked signals."""
    import signal

    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        fresh = {
            signal.SIGINT: signal.default_int_handler,
            signal.SIGPIPE: signal.SIG_IGN,
            signal.SIGXFSZ: signal.SIG_IGN,
        }.get(signum, signal.SIG_DFL)
        try:
            if signal.getsignal(signum) not in (fresh, None):
                signal.signal(signum, fresh)
        except (OSError, ValueError):  # one Python cannot set (a real-time signal the C library keeps)
            pass


def _child(
    main: Callable[[list[str]], Any],
    args: list[str],
    cwd: str,
    env: dict[str, str],
    out: str | None,
    err: str | None,
    append: bool,
    new_session: bool,
    forked_here: bool = False,
) -> None:
    """In the forked process: ``main(args)`` in ``cwd`` with ``env`` (the working directory first on sys.path, as
    ``python -m`` puts it), its exit code the process's."""
    if forked_here:
        _fresh_signals()
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(
        0, os.getcwd()
    )  # first, as Python puts it (the server has the starting process's sys.path after it)
    _stdio(out, err, append)
    multiprocessing.set_start_method(None, force=True)  # the platform's default, as in a fresh process
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():  # OpenMP read it when the server imported torch: say it again
        import torch

        torch.set_num_threads(int(threads))
    code = 0
    try:
        main(list(args))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a traceback and exit code 1, as Python gives
        import traceback

        traceback.print_exc()
        code = 1
    raise SystemExit(code)  # through multiprocessing's own exit, which flushes and releases what it holds


def start(
    program: Program,
    args: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    out: Path | None = None,
    err: Path | None = None,
    append: bool = False,
    new_session: bool = False,
) -> Started:
    """Start ``program.main(args)`` in a process forked from its server (started, and its imports paid, on first
    use), or from this process where it has them and runs one thread (:func:`forks_itself`).

    Its stdout goes to ``out`` and its stderr to ``err`` (to ``out`` when None), appended to with ``append``.
    ``new_session`` makes it the leader of a session of its own, as ``start_new_session`` does for Popen."""
    here = forks_itself()
    context = multiprocessing.get_context("fork") if here else _server(program)
    process = context.Process(
        target=_child,
        args=(
            program.main,
            list(args),
            str(cwd or os.getcwd()),
            dict(os.environ if env is None else env),
            None if out is None else str(out),
            None if err is None else str(err),
            append,
            new_session,
            here,
        ),
    )
    process.start()
    started = Started(process)
    started.args = list(args)
    return started


__all__ = ["Program", "Started", "forked_from_server", "forks_itself", "mark_preloaded", "start", "start_server"]
