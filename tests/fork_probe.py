"""A process that starts a training-like process of its own through dlrecipes/runtime/fork_server.py, as a sweep does,
for test_sweep.py's test of a sweep that was itself forked from the server.

    python -m tests.fork_probe driver OUT_DIR    (forked from the server by the test)

The driver sets signal handling of its own (as a sweep does), starts ``tests.fork_probe child OUT_DIR`` and writes
``OUT_DIR/driver.json``: its pid, the child's exit code, the processes still its children once the child has
ended (a second server would be one), and whether it would fork itself with a second thread running. The child
writes ``OUT_DIR/child.json``: its parent's pid and the signal handling it started with.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path


def driver(out: Path) -> None:
    import psutil

    from dlrecipes.runtime import fork_server
    from tests.forked import program

    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    child = fork_server.start(program("tests.fork_probe"), ["child", str(out)], cwd=Path.cwd(), out=out / "child.log")
    code = child.wait(120)
    left = [p.cmdline() for p in psutil.Process().children()]
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    with_a_thread = fork_server.forks_itself()
    stop.set()
    thread.join()
    (out / "driver.json").write_text(
        json.dumps(
            {"pid": os.getpid(), "code": code, "children_left": left, "forks_itself_with_a_thread": with_a_thread}
        )
    )


def child(out: Path) -> None:
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in ("SIGTERM", "SIGINT", "SIGPIPE")}
    (out / "child.json").write_text(
        json.dumps(
            {
                "ppid": os.getppid(),
                "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                "handlers": {
                    name: h.name if isinstance(h, signal.Handlers) else h.__name__ for name, h in handlers.items()
                },
            }
        )
    )


if __name__ == "__main__":
    (driver if sys.argv[1] == "driver" else child)(Path(sys.argv[2]))
