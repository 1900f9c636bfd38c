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
    """Run Composer's launcher; SIGTERM/SIGUSR1 reach the training processes, not the launcher.

    A cluster sends them to the whole job (SLURM's ``--signal``, ``scancel``, preemption): the
    launcher would die at once and the job step end before the ranks finished their checkpoint.
    So the launcher starts with both ignored (each rank installs its own handlers when training
    starts) and a signal that reaches this process is passed on to every training process.
    """
    import signal
    import subprocess

    import psutil

    forwarded = (signal.SIGTERM, signal.SIGUSR1)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in forwarded}  # inherited by the launcher
    try:
        launcher = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    relay = _relay_stderr(launcher.stderr)

    def forward(signum, frame):
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                child.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    for s in forwarded:
        signal.signal(s, forward)
    try:
        code = launcher.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the ranks and the launcher too; let them finish
        code = launcher.wait()
    relay.join(timeout=5)
    return code


# Composer's launcher reports every rank that exits non-zero as "crashed", also a rank that stopped cleanly on a
# signal with a checkpoint (exit 75): those lines are left out (the rank said what happened in one line).
_CLEAN_STOP = re.compile(r"(Rank \d+ crashed with exit code 75\.|Global rank \d+ \(PID \d+\) exited with code 75)$")
# torch's rendezvous store warns, once per connection, when the connecting host's address has no name (no reverse
# DNS for it: common on cluster networks, and harmless: the connection is made); it is left out too.
_NAMELESS_PEER = re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved\. err=-?\d+$")


def _relay_stderr(stream: Any) -> threading.Thread:
    """Copy the launcher's standard error to ours as it comes, without its reports of clean stops and torch's
    warnings about peers' addresses without a host name."""
    def copy() -> None:
        for line in stream:
            if not (_CLEAN_STOP.search(line.rstrip("\n")) or _NAMELESS_PEER.search(line.rstrip("\n"))):
                sys.stderr.write(line)
                sys.stderr.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread
