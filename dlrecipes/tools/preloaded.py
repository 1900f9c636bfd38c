"""``python -m dlrecipes ARGS`` as a process forked from one that has imported torch, Composer and dlrecipes once.

A new Python spends 5-10 s of CPU importing torch and Composer before it trains anything; for a sweep of short
runs on a CPU that is most of each point. Here the imports are paid once, by a server process
(``multiprocessing``'s forkserver), and each training is a process forked from it: a process of its own (pid,
exit code, signals, session, environment, working directory, output file), started in milliseconds.

Only where no GPU is used: CUDA cannot be used in a process forked from one that has initialised it, and a
GPU run's start-up is small beside its training, so GPU runs start a fresh Python as before.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any, Optional

# what the server imports once: what a training imports, its caches filled (dlrecipes/tools/preload_server.py)
PRELOAD = ("dlrecipes.tools.preload_server",)

_CONTEXT: Any = None


def _server() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(list(PRELOAD))
    return _CONTEXT


def start_server() -> None:
    """Start the server now (its imports go on in the background); ``start`` would otherwise start it and wait."""
    from multiprocessing import forkserver

    _server()
    forkserver.ensure_running()


class Started:
    """A started training, with the part of ``subprocess.Popen``'s interface a caller needs."""

    def __init__(self, process: Any):
        self._process = process
        self.pid: int = process.pid
        self.args: list[str] = []

    @property
    def returncode(self) -> Optional[int]:
        return self._process.exitcode

    def poll(self) -> Optional[int]:
        return self._process.exitcode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
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


def _stdio(out: Optional[str], err: Optional[str], append: bool, terminal: Any) -> None:
    """stdout and stderr to the files (stderr to stdout's when ``err`` is None), or all three to ``terminal``;
    unbuffered, as PYTHONUNBUFFERED=1 makes them."""
    if terminal is not None:
        fd = terminal.detach()
        for std in (0, 1, 2):
            os.dup2(fd, std)
        os.close(fd)
    elif out is not None:
        mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        os.dup2(os.open(out, mode), 1)
        os.dup2(os.open(err, mode) if err else 1, 2)
    sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True,
                                               encoding="utf-8", errors="backslashreplace") for fd in (1, 2))


def _child(module: str, args: list[str], cwd: str, env: dict[str, str], out: Optional[str], err: Optional[str],
           append: bool, terminal: Any, new_session: bool) -> None:
    """In the forked process: what ``python -m MODULE ARGS`` does in ``cwd`` with ``env``."""
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, os.getcwd())  # as ``python -m`` does (the server has the starting process's sys.path after it)
    _stdio(out, err, append, terminal)
    multiprocessing.set_start_method(None, force=True)  # the platform's default, as in a fresh process
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():  # OpenMP read it when the server imported torch: say it again
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = [module, *args]
    code = 0
    try:
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a traceback and exit code 1, as Python gives
        import traceback

        traceback.print_exc()
        code = 1
    raise SystemExit(code)  # through multiprocessing's own exit, which flushes and releases what it holds


def start(args: list[str], *, cwd: Optional[Path] = None, env: Optional[dict[str, str]] = None,
          out: Optional[Path] = None, err: Optional[Path] = None, append: bool = False,
          terminal: Optional[int] = None, new_session: bool = False, module: str = "dlrecipes") -> Started:
    """Start ``python -m MODULE ARGS`` forked from the server (started, and its imports paid, on first use).

    Its stdout goes to ``out`` and its stderr to ``err`` (to ``out`` when None), appended to with ``append``;
    or stdin, stdout and stderr to the file descriptor ``terminal`` (a pseudo-terminal's, handed over).
    ``new_session`` makes it the leader of a session of its own, as ``start_new_session`` does for Popen."""
    from multiprocessing.reduction import DupFd

    handed = DupFd(terminal) if terminal is not None else None  # sent to the server with the request
    process = _server().Process(target=_child, args=(
        module, list(args), str(cwd or os.getcwd()), dict(os.environ if env is None else env),
        None if out is None else str(out), None if err is None else str(err), append, handed, new_session))
    process.start()
    started = Started(process)
    started.args = [module, *args]
    return started


__all__ = ["PRELOAD", "Started", "start", "start_server"]
