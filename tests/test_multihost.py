"""More than one host, for real: two Linux network namespaces joined by a veth pair, each a "host" with its own
address (192.0.2.1, 192.0.2.2) and no route to the other's loopback, while both host names resolve to an
address neither namespace has. gloo must find the right interface by itself (no GLOO_SOCKET_IFNAME set).

Needs root and iproute2 (`.ci/run` installs it); skipped with the reason where namespaces cannot be made."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from .test_distributed import _ranks, _same_params, ddp_recipe  # noqa: F401  (a fixture)

HOSTS = ((f"dlr-h0-{os.getpid()}", "dlr-v0", "192.0.2.1"), (f"dlr-h1-{os.getpid()}", "dlr-v1", "192.0.2.2"))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("two network namespaces need root and iproute2 (`ip`)")
    try:
        for ns, _, _ in HOSTS:
            _ip("netns", "add", ns)
        _ip("link", "add", HOSTS[0][1], "type", "veth", "peer", "name", HOSTS[1][1])
        for ns, dev, addr in HOSTS:
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as exc:
        for ns, _, _ in HOSTS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {getattr(exc, 'stderr', exc)}")
    try:
        yield HOSTS
    finally:
        for ns, _, _ in HOSTS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _on_host(ns: str, args: list[str], cwd, log) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "dlrecipes", *args],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _launch_both(hosts, recipe, tmp_path, *overrides: str, master: str = "192.0.2.1") -> list[subprocess.Popen]:
    port = 29400 + os.getpid() % 500
    procs = []
    for rank, (ns, _, _) in enumerate(hosts):
        log = open(tmp_path / f"host{rank}.log", "w")
        procs.append(
            _on_host(
                ns,
                [
                    "launch",
                    "-n",
                    "1",
                    "--nodes",
                    "2",
                    "--node-rank",
                    str(rank),
                    "--master-addr",
                    master,
                    "--master-port",
                    str(port),
                    str(recipe),
                    *overrides,
                ],
                tmp_path,
                log,
            )
        )
    return procs


@pytest.mark.slow
def test_two_hosts_train_with_no_interface_set(two_hosts, ddp_recipe, tmp_path):
    start = time.time()
    procs = _launch_both(
        two_hosts, ddp_recipe, tmp_path, "run_name=two", "trainer.max_duration=2ep", "trainer.dist_timeout=20"
    )
    codes = [p.wait(timeout=240) for p in procs]
    logs = [(tmp_path / f"host{r}.log").read_text() for r in range(2)]
    assert codes == [0, 0], "\n---\n".join(log[-2500:] for log in logs)
    assert time.time() - start < 180
    for (_, dev, _), log in zip(two_hosts, logs):
        assert f"gloo connects through {dev}" in log  # found from the route to the master address
    assert "gloo via dlr-v0" in logs[0]  # the start line names it
    assert not any("[c10d]" in log for log in logs)  # 192.0.2.x has no host name: torch's warning is left out
    records = _ranks(tmp_path, 2)
    assert all(r["world"] == 2 for r in records)
    _same_params(records)  # equal final weights on both hosts
    assert sorted(records[0]["seen"][1] + records[1]["seen"][1]) == list(range(32))


@pytest.mark.slow
def test_a_wrong_master_address_is_one_line_on_both_hosts_within_the_timeout(two_hosts, ddp_recipe, tmp_path):
    start = time.time()
    procs = _launch_both(
        two_hosts, ddp_recipe, tmp_path, "run_name=wrong", "trainer.dist_timeout=5", master="192.0.2.9"
    )
    codes = [p.wait(timeout=120) for p in procs]
    took = time.time() - start
    logs = [(tmp_path / f"host{r}.log").read_text() for r in range(2)]
    assert all(code != 0 for code in codes) and took < 60, (codes, took, logs)
    for log in logs:
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
        assert "master 192.0.2.9:" in errors[0] and "the interface that routes to the master address" in errors[0]


def _kill_host(ns: str) -> None:
    """Every process in the namespace ``ns`` (a host going down)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_lost_host_is_one_line_and_resume_finishes_each_epoch_once(two_hosts, ddp_recipe, tmp_path):
    args = ("run_name=lost", "trainer.max_duration=30ep", "trainer.dist_timeout=20", "dataset.samples=64")
    procs = _launch_both(two_hosts, ddp_recipe, tmp_path, *args)
    history = tmp_path / "runs" / "lost" / "history.csv"
    deadline = time.time() + 120
    while not (history.is_file() and len(history.read_text().splitlines()) >= 3) and time.time() < deadline:
        time.sleep(0.1)
    lost_at = time.time()
    _kill_host(two_hosts[1][0])
    code = procs[0].wait(timeout=120)
    took = time.time() - lost_at
    log = (tmp_path / "host0.log").read_text()
    assert code != 0 and took < 60, (code, took, log[-3000:])
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
    assert "lost" in errors[0] and "--resume" in errors[0], errors[0]
    summary = __import__("json").loads((tmp_path / "runs" / "lost" / "summary.json").read_text())
    assert summary["status"] == "stopped"  # interrupted, resumable
    procs = _launch_both(two_hosts, ddp_recipe, tmp_path, *args, "--resume")
    assert [p.wait(timeout=240) for p in procs] == [0, 0], (tmp_path / "host0.log").read_text()[-3000:]
    with open(history) as f:
        epochs = [int(r["epoch"]) for r in __import__("csv").DictReader(f)]
    assert epochs == list(range(1, 31))
