"""``dlrecipes launch``: the setup checked, then one training process per device, started here.

Bad combinations are refused before any process starts. Each rank is ``python -m dlrecipes train ...`` with the
environment Composer's launcher gives its ranks (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
MASTER_ADDR, MASTER_PORT; tests/test_distributed.py compares it with Composer's own), so ``composer -n N cli.py
train ...`` starts the same ranks. Started from here, not through Composer's launcher: that is a Python of its own
importing all of Composer (7-10 s of CPU on 2 cores) before the first rank starts, and it reports a rank's clean
stop as a crash. Like Composer's launcher: rank 0 writes to this terminal, the others to files shown when they
fail (each rank's log is also in the run directory), and when one rank fails the others get SIGTERM, then
SIGKILL 30 s later. Unlike it: a rank that stops cleanly on a signal (exit 75) is not a failure, and the others,
stopping at the same batch, are given those 30 s to finish before SIGTERM.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from dlrecipes.errors import UserError

STOPPED = 75  # a rank that stopped cleanly on a signal, with a checkpoint (dlrecipes train's exit code)
GRACE_S = 30.0  # Composer's launcher's wait between SIGTERM and SIGKILL, and here also after a clean stop


@dataclass(frozen=True)
class RankPlan:
    """The training processes of this node: ``python -m dlrecipes COMMAND...`` ``nproc`` times."""

    command: tuple[str, ...]
    nproc: int
    world_size: int
    node_rank: int
    master_addr: str | None = None
    master_port: int | None = None

    def resolved(self, env: dict[str, str]) -> RankPlan:
        """The master's address and port as Composer's launcher settles them: given, else MASTER_ADDR and
        MASTER_PORT from the environment, else (one node) 127.0.0.1 and a free port."""
        addr = self.master_addr or env.get("MASTER_ADDR") or "127.0.0.1"
        port = self.master_port or int(env.get("MASTER_PORT") or 0) or _free_port()
        return replace(self, master_addr=addr, master_port=port)

    def environment(self, env: dict[str, str], local_rank: int) -> dict[str, str]:
        """``env`` with rank ``local_rank``'s distributed variables (after :meth:`resolved`)."""
        return {
            **env,
            "RANK": str(self.node_rank * self.nproc + local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": str(self.master_addr),
            "MASTER_PORT": str(self.master_port),
            "PYTHONUNBUFFERED": "1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        }


def plan_ranks(
    command: tuple[str, ...],
    nproc: int,
    nodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> RankPlan:
    """Each rank of this node runs ``python -m dlrecipes COMMAND...`` (``("train", RECIPE, *overrides)``, or
    ``("train-request", FILE)``); the launcher's options checked, one line each."""
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
    return RankPlan(tuple(command), nproc, nproc * nodes, node_rank, master_addr, master_port)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_environment(master_addr: str | None, master_port: int | None, world_size: int) -> dict[str, str]:
    """The environment for the ranks: with ``GLOO_SOCKET_IFNAME`` set to the interface that reaches the master
    address when the run spans hosts and the user has not set it
    (:func:`~dlrecipes.core.distributed.choose_gloo_interface`)."""
    import os

    from dlrecipes.core.distributed import CHOSEN_MARK, choose_gloo_interface

    env = dict(os.environ)
    if master_addr:
        probe = {
            **env,
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port or 29500),
            "WORLD_SIZE": str(world_size),
        }
        chosen = choose_gloo_interface(probe)
        if chosen and not env.get("GLOO_SOCKET_IFNAME"):
            env["GLOO_SOCKET_IFNAME"], env[CHOSEN_MARK] = chosen, chosen
            print(
                f"launch: gloo connects through {chosen}, the interface that reaches {master_addr} "
                "(set GLOO_SOCKET_IFNAME to choose another)",
                file=sys.stderr,
            )
    return env


def _signal_mask(pid: int, field: str) -> int | None:
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
    process that catches the signal, or does not ignore it, gets it at once."""

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


class _Rank:
    def __init__(self, rank: int, process: Any, log: str | None):
        self.rank, self.process, self.log = rank, process, log  # log: its output's file (not rank 0's: the terminal)
        self.ended_at: float | None = None  # when this process saw it end
        self.ended_by_launch = False  # SIGTERM or SIGKILL from here, after another rank's failure or clean stop

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return code


def run_ranks(plan: RankPlan, env: dict[str, str] | None = None) -> int:
    """Start the ranks of ``plan`` and wait for them; SIGTERM/SIGUSR1/SIGHUP reaching this process reach each of them.

    A cluster sends them to the whole job (SLURM's ``--signal``, ``scancel``, preemption), a closed terminal or
    ssh session sends SIGHUP to all it started: this process must outlive them so that the ranks can finish their
    checkpoint and the job step its exit code. So it ignores them while the ranks start (which inherit that: each
    installs its handlers when training starts; SIGHUP's, because :data:`~dlrecipes.runtime.hangup.HANGUP_STOPS`
    says so), then passes each on to every rank (held for a rank until it catches it: :class:`_HeldSignals`).
    Under ``nohup`` SIGHUP stays ignored everywhere. Returns the job's exit code (:func:`_job_exit_code`).
    """
    import os
    import signal
    import tempfile

    from dlrecipes.runtime.hangup import HANGUP_STOPS, hangup_stops, leave_closed_terminal, terminal_fds

    env = dict(os.environ if env is None else env)
    forwarded = (signal.SIGTERM, signal.SIGUSR1)
    if hangup_stops():  # not under nohup
        forwarded += (signal.SIGHUP,)
        env[HANGUP_STOPS] = "1"
    plan = plan.resolved(env)
    # ignored until forward() takes over: never the default action, which would end this process and leave the
    # ranks without the process that waits for them
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in forwarded}
    # Ctrl-C reaches the ranks from the terminal; here it must be a KeyboardInterrupt that the wait below lets pass,
    # not the sys.exit(130) of the handler Composer's engine installs when it is imported (a bucket's store, a plugin)
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="dlrecipes-launch-") as logs:  # the other ranks' output, reported
        ranks: list[_Rank] = []
        relays: list[threading.Thread] = []
        try:
            _start_ranks(plan, env, logs, ranks, relays)
            terminal = terminal_fds()
            held = _HeldSignals()

            def forward(signum, frame):
                if signum == signal.SIGHUP:
                    leave_closed_terminal(terminal)  # the ranks' stop lines still reach the relay, which must not fail
                for each in ranks:
                    held.send(each.process.pid, signum)

            for s in forwarded:
                signal.signal(s, forward)
            _supervise(ranks)
        finally:
            _end([r for r in ranks if r.poll() is None], signal.SIGKILL)  # only where the above failed
            for each in ranks:
                each.process.wait()
                each.poll()
            for relay in relays:
                relay.join(timeout=5)
            for s, handler in previous.items():
                signal.signal(s, handler)
        _report(ranks)
    ended = sorted(ranks, key=lambda r: (r.ended_at or 0.0, r.rank))
    return _job_exit_code([(r.process.returncode, r.ended_by_launch) for r in ended])


def _start_ranks(
    plan: RankPlan, env: dict[str, str], folder: str, ranks: list[_Rank], relays: list[threading.Thread]
) -> None:
    """Start each rank into ``ranks`` (as it starts: the caller ends those started if one fails to): rank 0 to this
    terminal, its standard error through a relay (into ``relays``), the others to a file in ``folder`` each."""
    import os
    import subprocess

    # as a module: running dlrecipes/cli.py as a script would put dlrecipes/ first on sys.path,
    # where a module named like a standard-library one would hide it
    cmd = [sys.executable, "-m", "dlrecipes", *plan.command]
    for local in range(plan.nproc):
        rank = plan.node_rank * plan.nproc + local
        if local == 0:
            process = subprocess.Popen(cmd, env=plan.environment(env, 0), stderr=subprocess.PIPE, text=True, bufsize=1)
            relays.append(_relay_stderr(process.stderr))
            ranks.append(_Rank(rank, process, None))
        else:
            log = os.path.join(folder, f"rank{rank}.txt")
            with open(log, "w") as out:
                process = subprocess.Popen(cmd, env=plan.environment(env, local), stdout=out, stderr=subprocess.STDOUT)
            ranks.append(_Rank(rank, process, log))


def _supervise(ranks: list[_Rank], grace: float = GRACE_S, poll: float = 0.1) -> None:
    """Wait for every rank. After a rank's failure the others get SIGTERM at once, after a clean stop ``grace``
    seconds later (they stop at the same batch on their own); ``grace`` seconds after SIGTERM, SIGKILL."""
    import signal

    term_at: float | None = None
    kill_at: float | None = None
    while True:
        try:
            running = [r for r in ranks if r.poll() is None]
            if not running:
                return
            now = time.monotonic()
            if term_at is None:
                first = next((r for r in ranks if r.process.returncode not in (None, 0)), None)
                if first is not None:
                    term_at = now + (grace if first.process.returncode == STOPPED else 0.0)
                    if first.process.returncode != STOPPED:
                        print(
                            f"launch: rank {first.rank} failed; ending the other ranks (SIGTERM, then SIGKILL "
                            f"after {grace:.0f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
            if term_at is not None and kill_at is None and now >= term_at:
                _end(running, signal.SIGTERM)
                kill_at = now + grace
            elif kill_at is not None and now >= kill_at:
                _end(running, signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(poll)
        except KeyboardInterrupt:  # Ctrl-C reached the ranks too (the terminal's process group): they stop themselves
            continue


def _end(ranks: list[_Rank], signum: int) -> None:
    """``signum`` to each of ``ranks``; SIGKILL to its child processes too (it cannot end them itself)."""
    import signal

    import psutil

    for rank in ranks:
        rank.ended_by_launch = True
        targets = [rank.process.pid]
        if signum == signal.SIGKILL:
            try:
                targets += [child.pid for child in psutil.Process(rank.process.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for pid in targets:
            _kill(pid, signum)


def _job_exit_code(ended: list[tuple[int, bool]]) -> int:
    """The job's exit code from each rank's (exit code, ended by launch), in the order they ended: 0 when all
    ended with 0; 75 (stopped with a checkpoint) when every rank that ended by itself ended with 0 or 75 and one
    with 75; else the first failure's code (128 + N for a rank ended by signal N, as a shell says it)."""
    failures = [code for code, by_launch in ended if code != 0 and not by_launch]
    if not failures:
        return 0 if all(code == 0 for code, _ in ended) else 1
    if all(code == STOPPED for code in failures):
        return STOPPED
    first = next(code for code in failures if code != STOPPED)
    return 128 - first if first < 0 else first


def _report(ranks: list[_Rank]) -> None:
    """One line for each rank that failed by itself (rank 0's output is on the terminal already), with the output
    of the others."""
    import signal

    for rank in ranks:
        code = rank.process.returncode
        if code in (0, STOPPED) or rank.ended_by_launch:
            continue
        how = f"was ended by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        lines = [f"launch: rank {rank.rank} (pid {rank.process.pid}) {how}"]
        if rank.log is not None:
            with open(rank.log, errors="replace") as f:
                output = f.read().rstrip("\n")
            lines += [f"---- rank {rank.rank}'s output ----", output, f"---- end of rank {rank.rank}'s output ----"]
        print("\n".join(lines), file=sys.stderr, flush=True)


def _kill(pid: int, signum: int) -> None:
    import os

    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended in between
        pass


# torch's rendezvous store warns, once per connection, when the connecting host's address has no name (no reverse
# DNS for it: common on cluster networks, and harmless: the connection is made); it is left out.
_NAMELESS_PEER = re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved\. err=-?\d+$")


def _relay_stderr(stream: Any) -> threading.Thread:
    """Copy rank 0's standard error to ours as it comes, without torch's warnings about peers' addresses without
    a host name."""

    def copy() -> None:
        with stream:  # closed at the rank's end
            for line in stream:
                if not _NAMELESS_PEER.search(line.rstrip("\n")):
                    sys.stderr.write(line)
                    sys.stderr.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread
