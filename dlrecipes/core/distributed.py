"""This process among the launcher's processes, and agreement among them.

- Where a run executes: the rank and process counts a launcher (``composer -n``, torchrun, srun
  through ``dlrecipes launch``) puts in the environment (read from there, so that validation can
  use them before torch.distributed starts).  The device a recipe resolves to and this process's torch
  device are :mod:`dlrecipes.core.devices`'.
- torchrun's environment in the names Composer reads (:func:`adopt_torchrun`), any launcher's checked for
  agreement (:func:`check_launch_environment`), the name a torchrun job gives a run without a ``run_name``
  (:func:`torchrun_job_name`), and each torchrun attempt's process group kept apart from the one before
  (:func:`start_torchrun_group`).
- The one check that a global batch divides over the processes (:func:`split_batch`).
- Small reductions of host numbers over all processes, on a gloo group of their own
  (:class:`HostReducer`): the engine and the signal handling agree on numbers that live on the
  host (the end of the data, batch sizes, sample counts, a received signal) without touching the
  GPU.  The group is made once per process group (every rank makes it at the same point: the
  Trainer's construction), with the run's ``trainer.dist_timeout``; a gloo connection failure
  becomes one line that names ``GLOO_SOCKET_IFNAME``.  :func:`same_on_all_ranks` gives every rank
  rank 0's value of something (a run name with its timestamp), and :func:`stopped_together` makes
  a user error on one rank before training stop every rank at once.

Torch is imported only when there is more than one process.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dlrecipes.errors import RecipeError, UserError, first_line

T = TypeVar("T")


def rank() -> int:
    """This process's global rank (0 without a launcher)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many processes train together (1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


_STOP: list[BaseException] = []  # a stop this process asked of the whole run (request_stop)


def request_stop(error: BaseException) -> None:
    """Ask every rank of the training to stop at the same batch (the signal handling's agreement,
    :mod:`dlrecipes.callbacks.stop_on_signal`): this rank then raises ``error`` (its one line), the others one line
    saying another rank stopped the run. A rank that stopped alone would leave the others waiting in a collective
    for its timeout. The first request stands."""
    if not _STOP:
        _STOP.append(error)


def requested_stop(clear: bool = False) -> BaseException | None:
    """The stop this process asked for (``clear``: forgotten, as a new training starts), or None."""
    found = _STOP[0] if _STOP else None
    if clear:
        _STOP.clear()
    return found


def local_world_size() -> int:
    """How many of them run on this node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size()))


def adopt_torchrun() -> int:
    """torchrun's environment (which Kubeflow's TrainJob, SkyPilot and ``srun ... torchrun`` reduce to) in the names
    Composer reads: ``NODE_RANK`` is torchrun's ``GROUP_RANK`` where it is unset (Composer would take 0 on every
    node: each node's local rank 0 then believes it is the first node's); one set to another value is refused in one
    line, as is any launcher's environment that contradicts itself (:func:`check_launch_environment`). Returns
    torchrun's ``TORCHELASTIC_RESTART_COUNT`` (0: its first start, or not under torchrun)."""
    env = os.environ
    if "GROUP_RANK" in env:
        group = _whole_number("GROUP_RANK", env)
        if "NODE_RANK" not in env:
            env["NODE_RANK"] = str(group)
        elif _whole_number("NODE_RANK", env) != group:
            raise UserError(
                f"NODE_RANK={env['NODE_RANK']} but torchrun made this node number {group} (GROUP_RANK): "
                "unset NODE_RANK, torchrun gives each node its rank"
            )
    check_launch_environment(env)
    if "TORCHELASTIC_RUN_ID" not in env:
        return 0
    return int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)


_LAUNCHERS = "dlrecipes launch, torchrun or composer -n"


def _whole_number(name: str, env: Any) -> int:
    value = env[name].strip()
    if not value.isdigit():
        raise UserError(f"{name}={env[name]!r} in the environment: expected a whole number (set by {_LAUNCHERS})")
    return int(value)


def check_launch_environment(env: Any = None) -> None:
    """The ranks and process counts a launcher put in the environment (``env``: default this process's) agree with
    each other: one line naming the variables where they do not, before anything starts (torch would otherwise wait
    for processes that never come, or fail deep inside its rendezvous). Nothing set: one process, nothing to check."""
    env = os.environ if env is None else env
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_WORLD_SIZE")
    got = {name: _whole_number(name, env) for name in names if env.get(name, "").strip()}
    world = got.get("WORLD_SIZE", 1)
    if world < 1:
        raise UserError(f"WORLD_SIZE={world} in the environment: at least 1 process")
    if world > 1:
        missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(name, "").strip()]
        if missing:
            raise UserError(
                f"WORLD_SIZE={world} is set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'}"
                f" not: start the processes with {_LAUNCHERS}, which set them all"
            )
    pairs = [("RANK", world, "WORLD_SIZE")]
    local_world = got.get("LOCAL_WORLD_SIZE")
    if local_world is not None:  # the per-node checks where a launcher said how many processes a node runs
        if not 1 <= local_world <= world or world % local_world:
            raise UserError(
                f"LOCAL_WORLD_SIZE={local_world} in the environment does not divide WORLD_SIZE={world}: "
                "every node runs the same number of processes"
            )
        pairs += [
            ("LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE"),
            ("NODE_RANK", world // local_world, "WORLD_SIZE/LOCAL_WORLD_SIZE nodes"),
        ]
        if "GROUP_WORLD_SIZE" in got and got["GROUP_WORLD_SIZE"] * local_world != world:
            raise UserError(
                f"WORLD_SIZE={world} in the environment but torchrun's GROUP_WORLD_SIZE="
                f"{got['GROUP_WORLD_SIZE']} nodes x LOCAL_WORLD_SIZE={local_world} processes"
            )
    for name, bound, of in pairs:
        if name in got and got[name] >= bound:
            raise UserError(
                f"{name}={got[name]} in the environment but {of} is {bound}: ranks count from 0 "
                f"to {bound - 1} (set by {_LAUNCHERS})"
            )


def torchrun_job_name() -> str | None:
    """What names a run without a ``run_name`` under torchrun, the same on each of its restarts of one job (so that a
    restarted job continues its run): torchrun's ``--rdzv-id`` where given, else (``--standalone`` too) the start time
    of the torchrun agent that started this process (YYYYmmdd-HHMMSS; for rank 0: node 0's, which lives as long as the
    job with a fixed ``--node-rank``). None when not under torchrun."""
    import re
    import time

    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    # torchrun's own ids name nothing: "none" (no --rdzv-id) and --standalone's random UUID (one node: its agent)
    generated = run_id == "none" or re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", run_id)
    named = "" if generated else re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip(".-")
    if named:
        return named
    import psutil

    try:
        started = psutil.Process(os.getppid()).create_time()
    except psutil.Error:
        return None
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(started))


def split_batch(global_batch: int, processes: int, key: str) -> int:
    """Each process's share of a global batch; one that does not divide evenly names ``key``."""
    if global_batch % processes:
        raise RecipeError(
            f"{key}: the global batch size {global_batch} does not divide evenly over {processes} processes "
            f"(use a multiple of {processes})"
        )
    return global_batch // processes


SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
CHOSEN_MARK = "DLRECIPES_GLOO_IFNAME_CHOSEN"  # set beside GLOO_SOCKET_IFNAME when dlrecipes chose it


def _local_addresses() -> dict[str, str]:
    """This host's IPv4 address per network interface (Linux; empty elsewhere)."""
    import socket

    found: dict[str, str] = {}
    try:
        import fcntl
        import struct

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on it
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def interface_towards(address: str, port: int = 29500) -> tuple[str, str] | None:
    """The network interface (and its address) this host sends through to reach ``address``: the local end of a
    UDP socket connected towards it (nothing is sent). None when there is no route or it cannot be told."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(address), port))
            local = s.getsockname()[0]
    except OSError:
        return None
    return next(((name, addr) for name, addr in _local_addresses().items() if addr == local), None)


def choose_gloo_interface(env: Any = None) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` in ``env`` (default: this process's environment) to the interface that routes
    to the master address, when the run spans hosts (the master address is not one of this host's) and the user
    has not set it; returns the interface gloo will use (the user's, ours, or None for gloo's own choice).

    gloo otherwise picks the address its host name resolves to, which on many clusters (and in any container
    whose name maps to 127.0.x.x) is not one the other hosts can reach. NCCL picks its own interface, and well;
    it is left alone."""
    env = os.environ if env is None else env
    if env.get("GLOO_SOCKET_IFNAME"):
        return env["GLOO_SOCKET_IFNAME"]
    master = env.get("MASTER_ADDR")
    if not master or int(env.get("WORLD_SIZE", "1")) <= 1:
        return None
    found = interface_towards(master, int(env.get("MASTER_PORT", "29500") or 29500))
    if found is None:
        return None
    name, addr = found
    if addr.startswith("127.") and name == "lo" and not _on_another_host(master):
        return None  # every process on this host: loopback is right, and gloo's default finds it
    env["GLOO_SOCKET_IFNAME"] = name
    env[CHOSEN_MARK] = name  # so that a connection failure can say who chose it
    return name


def _on_another_host(address: str) -> bool:
    import socket

    try:
        resolved = socket.gethostbyname(address)
    except OSError:
        return True
    return not resolved.startswith("127.") and resolved not in _local_addresses().values()


# torch's own words for a gloo rendezvous that could not connect or find its interface
_GLOO_FAILURES = (
    "connectFullMesh",
    "Gloo connect",
    "Unable to find address for",
    "getaddrinfo",
    "Connection refused",
    "Connection reset by peer",
    "Timed out waiting",
    "No route to host",
)


@contextlib.contextmanager
def gloo_errors(what: str = "gloo (the host-side process group)") -> Iterator[None]:
    """Turn a gloo connection failure into one :class:`UserError` line naming GLOO_SOCKET_IFNAME."""
    try:
        yield
    except RuntimeError as exc:
        message = str(exc)
        if not any(words in message for words in _GLOO_FAILURES):
            raise
        first = next((line.strip() for line in message.splitlines() if line.strip()), message)[:200]
        raise UserError(f"{what} could not connect the processes ({first}); {connection_setup()}") from None


def connection_setup() -> str:
    """Where this process tried to connect, and through which interface: for a one-line connection error."""
    master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    chosen = os.environ.get("GLOO_SOCKET_IFNAME")
    if chosen and os.environ.get(CHOSEN_MARK) == chosen:
        how = f"gloo used {chosen}, the interface that routes to the master address (set GLOO_SOCKET_IFNAME to choose)"
    elif chosen:
        how = f"gloo used GLOO_SOCKET_IFNAME={chosen}, as set: check that it exists and reaches the other hosts"
    else:
        how = (
            "gloo picked its interface from this host's name; set GLOO_SOCKET_IFNAME to the interface that "
            "reaches the other hosts (e.g. GLOO_SOCKET_IFNAME=eth0, see `ip addr`)"
        )
    nccl = os.environ.get("NCCL_SOCKET_IFNAME")
    return f"master {master} (--master-addr, --master-port: node 0's address, reachable from every host); {how}" + (
        f"; NCCL_SOCKET_IFNAME={nccl}" if nccl else ""
    )


class PeerLost(UserError):
    """Another process of the run died or stopped answering: this one stops too, resumable (exit 75, as a
    stop on a signal)."""

    exit_code = 75


# torch's words when the other end of a collective went away (gloo, NCCL)
PEER_LOST_WORDS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "NCCL error",
    "Socket Timeout",
    "Connection refused",
)


def lost_peer(exc: BaseException) -> str | None:
    """Who was lost, when ``exc`` says another process of the run went away: its address where the transport
    names it, else "another process"; None when ``exc`` is about something else."""
    import re

    if isinstance(exc, PeerLost):
        return "another process"
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not any(words in text for words in PEER_LOST_WORDS):
        return None
    found = re.search(r"\[([0-9A-Fa-f:.]+)\]:\d+", text)
    return f"the host at {found.group(1)}" if found else "another process"


class Pending:
    """An asynchronous reduction started now and read later (:meth:`HostReducer.start`)."""

    def __init__(self, box: Any = None, work: Any = None, values: list[float] | None = None):
        self._box, self._work, self._values = box, work, values

    def wait(self) -> list[float]:
        if self._values is None:
            try:
                self._work.wait()
            except RuntimeError as exc:
                first = first_line(exc, 200, "")
                raise PeerLost(
                    f"another process of this run stopped or stopped answering ({first}); "
                    "its own log or terminal says why"
                ) from None
            self._values = self._box.tolist()  # a CPU tensor: no device synchronisation
        return self._values


class HostReducer:
    """Sums or maxima of small lists of host numbers over all ranks, on a gloo group of its own.

    With one process nothing is reduced (and torch is not imported).  ``timeout`` (seconds) bounds
    every reduction, so a rank that died does not keep the others waiting for torch's default
    half hour.
    """

    _groups: dict = {}  # id(default group) -> (default group, ours); tests start several in one process

    def __init__(self, timeout: float = 300.0):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.timeout = float(timeout)
        self._group: Any = None
        if self.world_size > 1:
            self._group = self._make_group()

    def _make_group(self) -> Any:
        import torch.distributed as tdist

        if not tdist.is_initialized():  # e.g. a Trainer built before the launcher's group: made on first use
            return None
        world = tdist.group.WORLD
        found = HostReducer._groups.get(id(world))
        if found is None or found[0] is not world:
            with gloo_errors():
                group = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
            found = HostReducer._groups[id(world)] = (world, group)
        return found[1]

    def sum(self, values: list[float]) -> list[float]:
        return self.start(values, "SUM").wait()

    def max(self, values: list[float]) -> list[float]:
        return self.start(values, "MAX").wait()

    def start(self, values: list[float], op: str = "SUM") -> Pending:
        """Begin reducing ``values``; :meth:`Pending.wait` gives the result (gloo works meanwhile)."""
        if self.world_size == 1:
            return Pending(values=list(values))
        import torch
        import torch.distributed as tdist

        if self._group is None:
            self._group = self._make_group()
        box = torch.tensor(values, dtype=torch.float64)
        with gloo_errors():
            work = tdist.all_reduce(box, op=getattr(tdist.ReduceOp, op), group=self._group, async_op=True)
        return Pending(box, work)


def start_torchrun_group(device: str, timeout: float) -> bool:
    """Under torchrun with several processes, start the default process group in the store of torchrun's agent with
    this attempt's keys apart (``TORCHELASTIC_RESTART_COUNT``); True when started here.

    torch 2.7's workers reuse the agent's store across restarts without a prefix per attempt (static rendezvous
    keeps one store for the job; pytorch/pytorch#135712): a restarted process then reads the addresses its peers
    published before the restart and cannot connect. With a fixed set of nodes every worker restarts with the
    same count (when one process fails the others lose it and stop too), so the count keeps the attempts apart."""
    env = os.environ
    if world_size() == 1 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    import torch.distributed as tdist
    from composer.devices import DeviceCPU, DeviceGPU

    if tdist.is_initialized():
        return False
    wait = datetime.timedelta(seconds=timeout)
    with gloo_errors("the process group (torch.distributed)"):
        agent = tdist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size(), is_master=False, timeout=wait)
        store = tdist.PrefixStore(f"dlrecipes/attempt_{int(env.get('TORCHELASTIC_RESTART_COUNT') or 0)}", agent)
        backend = (DeviceGPU if device == "gpu" else DeviceCPU).dist_backend
        tdist.init_process_group(backend, store=store, rank=rank(), world_size=world_size(), timeout=wait)
    return True


def same_on_all_ranks(value: Any, device: str, timeout: float) -> Any:
    """Rank 0's ``value`` on every rank (starting the default process group, within ``timeout``)."""
    if world_size() == 1:
        return value
    from composer.utils import dist

    _start_group(device, timeout)
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def stopped_together(step: Callable[[], T], device: str, timeout: float, undo: Callable[[T], None]) -> T:
    """``step()`` on every rank, after which the ranks tell each other whether it failed with a :class:`UserError`.

    A rank whose step failed raises its own error. The other ranks call ``undo`` on their result and stop with one
    line naming the failed rank and its error. Without this, a rank that stopped alone leaves the others waiting
    in their next collective until the process group's timeout (``trainer.dist_timeout``): for example, a node
    that could not download a run for ``--resume`` while another node could."""
    try:
        result, line = step(), ""
    except UserError as exc:
        if world_size() == 1:
            raise
        result, line, own = None, first_line(exc), exc
    if world_size() == 1:
        return result
    from composer.utils import dist

    _start_group(device, timeout)
    lines = dist.all_gather_object(line)
    if line:
        raise own
    failed = next(((number, text) for number, text in enumerate(lines) if text), None)
    if failed is not None:
        undo(result)
        raise UserError(f"rank {failed[0]} of this training stopped before training began: {failed[1]}")
    return result


def _start_group(device: str, timeout: float) -> None:
    """The default process group started (Composer's, for ``device``), within ``timeout`` seconds."""
    from composer.devices import DeviceCPU, DeviceGPU
    from composer.utils import dist

    with gloo_errors("the process group (torch.distributed)"):
        dist.initialize_dist(DeviceGPU() if device == "gpu" else DeviceCPU(), timeout=timeout)
