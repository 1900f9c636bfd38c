"""SIGHUP, the signal of a closed terminal or ssh session: a stop like SIGTERM, unless ``nohup`` asked otherwise.

Kept free of torch and Composer: ``dlrecipes launch`` uses it before any training process starts.
"""

from __future__ import annotations

import os
import signal

# set to "1" by `dlrecipes launch` for the processes it starts: it starts Composer's launcher (and so the ranks) with
# SIGHUP ignored, so that the launcher survives a hangup, and passes the signal on to the ranks itself
HANGUP_STOPS = "DLRECIPES_HANGUP_STOPS"


def hangup_stops() -> bool:
    """Whether SIGHUP should stop this process's run: not when it is ignored (``nohup``), unless launch passes it on."""
    return signal.getsignal(signal.SIGHUP) != signal.SIG_IGN or os.environ.get(HANGUP_STOPS) == "1"


def detach_from_terminal() -> None:
    """Standard output and error to ``/dev/null`` where they are a terminal: after a hangup it answers every
    write with an error, and the run still has a checkpoint to write and a line to leave in its log."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
