"""``dlrecipes launch``: a checked front end to Composer's launcher.

Bad combinations are refused before any process starts; then Composer's launcher runs one
training process per device (``dlrecipes/cli.py train ...``) with the distributed environment.
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Optional

from dlrecipes.errors import UserError


def launcher_command(
    recipe: str, overrides: list[str], nproc: int, nodes: int = 1, node_rank: int = 0,
    master_addr: Optional[str] = None, master_port: Optional[int] = None, extra: tuple[str, ...] = (),
) -> list[str]:
    if nproc < 1:
        raise UserError(f"-n/--nproc: at least 1 process per node, got {nproc}")
    if nodes < 1:
        raise UserError(f"--nodes: at least 1, got {nodes}")
    if not 0 <= node_rank < nodes:
        raise UserError(f"--node-rank: must be 0..{nodes - 1} for --nodes {nodes}, got {node_rank}")
    if nodes > 1 and (master_addr is None or master_port is None):
        raise UserError("--master-addr and --master-port: required with --nodes > 1 (node 0's address and a free port)")
    if master_port is not None and not 1024 <= master_port <= 65535:
        raise UserError(f"--master-port: expected 1024..65535, got {master_port}")
    launcher = shutil.which("composer") or str(Path(sys.executable).parent / "composer")
    if not Path(launcher).exists():
        raise UserError("Composer's launcher `composer` is not on PATH (it comes with `pip install mosaicml`)")
    cmd = [launcher, "-n", str(nproc), "--world_size", str(nproc * nodes), "--node_rank", str(node_rank)]
    if master_addr is not None:
        cmd += ["--master_addr", master_addr]
    if master_port is not None:
        cmd += ["--master_port", str(master_port)]
    # as a module: running dlrecipes/cli.py as a script would put dlrecipes/ first on sys.path,
    # where a module named like a standard-library one would hide it
    return [*cmd, "--module_mode", "dlrecipes", "train", recipe, *overrides, *extra]


def gloo_environment(master_addr: Optional[str], master_port: Optional[int], world_size: int) -> dict[str, str]:
    """The environment for the launcher: with ``GLOO_SOCKET_IFNAME`` set to the interface that reaches the master
    address when the run spans hosts and the user has not set it (:func:`~dlrecipes.core.distributed.choose_gloo_interface`)."""
    import os

    from dlrecipes.core.distributed import CHOSEN_MARK, choose_gloo_interface

    env = dict(os.environ)
    if master_addr:
        probe = {**env, "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port or 29500),
                 "WORLD_SIZE": str(world_size)}
        chosen = choose_gloo_interface(probe)
        if chosen and not env.get("GLOO_SOCKET_IFNAME"):
            env["GLOO_SOCKET_IFNAME"], env[CHOSEN_MARK] = chosen, chosen
            print(f"launch: gloo connects through {chosen}, the interface that reaches {master_addr} "
                  "(set GLOO_SOCKET_IFNAME to choose another)", file=sys.stderr)
    return env


def run_forwarding_signals(cmd: list[str], env: Optional[dict[str, str]] = None) -> int:
    """Run Composer's launcher; SIGTERM/SIGUSR1/SIGHUP reach the training processes, not the launcher.

    A cluster sends them to the whole job (SLURM's ``--signal``, ``scancel``, preemption), a closed
    terminal or ssh session sends SIGHUP to all it started: the launcher would die at once and the
    job step end before the ranks finished their checkpoint.  So the launcher starts with them
    ignored (each rank installs its own handlers when training starts; SIGHUP's, because
    :data:`~dlrecipes.core.hangup.HANGUP_STOPS` says so) and a signal that reaches this
    process is passed on to every training process.  Under ``nohup`` SIGHUP stays ignored everywhere.
    """
    import os
    import signal
    import subprocess

    import psutil

    from dlrecipes.core.hangup import HANGUP_STOPS, hangup_stops, leave_closed_terminal, terminal_fds

    forwarded = (signal.SIGTERM, signal.SIGUSR1)
    if hangup_stops():  # not under nohup
        forwarded += (signal.SIGHUP,)
        env = {**(os.environ if env is None else env), HANGUP_STOPS: "1"}
    # ignored while the launcher starts (it inherits that) and until forward() takes over: never the default action,
    # which would end this process and leave the launcher behind
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in forwarded}
    try:
        launcher = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
    except BaseException:
        for s, handler in previous.items():
            signal.signal(s, handler)
        raise
    relay, clean_stop = _relay_stderr(launcher.stderr)
    terminal = terminal_fds()
    held = _HeldSignals()

    def forward(signum, frame):
        if signum == signal.SIGHUP:
            leave_closed_terminal(terminal)  # the ranks' stop lines still reach the relay, which must not fail
        for child in psutil.Process(launcher.pid).children(recursive=True):
            held.send(child.pid, signum)

    for s in forwarded:
        signal.signal(s, forward)
    try:
        code = launcher.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the ranks and the launcher too; let them finish
        code = launcher.wait()
    relay.join(timeout=5)
    return _job_exit_code(code, clean_stop.is_set())


def _signal_mask(pid: int, field: str) -> Optional[int]:
    """The signal mask ``field`` (SigIgn: ignored, SigCgt: caught) of process ``pid`` from /proc, or None where it
    cannot be read (the process has ended; not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    return None


class _HeldSignals:
    """A signal for a training process that still ignores it is held, and sent once the process catches it.

    The launcher and the ranks start with the forwarded signals ignored; each rank installs its handlers only when
    training starts, seconds of imports and building later. A signal sent in between was lost: SLURM's warning
    signal (``--signal=USR1@120``) in a job's first seconds, then the time limit ended the job with no requeue. A
    process that catches the signal, or does not ignore it, gets it at once, as before."""

    def __init__(self, poll: float = 0.2):
        self._held: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._poll = poll

    def send(self, pid: int, signum: int) -> None:
        ignored = _signal_mask(pid, "SigIgn")
        if ignored is not None and ignored >> (signum - 1) & 1:
            with self._lock:
                first = not self._held
                self._held.add((pid, signum))
            if first:
                threading.Thread(target=self._deliver, daemon=True).start()
            return
        _kill(pid, signum)

    def _deliver(self) -> None:
        import time

        while True:
            time.sleep(self._poll)
            with self._lock:
                for pid, signum in list(self._held):
                    caught = _signal_mask(pid, "SigCgt")
                    if caught is None:  # ended
                        self._held.discard((pid, signum))
                    elif caught >> (signum - 1) & 1:
                        _kill(pid, signum)
                        self._held.discard((pid, signum))
                if not self._held:
                    return


def _kill(pid: int, signum: int) -> None:
    import os

    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended in between
        pass


def _job_exit_code(code: int, clean_stop: bool) -> int:
    """The launcher's exit code, but 75 (stopped with a checkpoint) where a rank stopped cleanly and the launcher
    reports that or a rank it ended with SIGTERM (``sys.exit(-15)``: 241)."""
    return 75 if clean_stop and code in (75, 256 - 15) else code


# Composer's launcher reports every rank that exits non-zero as "crashed", also a rank that stopped cleanly on a
# signal with a checkpoint (exit 75): those lines are left out (the rank said what happened in one line).
_CLEAN_STOP = re.compile(r"(Rank \d+ crashed with exit code 75\.|Global rank \d+ \(PID \d+\) exited with code 75)$")
# torch's rendezvous store warns, once per connection, when the connecting host's address has no name (no reverse
# DNS for it: common on cluster networks, and harmless: the connection is made); it is left out too.
_NAMELESS_PEER = re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved\. err=-?\d+$")
# After one rank's clean stop the launcher ends the others with SIGTERM; a rank that has written its part and is
# exiting then ends as killed by it (Python restores the default handlers as it exits): left out after a clean stop.
_ENDED_BY_LAUNCHER = re.compile(r"(Rank \d+ crashed with exit code -15\.|Global rank \d+ \(PID \d+\) exited with code -15)$")


def _relay_stderr(stream: Any) -> tuple[threading.Thread, threading.Event]:
    """Copy the launcher's standard error to ours as it comes, without its reports of clean stops (and of the
    ranks it then ended) and torch's warnings about peers' addresses without a host name; the event says whether
    a rank stopped cleanly."""
    clean_stop = threading.Event()

    def copy() -> None:
        for line in stream:
            text = line.rstrip("\n")
            if _CLEAN_STOP.search(text):
                clean_stop.set()
            elif not (_NAMELESS_PEER.search(text) or (clean_stop.is_set() and _ENDED_BY_LAUNCHER.search(text))):
                sys.stderr.write(line)
                sys.stderr.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread, clean_stop
