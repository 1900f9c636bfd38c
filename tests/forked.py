"""Fresh ``dlrecipes`` processes without the imports, for tests: each is forked from a server that has imported
torch, Composer and dlrecipes once (dlrecipes/runtime/fork_server.py, what sweeps use on a CPU), so it is a real
process -- its own pid, exit code, signals, output files or terminal, plugins and working directory, killable
with SIGKILL -- without the 5-10 s of imports a new Python pays on a 2-core machine.

Where the process is not the point, ``run_cli`` runs the CLI in the test's own process; where the way Python
starts is (``python -m`` putting the working directory on sys.path, the console script), a test runs the real
executable. ``DLRECIPES_TEST_SUBPROCESS=1`` makes each of ``run_cli``'s calls a real executable.

What only tests (and benchmarks) need of the server is here, not in the package: a module other than dlrecipes or a
script run forked (:func:`program`), a command run to its end with its output captured (:func:`run_forked`), a
file's text so far, and a pseudo-terminal handed over.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlrecipes.api import FORKED
from dlrecipes.runtime import fork_server
from dlrecipes.runtime.fork_server import Program, Started

FORK = "DLRECIPES_TEST_FORK"  # =0: a new Python each (what scripts/coverage.sh sets: coverage.py follows those)


def start(
    args: list[str],
    cwd: Path,
    out: Path | None = None,
    err: Path | None = None,
    env: dict[str, str] | None = None,
    terminal: int | None = None,
    module: str = "dlrecipes",
) -> Started | subprocess.Popen:
    """``python -m MODULE ARGS`` (``dlrecipes ARGS`` by default; ``python MODULE ARGS`` for a ``.py`` file) forked
    from the server: a Popen-like handle
    (``pid``, ``poll()``, ``wait()``, ``returncode``, ``send_signal()``, ``kill()``); its output to the files
    ``out`` and ``err``, or stdin, stdout and stderr to the file descriptor ``terminal``. With
    DLRECIPES_TEST_FORK=0, the same command in a new Python (a ``subprocess.Popen``)."""
    env = dict(os.environ) if env is None else env
    if os.environ.get(FORK) == "0":
        if terminal is not None:
            streams = {"stdin": terminal, "stdout": terminal, "stderr": terminal}
        else:
            streams = {
                "stdout": open(out, "w") if out else None,  # stderr to stdout's file without its own, as forked
                "stderr": open(err, "w") if err else (subprocess.STDOUT if out else None),
            }
        return subprocess.Popen(
            [sys.executable, *_python_args(module), *args], cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"}, **streams
        )
    setup = None
    if terminal is not None:  # handed over through the server with the request
        import functools
        from multiprocessing.reduction import DupFd

        setup = functools.partial(_on_terminal, DupFd(terminal))
    return fork_server.start(program(module, setup), args, cwd=cwd, env=env, out=out, err=err)


def program(module: str = "dlrecipes", setup: Callable[[], None] | None = None) -> Program:
    """``python -m MODULE`` (``python MODULE`` for a ``.py`` file) as a program forked from the CLI's server, after
    ``setup()`` where given (a picklable callable: it goes through the server with the request)."""
    if module == "dlrecipes" and setup is None:
        return FORKED
    return Program(main=functools.partial(run_module, module, setup), preload=FORKED.preload)


def run_module(module: str, setup: Callable[[], None] | None, args: list[str]) -> None:
    """In the forked process: ``setup()``, then what ``python -m MODULE ARGS`` (``python MODULE ARGS``) does."""
    import runpy

    script = module.endswith(".py")
    if script:  # python FILE puts the file's folder first on sys.path, not the working directory
        sys.path[0] = os.path.dirname(os.path.abspath(module))
    if setup is not None:
        setup()
    sys.argv = [module, *args]
    if script:
        runpy.run_path(module, run_name="__main__")
    else:
        runpy.run_module(module, run_name="__main__", alter_sys=True)


def _on_terminal(handed: Any) -> None:
    """In the forked process, before its output is set up: stdin, stdout and stderr to the terminal handed over."""
    fd = handed.detach()
    for std in (0, 1, 2):
        os.dup2(fd, std)
    os.close(fd)


def run(
    args: list[str], cwd: Path, timeout: int = 300, env: dict[str, str] | None = None, module: str = "dlrecipes"
) -> subprocess.CompletedProcess:
    """``dlrecipes ARGS`` (``python -m MODULE ARGS``, ``python MODULE ARGS`` for a ``.py`` file) in a forked process,
    to its end: like ``subprocess.run(capture_output=True)``. With DLRECIPES_TEST_FORK=0, in a new Python."""
    if os.environ.get(FORK) == "0":
        env = dict(os.environ) if env is None else env
        return subprocess.run(
            [sys.executable, *_python_args(module), *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
    return run_forked(args, cwd=cwd, env=env, timeout=timeout, module=module)


def run_forked(
    args: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    module: str = "dlrecipes",
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` forked from the server (whatever DLRECIPES_TEST_FORK says) to its end, as
    ``subprocess.run(capture_output=True, text=True)`` gives it: the exit code, stdout and stderr; past ``timeout``
    seconds it is killed and ``subprocess.TimeoutExpired`` raised."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dlrecipes-forked-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        child = fork_server.start(program(module), args, cwd=cwd, env=env, out=out, err=err)
        if child.wait(timeout) is None:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired([module, *args], timeout or 0, _read(out), _read(err))
        return subprocess.CompletedProcess([module, *args], child.returncode, _read(out), _read(err))


def _read(path: Path) -> str:
    """A file's text so far ("" before it exists)."""
    return path.read_text(errors="replace") if path.is_file() else ""


def _python_args(module: str) -> list[str]:
    return [module] if module.endswith(".py") else ["-m", module]
