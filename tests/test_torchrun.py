"""torchrun starts dlrecipes on several nodes as Kubeflow's TrainJob, SkyPilot and `srun ... torchrun` do: a real
`torchrun --nnodes 2` on tests/test_multihost.py's two network-namespace hosts, and an elastic one
(`--nnodes 1:2 --max-restarts 1`) that loses a host and goes on from the run's last checkpoint on the host left."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.test_distributed import _ranks, _same_params, ddp_recipe  # noqa: F401  (a fixture)
from tests.test_multihost import _kill_host, two_hosts  # noqa: F401  (a fixture)


def test_torchruns_group_rank_is_the_node_rank_composer_reads(monkeypatch):
    from composer.utils import dist

    from dlrecipes.core.distributed import adopt_torchrun

    for name in ("NODE_RANK", "TORCHELASTIC_RUN_ID", "GROUP_RANK"):  # set first, so that teardown puts back its
        monkeypatch.setenv(name, "0")  # absence: adopt_torchrun sets NODE_RANK itself, which would leak
        monkeypatch.delenv(name)
    assert adopt_torchrun() == 0 and "NODE_RANK" not in os.environ  # not under torchrun: nothing changed
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert adopt_torchrun() == 2
    assert dist.get_node_rank() == 1


def _torchrun(host: str, tmp_path, log: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-m", "torch.distributed.run", *args],
                            cwd=tmp_path, env=env, stdout=open(tmp_path / log, "w"), stderr=subprocess.STDOUT, text=True)


def _epochs(history) -> list[int]:
    with open(history) as f:
        return [int(r["epoch"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_torchrun_on_two_hosts_trains_each_sample_once_with_equal_weights(two_hosts, ddp_recipe, tmp_path):
    port = str(29700 + os.getpid() % 200)
    procs = [_torchrun(ns, tmp_path, f"host{rank}.log", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
                       str(rank), "--master-addr", two_hosts[0][2], "--master-port", port, str(REPO / "cli.py"),
                       "train", str(ddp_recipe), "run_name=torchrun", "trainer.max_duration=2ep",
                       "trainer.dist_timeout=20")
             for rank, (ns, _, _) in enumerate(two_hosts)]
    codes = [p.wait(timeout=240) for p in procs]
    logs = [(tmp_path / f"host{r}.log").read_text() for r in range(2)]
    assert codes == [0, 0], "\n---\n".join(log[-2500:] for log in logs)
    records = _ranks(tmp_path, 2)
    assert [r["world"] for r in records] == [2, 2]
    _same_params(records)
    for epoch in (0, 1):
        assert sorted(records[0]["seen"][epoch] + records[1]["seen"][epoch]) == list(range(32))
    assert _epochs(tmp_path / "runs" / "torchrun" / "history.csv") == [1, 2]


@pytest.mark.slow
def test_an_elastic_torchrun_that_loses_a_host_goes_on_from_the_last_checkpoint(two_hosts, ddp_recipe, tmp_path):
    """Both hosts join an elastic job (1 to 2 nodes, one restart allowed); once the run has checkpoints, host 1 goes
    down (every process in it killed). Host 0's worker fails, torchrun restarts the job on the one host left, and
    dlrecipes resumes the run from its last checkpoint there (one line says so) and finishes it, each epoch once."""
    endpoint = f"{two_hosts[0][2]}:{29900 + os.getpid() % 90}"
    # is_host: the endpoint's host keeps the rendezvous; torch cannot tell by itself here, where the host name
    # resolves to an address neither namespace has
    conf = "join_timeout=60,last_call_timeout=2,is_host={}"
    args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "elastic", str(REPO / "cli.py"), "train", str(ddp_recipe), "run_name=elastic", "trainer.max_duration=12ep",
            "trainer.dist_timeout=20", "dataset.samples=64", "checkpoint.save_interval=1ep"]
    # --local-addr: the address each agent tells the others (torch would give its host name, which does not resolve)
    procs = [_torchrun(ns, tmp_path, f"host{rank}.log", "--rdzv-conf", conf.format(int(rank == 0)), "--local-addr",
                       address, *args)
             for rank, (ns, _, address) in enumerate(two_hosts)]
    history = tmp_path / "runs" / "elastic" / "history.csv"
    deadline = time.time() + 150
    while not (history.is_file() and len(history.read_text().splitlines()) >= 3) and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.1)
    assert all(p.poll() is None for p in procs), (tmp_path / "host0.log").read_text()[-3000:]
    _kill_host(two_hosts[1][0])
    code = procs[0].wait(timeout=240)
    log = (tmp_path / "host0.log").read_text()
    assert code == 0, log[-4000:]
    assert "torchrun restarts the job if it has a restart left (--max-restarts), and the run resumes" in log
    assert "note: torchrun restarted the job (restart 1): resuming the run from its last checkpoint" in log
    assert "resuming from" in log
    assert _epochs(history) == list(range(1, 13))  # each epoch once: the restart went on from the checkpoint
    record = _ranks(tmp_path, 1)[0]
    assert record["world"] == 1  # it finished on the host left
