"""SIGHUP, the signal of a closed terminal or ssh session: a stop like SIGTERM, unless ``nohup`` asked otherwise.

Kept free of torch and Composer: ``dlrecipes launch`` uses it before any training process starts.
"""

from __future__ import annotations

import os
import signal

# set to "1" by `dlrecipes launch` for the ranks it starts: it starts them with SIGHUP ignored, so that launch
# survives a hangup to wait for them, and passes the signal on to the ranks itself
HANGUP_STOPS = "DLRECIPES_HANGUP_STOPS"


def hangup_stops() -> bool:
    """Whether SIGHUP should stop this process's run: not when it is ignored (``nohup``), unless launch passes it on."""
    return signal.getsignal(signal.SIGHUP) != signal.SIG_IGN or os.environ.get(HANGUP_STOPS) == "1"


def terminal_fds() -> list[int]:
    """Standard output and error where they are a terminal: taken when handlers are installed, since after a
    hangup the terminal no longer answers as one."""
    return [fd for fd in (1, 2) if os.isatty(fd)]


def leave_closed_terminal(fds: list[int]) -> None:
    """Those of ``fds`` (:func:`terminal_fds`) that are no terminal any more, the terminal having hung up (every
    write would fail with EIO), now go to ``/dev/null``: the run still has a checkpoint to write, a line to leave
    in its log and an exit code to give.  A SIGHUP sent by hand, the terminal still open, changes nothing."""
    for fd in fds:
        if not os.isatty(fd):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
