"""scripts/slurm/train.sbatch against a real SLURM: a one-node cluster on loopback (Debian's slurmctld, slurmd
and munge, our own config, spool and ports), a job whose time-limit signal stops the run with a checkpoint, the
script requeueing its own job, and the requeued job finishing the run -- with runs_dir in an S3 bucket (a real
server on loopback) and each start of the job on its own disk, as on a cluster without a shared filesystem.
Skipped with the reason where the daemons are missing or cannot start (`.ci/run` installs them)."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import REPO, TINY_RECIPE, write
from .s3_server import serving

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing or os.geteuid() != 0:
        pytest.skip(
            f"a real SLURM needs root and {', '.join(missing) or 'the daemons'} (apt-get install slurmctld "
            "slurmd slurm-client munge)"
        )
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname()
    ctld_port, d_port = _free_ports(2)
    conf = write(
        root / "slurm.conf",
        f"""
        ClusterName=dlrtest
        SlurmctldHost={host}(127.0.0.1)
        SlurmUser=root
        SlurmdUser=root
        SlurmctldPort={ctld_port}
        SlurmdPort={d_port}
        AuthType=auth/munge
        AuthInfo=socket={root}/munge.sock
        CredType=cred/munge
        StateSaveLocation={root}/state
        SlurmdSpoolDir={root}/spool
        SlurmctldPidFile={root}/slurmctld.pid
        SlurmdPidFile={root}/slurmd.pid
        SlurmctldLogFile={root}/log/slurmctld.log
        SlurmdLogFile={root}/log/slurmd.log
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        MpiDefault=none
        SchedulerType=sched/backfill
        SelectType=select/cons_tres
        SelectTypeParameters=CR_Core
        ReturnToService=2
        JobRequeue=1
        MinJobAge=600
        NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
        PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
    """,
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = []
    try:
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={root}/munge.sock",
                f"--key-file={key}",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/log/munged.log",
                f"--seed-file={root}/munge.seed",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        started.append(root / "munged.pid")
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon, "-f", str(conf)], check=True, capture_output=True, env=env, timeout=30)
            started.append(root / f"{daemon}.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env).stdout.strip()
            if state == "idle":
                break
            time.sleep(1)
        else:
            pytest.skip(
                f"the one-node SLURM did not become idle: {(root / 'log' / 'slurmctld.log').read_text()[-1500:]}"
            )
    except (subprocess.CalledProcessError, OSError) as exc:
        _stop(started)
        pytest.skip(f"cannot start SLURM here: {getattr(exc, 'stderr', exc)}")
    try:
        yield env
    finally:
        _stop(started, env)


def _stop(pid_files: list[Path], env: dict | None = None) -> None:
    """Cancel every job (its processes end with it), then stop the daemons."""
    if env is not None:
        subprocess.run(["scancel", "--full", "--signal=KILL", "--user=root"], env=env, capture_output=True, timeout=30)
        time.sleep(1)
    for pid_file in reversed(pid_files):
        pid = _pid(pid_file)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _job(env: dict, job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=env).stdout
    return dict(part.split("=", 1) for part in out.split() if "=" in part)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("s3"), "runs") as server:
        yield server


@pytest.mark.slow
def test_the_time_limit_signal_requeues_the_job_which_finishes_the_run_on_another_disk(slurm, bucket, tmp_path):
    """The time limit's signal comes from SLURM to the job's steps (scancel --signal=USR1 sends the same signal to
    the same processes, at a known epoch instead of 5-35 s into a 1-minute limit): the run stops with a
    checkpoint, the script requeues its own job, and the second start finishes the run from the bucket."""
    recipe = write(tmp_path / "tiny.yaml", TINY_RECIPE)
    recipe.write_text(
        recipe.read_text() + f"runs_dir: s3://runs/slurm\nimports: [{REPO / 'tests' / 'fault_injection.py'}]\n"
        "callbacks: {slow_batches: {seconds: 0.05}}\n"
    )
    # each start of the job stages the run on a disk of its own: only the bucket carries it from one to the next
    node = write(
        tmp_path / "dlrecipes-on-a-node",
        f"""#!/bin/bash
        export DLRECIPES_STAGING_DIR={tmp_path}/disk-of-start-${{SLURM_RESTART_COUNT:-0}}
        exec {REPO / ".venv" / "bin" / "dlrecipes"} "$@"
    """,
    )
    node.chmod(0o755)
    out = tmp_path / "slurm-%j.out"
    # 40 epochs of 3 batches of at least 50 ms: at least 4 s of training left when the signal comes after epoch 2
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--time=5",
            f"--chdir={REPO}",
            f"--output={out}",
            f"--export=ALL,DLRECIPES={node}",
            str(REPO / "scripts" / "slurm" / "train.sbatch"),
            str(recipe),
            "trainer.max_duration=40ep",
            "checkpoint.save_interval=5ep",
            "checkpoint.keep=2",
        ],
        capture_output=True,
        text=True,
        env={**slurm, **bucket.env()},
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.time() + 180
    while time.time() < deadline and not any(
        len(h.read_text().splitlines()) >= 3 for h in tmp_path.glob("disk-of-start-0/**/history.csv")
    ):
        time.sleep(0.2)
    signalled = subprocess.run(["scancel", "--signal=USR1", job], env=slurm, capture_output=True, text=True, timeout=30)
    assert signalled.returncode == 0, signalled.stderr
    requeued = False
    while time.time() < deadline:
        info = _job(slurm, job)
        if info.get("Restarts") == "1" and info.get("JobState") == "PENDING" and not requeued:
            requeued = True  # the requeued instance starts without SLURM's 2-minute wait; not in the second its
            # first instance's credential was revoked: slurmd would refuse the launch ("Job credential revoked": a
            # credential made no later than the revocation, to the second) and fail the job
            time.sleep(2)
            subprocess.run(
                ["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm, capture_output=True, timeout=30
            )
        if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(0.5)
    log = Path(str(out).replace("%j", job)).read_text()
    assert requeued and info.get("JobState") == "COMPLETED", (info.get("JobState"), log[-3000:])
    assert "stopped by SIGUSR1 after batch" in log and f"requeueing job {job}" in log and "start 2" in log
    assert "crashed" not in log and "Traceback" not in log
    assert "resuming from" in log.split("start 2")[1]  # the second start, on an empty disk, resumed from the bucket
    assert [d.name for d in sorted(tmp_path.glob("disk-of-start-*"))] == ["disk-of-start-0", "disk-of-start-1"]
    history = bucket.read("runs", f"slurm/tiny-slurm-{job}/history.csv").decode().splitlines()
    assert [int(r["epoch"]) for r in csv.DictReader(history)] == list(range(1, 41))  # every epoch once
