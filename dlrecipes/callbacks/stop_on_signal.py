"""Stop on a signal with a checkpoint: SIGTERM (preemption, ``scancel``, the end of a time
slot), SIGUSR1 (SLURM's early warning, ``--signal=USR1@120``), SIGINT (Ctrl-C) and SIGHUP (the
terminal or ssh session closed).

The handler only records the signal.  Every rank learns that some rank was signalled through a
host-side reduction that runs in the background: started at one batch's end and read at the
next one's, so no step waits for it and ranks signalled at different moments still stop at the
same batch (with one process, at the batch the signal arrives in).  Then the run writes a
complete checkpoint through the run's atomic saver (unless it has just written one for that
batch), and :class:`Preempted` ends it with one line and exit code 75 (``EX_TEMPFAIL``: try again
later); ``--resume`` continues from that checkpoint.  A second Ctrl-C interrupts at once.

SIGHUP is left alone when it was ignored when training started (``nohup``), unless ``dlrecipes
launch`` passes it on (:mod:`dlrecipes.runtime.hangup`).  A hangup also points standard output and
error that are a terminal at ``/dev/null``: a closed terminal answers every write with an error,
and the run still has a checkpoint to write.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

from composer.core import Callback, State
from composer.loggers import Logger

from dlrecipes.core.distributed import requested_stop
from dlrecipes.errors import UserError
from dlrecipes.runtime.hangup import hangup_stops, leave_closed_terminal, terminal_fds

if TYPE_CHECKING:
    from composer.callbacks import CheckpointSaver

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
REQUESTED = 1000  # reduced beside a signal's number (larger than any): a rank asked the run to stop (request_stop)


def _handled() -> tuple[int, ...]:
    """The signals that stop the run: :data:`SIGNALS`, SIGHUP only where it should (:func:`hangup_stops`)."""
    return tuple(s for s in SIGNALS if s != signal.SIGHUP or hangup_stops())


class Preempted(UserError):
    """Training stopped on a signal after writing a checkpoint."""

    exit_code = 75
    prefix = ""  # a clean stop, not an error


class StoppedWithAnotherRank(UserError):
    """Another rank asked the run to stop (its own line says why); this rank stopped at the same batch."""

    exit_code = 1


def _stop_as_asked(batch: int) -> None:
    """The stop a rank asked for (:func:`~dlrecipes.core.distributed.request_stop`), at the batch every rank agreed
    on: the asking rank's own error, the others' one line."""
    asked = requested_stop()
    if asked is not None:
        raise asked
    raise StoppedWithAnotherRank(
        f"another rank of this training stopped it after batch {batch} (that rank's line says why); this rank "
        "stopped with it"
    )


class StopOnSignal(Callback):
    def __init__(self, saver: CheckpointSaver | None = None):
        self.saver = saver
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._terminal: list[int] = []  # stdout/stderr that were a terminal when the handlers went in
        self._host: Any = None
        self._pending: Any = None  # the reduction started at the previous batch's end

    def _record(self, signum: int, frame: Any) -> None:
        self.received = signum
        if signum == signal.SIGHUP:
            leave_closed_terminal(self._terminal)
        if signum == signal.SIGINT:  # a second Ctrl-C interrupts at once
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def fit_start(self, state: State, logger: Logger) -> None:
        from dlrecipes.core.distributed import HostReducer

        requested_stop(clear=True)

        self._host, self._pending = HostReducer(), None
        if threading.current_thread() is threading.main_thread():
            self._terminal = terminal_fds()
            self._previous = {s: signal.signal(s, self._record) for s in _handled()}

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _any_rank_signalled(self) -> int:
        """The signal any rank had received by the previous batch's end (this one's, with one process)."""
        mine = REQUESTED if requested_stop() is not None else (self.received or 0)
        if self._host.world_size == 1:
            return mine
        pending, self._pending = self._pending, self._host.start([float(mine)], "MAX")
        return int(pending.wait()[0]) if pending is not None else 0

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        received = self._any_rank_signalled()
        if not received:
            return
        self._finish_pending()
        self._restore()
        if received >= REQUESTED:
            _stop_as_asked(int(state.timestamp.batch))
        batch = int(state.timestamp.batch)
        saved = None
        if self.saver is not None:
            if self.saver.last_checkpoint_batch is None or int(self.saver.last_checkpoint_batch) != batch:
                self.saver._save_checkpoint(state, logger)
            saved = self.saver.saved_checkpoints[-1] if self.saver.saved_checkpoints else None
        name = signal.Signals(received).name
        if saved:
            where = f"checkpoint {saved}; continue with --resume"
        else:
            where = (
                "checkpoint written by rank 0" if self.saver is not None else "no checkpoint (checkpoint.save is off)"
            )
        raise Preempted(f"stopped by {name} after batch {batch} (epoch {int(state.timestamp.epoch) + 1}): {where}")

    def fit_end(self, state: State, logger: Logger) -> None:
        self._finish_pending()  # every rank started it at the last batch: no reduction left in flight
        self._restore()

    def close(self, state: State, logger: Logger) -> None:
        self._pending = None  # after an error another rank may never answer it
        self._restore()
