"""torchrun starts dlrecipes on several nodes as Kubeflow's TrainJob, SkyPilot and `srun ... torchrun` do: its
environment in Composer's names and refused in one line where it contradicts itself; a run without a run_name named
after the job so that a restart continues it; a real `torchrun --nnodes 2` on tests/test_multihost.py's two
network-namespace hosts, the same with `--max-restarts 1` whose host-1 worker is SIGKILLed (torchrun restarts both
hosts, the run ends as an uninterrupted one), and an elastic one (`--nnodes 1:2 --max-restarts 1`) that loses a
host and goes on from the run's last checkpoint on the host left."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.test_distributed import UNINTERRUPTED, _ranks, _same_params, ddp_recipe, uninterrupted  # noqa: F401
from tests.test_multihost import _kill_host, two_hosts  # noqa: F401  (a fixture)


def test_torchruns_group_rank_is_the_node_rank_composer_reads(monkeypatch):
    from composer.utils import dist

    from dlrecipes.core.distributed import adopt_torchrun

    _unset(
        monkeypatch,
        "NODE_RANK",
        "TORCHELASTIC_RUN_ID",
        "GROUP_RANK",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
    )
    assert adopt_torchrun() == 0 and "NODE_RANK" not in os.environ  # not under torchrun: nothing changed
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    for name, value in (
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("GROUP_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ):
        monkeypatch.setenv(name, value)
    assert adopt_torchrun() == 2
    assert dist.get_node_rank() == 1
    assert adopt_torchrun() == 2  # a NODE_RANK that agrees stays


def _unset(monkeypatch, *names: str) -> None:
    """``names`` out of the environment, and whatever the test sets them to undone after it (monkeypatch.delenv
    alone records nothing for a name that is not set: the NODE_RANK torchrun's adoption sets would stay)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


TORCHRUN_ENV = {
    "TORCHELASTIC_RUN_ID": "job",
    "GROUP_RANK": "1",
    "RANK": "2",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


@pytest.mark.parametrize(
    "changed, message",
    [
        ({"NODE_RANK": "0"}, "NODE_RANK=0 but torchrun made this node number 1 (GROUP_RANK): unset NODE_RANK"),
        ({"RANK": "4"}, "RANK=4 in the environment but WORLD_SIZE is 4: ranks count from 0 to 3"),
        ({"LOCAL_RANK": "2"}, "LOCAL_RANK=2 in the environment but LOCAL_WORLD_SIZE is 2"),
        ({"LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE=3 in the environment does not divide WORLD_SIZE=4"),
        ({"GROUP_WORLD_SIZE": "3"}, "torchrun's GROUP_WORLD_SIZE=3 nodes x LOCAL_WORLD_SIZE=2 processes"),
        ({"GROUP_RANK": "2"}, "NODE_RANK=2 in the environment but WORLD_SIZE/LOCAL_WORLD_SIZE nodes is 2"),
        ({"RANK": "one"}, "RANK='one' in the environment: expected a whole number"),
        ({"MASTER_ADDR": None}, "WORLD_SIZE=4 is set but MASTER_ADDR is not: start the processes with"),
    ],
)
def test_an_inconsistent_launch_environment_is_one_line_exit_2(tiny_recipe, monkeypatch, changed, message):
    from tests.conftest import run_cli

    _unset(monkeypatch, "NODE_RANK", "TORCHELASTIC_RESTART_COUNT")
    for name, value in {**TORCHRUN_ENV, **changed}.items():
        if value is None:
            _unset(monkeypatch, name)
        else:
            monkeypatch.setenv(name, value)
    result = run_cli("train", str(tiny_recipe))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [f"error: {result.stderr.strip()[7:]}"]
    assert message in result.stderr
    assert not (tiny_recipe.parent / "runs").exists()  # refused before anything started


def test_torchruns_restart_of_an_unnamed_run_continues_the_run_named_after_the_job(tiny_recipe, monkeypatch):
    """One process under torchrun (its environment, no rendezvous needed): the run without a run_name is named after
    the job (--rdzv-id), and the job's restart resumes that run, saying so, instead of starting another."""
    from dlrecipes.records.run_dir import RESUME_MISSING
    from tests.conftest import run_cli

    _unset(monkeypatch, RESUME_MISSING)  # the restart sets it
    env = {
        **TORCHRUN_ENV,
        "TORCHELASTIC_RUN_ID": "in100 job",
        "GROUP_RANK": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_WORLD_SIZE": "1",
        "NODE_RANK": "0",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    first = run_cli("train", str(tiny_recipe), "trainer.max_duration=1ep", "checkpoint.save_interval=1ep")
    assert first.returncode == 0, first.stderr[-2000:]
    assert [p.name for p in (tiny_recipe.parent / "runs").iterdir()] == ["tiny-in100-job"]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = run_cli("train", str(tiny_recipe), "trainer.max_duration=2ep", "checkpoint.save_interval=1ep")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "note: torchrun restarted the job (restart 1): resuming the run from its last checkpoint" in again.stderr
    assert "resuming from" in again.stderr and "tiny-in100-job" in again.stderr
    assert [p.name for p in (tiny_recipe.parent / "runs").iterdir()] == ["tiny-in100-job"]
    assert _epochs(tiny_recipe.parent / "runs" / "tiny-in100-job" / "history.csv") == [1, 2]


def test_a_torchrun_jobs_run_name_is_checked_for_room_before_the_bucket_is_asked(tiny_recipe, monkeypatch):
    """Under torchrun a run without a run_name is named after the job before its store checks room for the name: a
    --rdzv-id too long for a staging folder's name is one line saying so, exit 2, with no server asked (before: the
    room was checked for a default name, and the command went on to a server that is not there)."""
    from tests.conftest import run_cli

    env = {**TORCHRUN_ENV, "TORCHELASTIC_RUN_ID": "j" * 300, "GROUP_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}
    env |= {"LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1", "NODE_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}
    env["S3_ENDPOINT_URL"] = "http://127.0.0.1:9"  # nothing listens there
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run_cli("train", str(tiny_recipe), "runs_dir=s3://runs/jobs")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: runs_dir: the staging folder would hold a name of 305 bytes "
        "(tiny-jjjjjjjjjjjjjjjjjjjjjjjjj... (305 characters)), over this file system's 255; "
        "choose shorter prefix folders or run_name for s3://runs/jobs"
    ]


def test_a_static_torchrun_job_is_named_after_its_agents_start(monkeypatch):
    import psutil

    from dlrecipes.core.distributed import torchrun_job_name

    _unset(monkeypatch, "TORCHELASTIC_RUN_ID")
    assert torchrun_job_name() is None
    started = time.strftime("%Y%m%d-%H%M%S", time.localtime(psutil.Process(os.getppid()).create_time()))
    for generated in ("none", "93ffa164-720f-4ebf-b5aa-161674d15212"):  # no --rdzv-id; --standalone's
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", generated)
        assert torchrun_job_name() == started  # the agent (our parent) lives as long as the job
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "in100/job 2")
    assert torchrun_job_name() == "in100-job-2"


def _torchrun(host: str, tmp_path, log: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        ["ip", "netns", "exec", host, sys.executable, "-m", "torch.distributed.run", *args],
        cwd=tmp_path,
        env=env,
        stdout=open(tmp_path / log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def _epochs(history) -> list[int]:
    with open(history) as f:
        return [int(r["epoch"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_torchrun_on_two_hosts_trains_each_sample_once_with_equal_weights(two_hosts, ddp_recipe, tmp_path):
    port = str(29700 + os.getpid() % 200)
    procs = [
        _torchrun(
            ns,
            tmp_path,
            f"host{rank}.log",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(rank),
            "--master-addr",
            two_hosts[0][2],
            "--master-port",
            port,
            str(REPO / "cli.py"),
            "train",
            str(ddp_recipe),
            "run_name=torchrun",
            "trainer.max_duration=2ep",
            "trainer.dist_timeout=20",
        )
        for rank, (ns, _, _) in enumerate(two_hosts)
    ]
    codes = [p.wait(timeout=240) for p in procs]
    logs = [(tmp_path / f"host{r}.log").read_text() for r in range(2)]
    assert codes == [0, 0], "\n---\n".join(log[-2500:] for log in logs)
    done = [line for log in logs for line in log.splitlines() if line.startswith("done: ")]
    assert len(done) == 1 and "done: " in logs[0], logs  # one closing line for the run (there was one per process)
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
    args = [
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "elastic",
        str(REPO / "cli.py"),
        "train",
        str(ddp_recipe),
        "run_name=elastic",
        "trainer.max_duration=12ep",
        "trainer.dist_timeout=20",
        "dataset.samples=64",
        "checkpoint.save_interval=1ep",
    ]
    # --local-addr: the address each agent tells the others (torch would give its host name, which does not resolve)
    procs = [
        _torchrun(
            ns, tmp_path, f"host{rank}.log", "--rdzv-conf", conf.format(int(rank == 0)), "--local-addr", address, *args
        )
        for rank, (ns, _, address) in enumerate(two_hosts)
    ]
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


KILL_ONCE = '''
import os
import signal

from dlrecipes.registry import callbacks


@callbacks.register("kill_first_attempt")
def kill_first_attempt(at_batch: int, rank: int):
    """Test helper: SIGKILL this process after batch ``at_batch`` on global rank ``rank``, in torchrun's first
    attempt only (its restart goes through that batch again and lives)."""
    from composer.core import Callback
    from composer.utils import dist

    class Kill(Callback):
        def batch_end(self, state, logger):
            if (int(state.timestamp.batch) == at_batch and dist.get_global_rank() == rank
                    and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
                os.kill(os.getpid(), signal.SIGKILL)

    return Kill()
'''


@pytest.mark.slow
def test_torchrun_restarts_both_hosts_after_a_killed_worker_and_the_run_ends_as_an_uninterrupted_one(
    two_hosts, ddp_recipe, tmp_path, uninterrupted
):
    """A fixed two-node torchrun (static rendezvous, --max-restarts 1 on both) whose training process on host 1 is
    SIGKILLed after batch 6 of 8 (checkpoints every 2 batches): host 0's process loses its peer and stops, torchrun
    restarts the job on both hosts, and the restarted processes continue the run (no run_name: named after the
    job) from its last checkpoint to the end, with the weights of an uninterrupted run (test_distributed.py's)."""
    (tmp_path / "kill_plugin.py").write_text(KILL_ONCE)
    port = str(29600 + os.getpid() % 97)
    procs = [
        _torchrun(
            ns,
            tmp_path,
            f"host{rank}.log",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(rank),
            "--max-restarts",
            "1",
            "--master-addr",
            two_hosts[0][2],
            "--master-port",
            port,
            str(REPO / "cli.py"),
            "train",
            str(ddp_recipe),
            *UNINTERRUPTED,
            "checkpoint.save_interval=2ba",
            "trainer.dist_timeout=20",
            f"imports=[./ddp_plugin.py, {REPO / 'tests' / 'fault_injection.py'}, ./kill_plugin.py]",
            "callbacks.kill_first_attempt={at_batch: 6, rank: 1}",
        )
        for rank, (ns, _, _) in enumerate(two_hosts)
    ]
    codes = [p.wait(timeout=240) for p in procs]
    logs = [(tmp_path / f"host{r}.log").read_text() for r in range(2)]
    assert codes == [0, 0], "\n---\n".join(log[-3000:] for log in logs)
    runs = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(runs) == 1 and runs[0].startswith("ddp-"), runs  # the restart continued the run, none other started
    assert "note: torchrun restarted the job (restart 1): resuming the run from its last checkpoint" in logs[0]
    assert "resuming from" in logs[0]
    records = _ranks(tmp_path, 2)
    assert [r["world"] for r in records] == [2, 2]
    assert records[0]["first_batch"] in (4, 6)  # batch 6's checkpoint may not have been written
    resumed_in = records[0]["first_batch"] // 4  # 4 batches an epoch; the seam is in epoch resumed_in
    seen = sorted(records[0]["seen"][resumed_in] + records[1]["seen"][resumed_in])
    assert len(seen) == len(set(seen)) == (8 - records[0]["first_batch"]) * 8  # no sample twice after the seam
    if records[0]["first_batch"] == 4:
        assert seen == list(range(32))
    _same_params(uninterrupted + records)  # as if nothing had happened
    assert _epochs(tmp_path / "runs" / runs[0] / "history.csv") == [1, 2]
