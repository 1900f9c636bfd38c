"""Fresh ``dlrecipes`` processes without the imports: each is forked from a server that has imported torch,
Composer and dlrecipes once (``multiprocessing``'s forkserver), so it is a real process -- its own pid, exit
code, signals, output files, plugins and working directory, killable with SIGKILL -- without the 5-10 s of
imports a new Python pays on a 2-core machine.

Where the process is not the point, ``run_cli`` runs the CLI in the test's own process; where the way Python
starts is (``python -m`` putting the working directory on sys.path, the console script), a test runs the real
executable. ``DLRECIPES_TEST_SUBPROCESS=1`` makes each of ``run_cli``'s calls a real executable.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

_SERVER = None


def server():
    """The forkserver context, started on first use (once per test process)."""
    global _SERVER
    if _SERVER is None:
        _SERVER = multiprocessing.get_context("forkserver")
        from dlrecipes.plugins import BUILTIN_MODULES

        _SERVER.set_forkserver_preload(["torch", "composer", "timm", "torchvision", "matplotlib", "dlrecipes.cli",
                                        "dlrecipes.api", "dlrecipes.train", *BUILTIN_MODULES])
    return _SERVER


def _child(module: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str, terminal) -> None:
    """In the forked process: what ``python -m MODULE ARGS`` does in ``cwd`` with ``env``, unbuffered."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if terminal is not None:  # stdin, stdout and stderr on it
        fd = terminal.detach()
        for std in (0, 1, 2):
            os.dup2(fd, std)
        os.close(fd)
    else:
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True,
                                               encoding="utf-8", errors="backslashreplace") for fd in (1, 2))
    sys.argv = [str(Path(sys.prefix) / "bin" / "dlrecipes") if module == "dlrecipes" else module, *args]
    multiprocessing.set_start_method(None, force=True)  # the platform's default, as in a fresh process
    threads = env.get("OMP_NUM_THREADS")
    if threads:  # read by OpenMP when torch was imported (in the server): say it again
        import torch

        torch.set_num_threads(int(threads))
    code = 0
    try:
        if module == "dlrecipes":
            from dlrecipes.cli import main

            main(args)
        else:
            import runpy

            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a traceback, as Python prints it
        import traceback

        traceback.print_exc()
        code = 1
    raise SystemExit(code)  # through multiprocessing's own exit, which releases the command's semaphores


def start(args: list[str], cwd: Path, out: Optional[Path] = None, err: Optional[Path] = None,
          env: Optional[dict[str, str]] = None, terminal: Optional[int] = None, module: str = "dlrecipes"):
    """Start ``dlrecipes ARGS`` (or ``python -m MODULE ARGS``) forked from the server; a ``multiprocessing``
    Process (``pid``, ``exitcode``, ``kill()``, ``join()``), its output going to the files ``out`` and ``err``,
    or its stdin, stdout and stderr to the file descriptor ``terminal`` (a pseudo-terminal's), handed over."""
    from multiprocessing.reduction import DupFd

    handed = DupFd(terminal) if terminal is not None else None  # sent to the server with the process
    child = server().Process(target=_child, args=(module, list(args), str(cwd), dict(env or os.environ), str(out),
                                                  str(err), handed))
    child.start()
    return child


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def run(args: list[str], cwd: Path, timeout: int = 300, env: Optional[dict[str, str]] = None
        ) -> subprocess.CompletedProcess:
    """``dlrecipes ARGS`` in a forked process, to its end: like ``subprocess.run(capture_output=True)``."""
    with tempfile.TemporaryDirectory(prefix="dlrecipes-forked-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        child = start(args, cwd, out, err, env)
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["dlrecipes", *args], timeout, _read(out), _read(err))
        return subprocess.CompletedProcess(["dlrecipes", *args], child.exitcode, _read(out), _read(err))
