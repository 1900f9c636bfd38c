"""Distributed training on CPU (gloo): 2 processes, 2 nodes x 2 processes on loopback, resume under DDP, a
signal or a kill -9 to one rank, learning-rate scaling and the launch checks.

What the ranks do is tested on ranks started as Composer's launcher starts them (its environment: RANK,
WORLD_SIZE, LOCAL_RANK, ..., MASTER_PORT), each forked from the test server (tests/forked.py) instead of a new
Python under the launcher: the 2 x 5-10 s of imports per run are what made this module the suite's slowest.
What a launcher does (two nodes, stopping the other rank when one dies, passing a signal on to the ranks, its
exit codes) is tested through `composer -n 2 cli.py train` (Composer's) and `dlrecipes launch` (which starts the
ranks itself, with the environment Composer's launcher gives them: compared here)."""

from __future__ import annotations

import csv
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlrecipes.core.lr_scaling import scaled_lr
from dlrecipes.errors import UserError
from dlrecipes.tools.launch import plan_ranks

from .conftest import REPO, run_cli, write

PLUGIN = '''
import os
from dlrecipes.registry import callbacks, datasets


@datasets.register("indexed")
def indexed(samples: int = 32):
    """Test data: every pixel of image i is i, so a batch says which samples it holds."""
    import torch
    from torch.utils.data import TensorDataset
    from dlrecipes.data.splits import DatasetSplits

    x = torch.arange(samples, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, 8, 8).contiguous()
    y = torch.arange(samples) % 10
    return DatasetSplits(TensorDataset(x, y), TensorDataset(x[:8], y[:8]), 10, (1, 8, 8))


@callbacks.register("record_ranks")
def record_ranks(folder: str):
    """Test helper: save what this rank saw (sample ids per epoch, first batch) and its final weights."""
    import torch
    from composer.core import Callback
    from composer.utils import dist

    class Record(Callback):
        def __init__(self):
            self.seen, self.first_batch = {}, None

        def fit_start(self, state, logger):
            self.first_batch = int(state.timestamp.batch)

        def after_dataloader(self, state, logger):
            ids = state.batch[0][:, 0, 0, 0].round().long().tolist()
            self.seen.setdefault(int(state.timestamp.epoch), []).extend(ids)

        def fit_end(self, state, logger):
            params = {k: v.detach().cpu().clone() for k, v in state.model.state_dict().items()}
            torch.save({"seen": self.seen, "first_batch": self.first_batch, "params": params,
                        "world": dist.get_world_size()}, f"{folder}/rank{dist.get_global_rank()}.pt")

    return Record()
'''

RECIPE = """
    imports: [./ddp_plugin.py]
    model: {name: cnn_simple, width: 4, hidden: 8}
    dataset: {name: indexed}
    trainer: {max_duration: 1ep, batch_size: 8, num_workers: 0, progress_bar: false, device: cpu,
              console_log_interval: 1000ep}
    optimizer: {name: sgd, lr: 0.05}
    checkpoint: {save_interval: 1ep, monitor: null}
    plots: false  # test_loggers.py plots each shape of history
"""

COMPOSER = str(Path(sys.executable).parent / "composer")


def _ddp_recipe(folder: Path) -> Path:
    write(folder / "ddp_plugin.py", PLUGIN)
    path = write(folder / "ddp.yaml", RECIPE)
    (folder / "out").mkdir()
    path.write_text(
        path.read_text() + f"runs_dir: {folder}/runs\ncallbacks: {{record_ranks: {{folder: {folder}/out}}}}\n"
    )
    return path


@pytest.fixture
def ddp_recipe(tmp_path):
    return _ddp_recipe(tmp_path)


# 2 epochs of 4 batches, deterministic, each batch in 2 microbatches; the fault-injection plugin imported
UNINTERRUPTED = ["trainer.max_duration=2ep", "trainer.deterministic=true", "trainer.device_train_microbatch_size=2"]
FAULTS = f"imports=[./ddp_plugin.py, {REPO / 'tests' / 'fault_injection.py'}]"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """What each of 2 ranks saw and its final weights after an uninterrupted run of UNINTERRUPTED: the weights
    that a stopped or killed and resumed run must end with, and our Trainer's side against Composer's."""
    root = tmp_path_factory.mktemp("uninterrupted")
    _forked_ranks(root, str(_ddp_recipe(root)), "run_name=whole", *UNINTERRUPTED, FAULTS)
    return _ranks(root, 2)


def _launch(tmp_path, *args, nproc=2, extra=(), timeout=240, tag="a"):
    cmd = [
        COMPOSER,
        "-n",
        str(nproc),
        *extra,
        "--stdout",
        f"{tmp_path}/{tag}-out{{rank}}.txt",
        "--stderr",
        f"{tmp_path}/{tag}-err{{rank}}.txt",
        str(REPO / "cli.py"),
        "train",
        *args,
    ]
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), timeout


def _forked_ranks(tmp_path, *args, world=2, timeout=240, tag="a", command="train"):
    """``dlrecipes COMMAND ARGS`` (train by default) on ``world`` ranks with the environment Composer's launcher gives
    them, each a process forked from the test server; their output in ``{tag}-out{rank}.txt`` and
    ``{tag}-err{rank}.txt`` as the launcher would write it; asserts every rank ended with 0."""
    import os
    import time

    from tests import forked

    port, started = _free_port(), time.monotonic()
    ranks = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "NODE_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
        }
        ranks.append(
            forked.start(
                [command, *args], tmp_path, tmp_path / f"{tag}-out{rank}.txt", tmp_path / f"{tag}-err{rank}.txt", env
            )
        )
    try:
        for process in ranks:
            process.wait(max(1.0, timeout - (time.monotonic() - started)))
    finally:
        for process in ranks:
            process.kill()
    errors = "\n".join(p.read_text()[-2000:] for p in sorted(Path(tmp_path).glob(f"{tag}-err*.txt")))
    assert [p.returncode for p in ranks] == [0] * world, errors


def _wait(proc_timeout, tmp_path):
    proc, timeout = proc_timeout
    out, _ = proc.communicate(timeout=timeout)
    errors = "\n".join(p.read_text()[-2000:] for p in sorted(Path(tmp_path).glob("*-err*.txt")))
    assert proc.returncode == 0, out[-2000:] + errors


def _ranks(tmp_path, world):
    return [torch.load(tmp_path / "out" / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _same_params(records):
    first = records[0]["params"]
    for other in records[1:]:
        assert first.keys() == other["params"].keys()
        for k in first:
            assert torch.equal(first[k], other["params"][k]), k


@pytest.mark.slow
def test_two_processes_keep_identical_weights_and_share_the_epoch(ddp_recipe, tmp_path):
    _forked_ranks(tmp_path, str(ddp_recipe))
    records = _ranks(tmp_path, 2)
    assert all(r["world"] == 2 for r in records)
    _same_params(records)
    seen = [r["seen"][0] for r in records]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(32))  # every sample once in the epoch
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("ddp-")  # one run name, agreed across ranks
    assert {p.name for p in runs[0].glob("train-rank*.log")} == {"train-rank0.log", "train-rank1.log"}
    assert (runs[0] / "history.csv").exists() and (runs[0] / "checkpoints" / "ep1-ba4-rank0.pt").exists()


@pytest.mark.slow
def test_distillation_under_ddp_keeps_the_ranks_identical_and_the_teacher_out_of_the_checkpoint(ddp_recipe, tmp_path):
    """Each rank runs its own frozen teacher beside the DDP-wrapped student (no collective of its own): both ranks
    end with the same weights, the distillation loss is recorded, and the checkpoint holds the student alone."""
    from dlrecipes.models.architectures.simple_cnn import CNNSimple
    from dlrecipes.records.layout import RunDir

    torch.manual_seed(0)
    torch.save(CNNSimple(10, 1, width=8, hidden=8).state_dict(), tmp_path / "teacher.pt")
    _forked_ranks(
        tmp_path,
        str(ddp_recipe),
        "run_name=distilled",
        "algorithms.distillation="
        f"{{teacher: {{name: cnn_simple, width: 8, hidden: 8, checkpoint: {tmp_path / 'teacher.pt'}}}}}",
    )
    _same_params(_ranks(tmp_path, 2))
    run = RunDir(tmp_path / "runs" / "distilled")
    with open(run.history) as f:
        assert "train_distillation/loss" in next(csv.reader(f))
    saved = torch.load(run.checkpoints / "ep1-ba4-rank0.pt", map_location="cpu", weights_only=False)
    assert len(saved["state"]["model"]) == 8  # the student's 4 layers' weights and biases; the teacher has 8 more


@pytest.mark.slow
def test_resume_under_ddp_continues_from_the_saved_batch(ddp_recipe, tmp_path):
    _forked_ranks(tmp_path, str(ddp_recipe), "run_name=resumed")
    _forked_ranks(tmp_path, str(ddp_recipe), "run_name=resumed", "trainer.max_duration=2ep", "--resume", tag="b")
    records = _ranks(tmp_path, 2)
    assert [r["first_batch"] for r in records] == [4, 4]  # started where epoch 1 ended
    assert sorted(records[0]["seen"][1] + records[1]["seen"][1]) == list(range(32))
    _same_params(records)
    assert (tmp_path / "runs" / "resumed" / "checkpoints" / "ep2-ba8-rank0.pt").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_of_two_processes_on_loopback(ddp_recipe, tmp_path):
    port = _free_port()
    node = lambda rank: _launch(  # noqa: E731
        tmp_path,
        str(ddp_recipe),
        "run_name=nodes",
        tag=f"node{rank}",
        timeout=300,
        extra=("--world_size", "4", "--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port)),
    )
    nodes = [node(0), node(1)]
    for n in nodes:
        _wait(n, tmp_path)
    records = _ranks(tmp_path, 4)
    assert all(r["world"] == 4 for r in records)
    _same_params(records)
    assert sorted(sum((r["seen"][0] for r in records), [])) == list(range(32))


def test_learning_rate_scaling_rules():
    assert scaled_lr(0.1, "linear", 1024, 256) == pytest.approx(0.4)
    assert scaled_lr(0.1, "sqrt", 1024, 256) == pytest.approx(0.2)
    assert scaled_lr(0.1, "sqrt", 128, 512) == pytest.approx(0.05)
    assert scaled_lr(0.1, "none", 1024, 256) == 0.1
    assert scaled_lr(2.048, "linear", 2048, 2048) == 2.048
    assert math.isclose(scaled_lr(1.0, "linear", 96, 64), 1.5)


@pytest.mark.slow
def test_scaled_learning_rate_reaches_the_optimizer(tiny_recipe):
    from dlrecipes.api import resolve
    from dlrecipes.builders import build_optimizer

    config = resolve(tiny_recipe, ["optimizer={name: sgd, lr: 0.1, scale_lr: sqrt, reference_batch_size: 16}"])
    optimizer = build_optimizer(config.optimizer, torch.nn.Linear(2, 2), config.trainer.batch_size)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)  # batch 64 = 4 x 16
    result = run_cli(
        "train",
        str(tiny_recipe),
        "optimizer={name: sgd, lr: 0.1, scale_lr: linear, reference_batch_size: 32}",
        "trainer.max_duration=1ba",
        "run_name=scaled",
    )
    assert "optimizer.lr scaled (linear) from the reference batch 32 to the global batch 64: 0.2" in result.stderr


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc": 0}, "at least 1 process"),
        ({"nproc": 2, "nodes": 2}, "--master-addr and --master-port: required"),
        (
            {"nproc": 2, "nodes": 2, "node_rank": 2, "master_addr": "10.0.0.1", "master_port": 29500},
            "--node-rank: must be 0..1",
        ),
        ({"nproc": 1, "master_port": 80}, "--master-port: expected 1024..65535"),
    ],
)
def test_launch_refuses_bad_combinations(kwargs, message):
    with pytest.raises(UserError, match=message):
        plan_ranks(("train", "r.yaml"), **kwargs)


def test_launch_starts_each_rank_as_composers_launcher_does(tiny_recipe, tmp_path, monkeypatch):
    """Node 1 of 2, 4 processes each: every rank's command and distributed environment are those Composer's own
    launcher (its _launch_processes, with Popen recorded) gives the same ranks; a bad batch is refused first."""
    import os

    from composer.cli import launcher

    plan = plan_ranks(
        ("train", "r.yaml", "a=1"), nproc=4, nodes=2, node_rank=1, master_addr="10.1.1.1", master_port=29500
    )
    started = []

    class Recorded:
        def __init__(self, cmd, **kwargs):
            started.append((cmd, dict(os.environ)))

    monkeypatch.setattr(launcher.subprocess, "Popen", Recorded)
    launcher._launch_processes(
        nproc=4,
        world_size=8,
        base_rank=4,
        node_rank=1,
        master_addr="10.1.1.1",
        master_port=29500,
        module_mode=True,
        command_mode=False,
        training_script="dlrecipes",
        stdout_file_format=str(tmp_path / "out{rank}"),
        stderr_file_format=None,
        training_script_args=["train", "r.yaml", "a=1"],
        processes={},
    )
    base = {"PATH": "/bin", "MASTER_ADDR": "elsewhere"}  # what the command line gives wins, as in Composer's
    keys = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PYTHONUNBUFFERED",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    )
    assert len(started) == 4
    for local, (cmd, env) in enumerate(started):
        ours = plan.resolved(base).environment(base, local)
        assert cmd == [sys.executable, "-m", "dlrecipes", *plan.command]
        assert {k: ours[k] for k in keys} == {k: env[k] for k in keys} and ours["PATH"] == "/bin"
    assert [env["RANK"] for _, env in started] == ["4", "5", "6", "7"]
    one_node = plan_ranks(("train", "r.yaml"), nproc=2).resolved({})  # Composer's single-node defaults
    assert one_node.master_addr == "127.0.0.1" and 1024 <= one_node.master_port <= 65535
    assert plan_ranks(("train", "r.yaml"), nproc=2).resolved({"MASTER_PORT": "29999"}).master_port == 29999
    bad = run_cli("launch", str(tiny_recipe), "-n", "3")
    assert bad.returncode == 2 and "does not divide evenly over 3 processes" in bad.stderr


def _ranks_running(tmp_path, *programs: str):
    """A launch ``_Rank`` for each Python program, started now; rank 1's output to a file, as launch does."""
    from dlrecipes.tools.launch import _Rank

    ranks = []
    for rank, program in enumerate(programs):
        log = tmp_path / f"rank{rank}.txt" if rank else None
        with open(log or "/dev/null", "w") as out:
            process = subprocess.Popen(
                [sys.executable, "-c", program],
                stdout=out if rank else None,
                stderr=subprocess.STDOUT if rank else None,
            )
        ranks.append(_Rank(rank, process, str(log) if log else None))
    return ranks


def test_when_a_rank_fails_launch_ends_the_others_and_exits_with_its_code(tmp_path, capsys):
    """Rank 1 fails (exit 3); rank 0, which ignores SIGTERM, is ended with SIGKILL after the grace period; the
    job's exit code is rank 1's, and rank 1's output is shown."""
    import time

    from dlrecipes.tools.launch import _job_exit_code, _report, _supervise

    ranks = _ranks_running(
        tmp_path,
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
        "import sys; print('data/x.jpg: unreadable'); sys.exit(3)",
    )
    began = time.monotonic()
    _supervise(ranks, grace=0.5)
    assert time.monotonic() - began < 20 and ranks[0].process.returncode == -9 and ranks[0].ended_by_launch
    _report(ranks)
    err = capsys.readouterr().err
    assert "launch: rank 1 failed; ending the other ranks" in err
    assert "launch: rank 1 (pid" in err and "exited with code 3" in err and "data/x.jpg: unreadable" in err
    assert "rank 0 (pid" not in err  # ended by launch: not a failure of its own
    ended = sorted(ranks, key=lambda r: r.ended_at)
    assert _job_exit_code([(r.process.returncode, r.ended_by_launch) for r in ended]) == 3


def test_a_clean_stop_is_75_and_the_other_ranks_finish_theirs_unsignalled(tmp_path):
    """Rank 1 stops cleanly first (75); rank 0 is still writing its checkpoint for 1.5 s: it is given the time (no
    SIGTERM within the grace period) and the job's exit code is 75."""
    from dlrecipes.tools.launch import _job_exit_code, _supervise

    ranks = _ranks_running(tmp_path, "import sys, time; time.sleep(1.5); sys.exit(75)", "import sys; sys.exit(75)")
    _supervise(ranks, grace=30)
    assert [r.process.returncode for r in ranks] == [75, 75] and not any(r.ended_by_launch for r in ranks)
    assert _job_exit_code([(75, False), (75, False)]) == 75
    assert _job_exit_code([(75, False), (-15, True)]) == 75  # one still running after the grace period
    assert _job_exit_code([(0, False), (0, False)]) == 0 and _job_exit_code([(-9, False), (1, True)]) == 137
    assert _job_exit_code([(75, False), (1, False)]) == 1  # a failure besides the clean stop is said


def test_slurm_template_starts_one_launcher_per_node_with_its_rank(tmp_path):
    """Run the sbatch script with stand-ins for srun/scontrol/dlrecipes that record what they get."""
    import os
    import stat

    bin_dir = tmp_path / "bin"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    stubs = {
        bin_dir / "scontrol": 'printf "gpu-node-a\\ngpu-node-b\\n"',
        # srun runs its command once per node, as SLURM would, with that node's id
        bin_dir / "srun": 'shift; for id in 0 1; do SLURM_NODEID=$id "$@"; done',
        tmp_path / ".venv" / "bin" / "dlrecipes": f'echo "$@" >> {tmp_path}/calls.txt',
    }
    for path, body in stubs.items():
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-node-[a-b]",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_GPUS_ON_NODE": "8",
    }
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm" / "train.sbatch"), "recipes/x.yaml", "model={name: cifar_resnet18}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 2
    for rank, call in enumerate(calls):
        assert call.startswith("launch recipes/x.yaml model={name: cifar_resnet18} run_name=x-slurm-4242")
        assert f"-n 8 --nodes 2 --node-rank {rank} --master-addr gpu-node-a --master-port 24242" in call


def test_a_direct_launch_is_checked_like_dlrecipes_launch(tiny_recipe, monkeypatch):
    """`composer -n 4 cli.py train ...` on a 2-GPU node fails at validation, before anything starts,
    naming the mismatch; so does a global batch that does not divide over the processes."""
    import torch

    from dlrecipes.api import resolve
    from dlrecipes.errors import UserError

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match=r"4 processes per node but this node has 2 GPU\(s\)"):
        resolve(tiny_recipe, ["trainer.device=gpu"])
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(UserError, match="global batch size 64 does not divide evenly over 3 processes"):
        resolve(tiny_recipe)
    assert not (tiny_recipe.parent / "runs").exists()  # refused before a run directory was made


@pytest.mark.slow
def test_two_processes_train_bit_identically_to_composers_trainer(ddp_recipe, tmp_path, uninterrupted):
    """Our Trainer (host-side reductions over gloo) against Composer's own, 2 ranks, 2 microbatches each."""
    _forked_ranks(
        tmp_path,
        str(ddp_recipe),
        "run_name=reference",
        *UNINTERRUPTED,
        f"imports=[./ddp_plugin.py, {REPO / 'tests' / 'reference_engine.py'}]",
    )
    reference = _ranks(tmp_path, 2)
    _same_params(uninterrupted + reference)  # all four: each rank, both trainers
    assert [r["seen"] for r in uninterrupted] == [r["seen"] for r in reference]


def _finish(proc_timeout):
    proc, timeout = proc_timeout
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_both_with_a_checkpoint_and_resume_ends_identically(
    ddp_recipe, tmp_path, uninterrupted
):
    """Rank 1 alone gets SIGTERM after batch 3 of 8 (2 epochs of 4).  The ranks learn of it through a
    reduction started at batch 3's end and read at batch 4's (no step waits for it), so both stop
    after batch 4, rank 0 writes the checkpoint, and --resume ends with the uninterrupted run's weights."""
    common = [*UNINTERRUPTED, "checkpoint.save_interval=1ep"]
    faults = [FAULTS, "callbacks.fault_injection={signal_at_batch: 3, signal_rank: 1}"]
    code, rank0 = _finish(_launch(tmp_path, str(ddp_recipe), "run_name=cut", *common, *faults, tag="b"))
    assert code != 0  # the launcher reports the ranks' exit code 75 as a failure
    checkpoint = tmp_path / "runs" / "cut" / "checkpoints" / "ep0-ba4-rank0.pt"
    assert f"stopped by SIGTERM after batch 4 (epoch 1): checkpoint {checkpoint}" in rank0, rank0[-2000:]
    assert "stopped by SIGTERM after batch 4" in (tmp_path / "b-err1.txt").read_text()
    _forked_ranks(tmp_path, str(ddp_recipe), "run_name=cut", *common, *faults, "--resume", tag="c")
    resumed = _ranks(tmp_path, 2)
    assert [r["first_batch"] for r in resumed] == [4, 4]
    _same_params(uninterrupted + resumed)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGUSR1", "SIGHUP", "SIGINT"])
def test_a_signal_to_the_whole_job_reaches_the_ranks_through_launch(ddp_recipe, tmp_path, name):
    """What SLURM's --signal=USR1@120 does, a closed terminal or ssh session (SIGHUP) and Ctrl-C: the signal to
    every process of the job. The launchers must survive it so that the ranks can finish their checkpoint; the run
    is recorded as stopped, its lock released, launch ends with 75 and --resume continues it. For Ctrl-C the launch
    process has imported Composer's engine (a plugin does; a bucket or shards recipe did), whose import makes SIGINT
    a sys.exit(130): launch ended at once, silently, before its ranks' line."""
    import json
    import os
    import signal
    import time

    plugin = tmp_path / "imports_composer.py"
    plugin.write_text("import composer.core.engine  # installs Composer's SIGINT and SIGTERM handlers\n")

    cmd = [
        sys.executable,
        "-m",
        "dlrecipes",
        "launch",
        str(ddp_recipe),
        "-n",
        "2",
        "run_name=slurm",
        "trainer.max_duration=400ep",
        "checkpoint.save_interval=50ep",
        "--plugin",
        str(plugin),
    ]
    job = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    history = tmp_path / "runs" / "slurm" / "history.csv"
    deadline = time.time() + 240
    while not (history.exists() and len(history.read_text().splitlines()) >= 3) and time.time() < deadline:
        time.sleep(0.2)  # two epochs trained: the ranks' handlers are in place
    os.killpg(job.pid, getattr(signal, name))
    out, _ = job.communicate(timeout=240)
    assert job.returncode == 75 and f"stopped by {name} after batch" in out, out[-3000:]
    batch = int(out.split(f"stopped by {name} after batch ")[1].split()[0])
    latest = tmp_path / "runs" / "slurm" / "checkpoints" / "latest-rank0.pt"
    assert latest.resolve().name == f"ep{(batch - 1) // 4}-ba{batch}-rank0.pt"
    summary = json.loads((tmp_path / "runs" / "slurm" / "summary.json").read_text())
    assert summary["status"] == "stopped" and not (tmp_path / "runs" / "slurm" / "run.lock").exists()
    epochs = (batch + 3) // 4  # the epoch it stopped in, finished by the resumed run
    # the ranks resume forked: what they do on --resume is the same as through launch, whose --resume after a
    # SIGUSR1 stop test_slurm's requeued job runs (and test_multihost's lost host, on two hosts)
    resume = [f"trainer.max_duration={epochs}ep", "checkpoint.save_interval=50ep", "--resume"]
    _forked_ranks(tmp_path, str(ddp_recipe), "run_name=slurm", *resume, tag="resumed")
    assert _batch_of(latest) == epochs * 4


def _batch_of(path: Path) -> int:
    return int(path.resolve().name.split("-ba")[1].split("-")[0])


@pytest.mark.slow
def test_kill_9_of_one_rank_then_resume_ends_with_the_uninterrupted_weights(ddp_recipe, tmp_path, uninterrupted):
    """Rank 1 is SIGKILLed after batch 6 of 8 (a checkpoint every 2 batches); the launcher stops
    rank 0; --resume continues from batch 4 and ends where an uninterrupted run ends."""
    common = [*UNINTERRUPTED, "checkpoint.save_interval=2ba", FAULTS]
    code, out = _finish(
        _launch(
            tmp_path,
            str(ddp_recipe),
            "run_name=killed",
            *common,
            "callbacks.fault_injection={kill_at_batch: 6, kill_rank: 1}",
            tag="b",
        )
    )
    assert code != 0 and "exited with code" in out, out[-2000:]  # rank 1 killed; rank 0 lost its peer
    latest = tmp_path / "runs" / "killed" / "checkpoints" / "latest-rank0.pt"
    assert "-ba4-" in latest.resolve().name or "-ba6-" in latest.resolve().name  # batch 6's save may not have run
    _forked_ranks(tmp_path, str(ddp_recipe), "run_name=killed", *common, "--resume", tag="c")
    resumed = _ranks(tmp_path, 2)
    assert resumed[0]["first_batch"] in (4, 6)
    _same_params(uninterrupted + resumed)


@pytest.mark.slow
def test_batch_size_per_device_scales_the_global_batch_and_the_lr_with_the_processes(ddp_recipe, tmp_path):
    """The scaling tutorial's rule as one switch: 2 per device on 2 processes is a global batch of 4,
    and scale_lr (linear, tuned at batch 2) doubles the learning rate."""
    _forked_ranks(
        tmp_path,
        str(ddp_recipe),
        "run_name=perdev",
        "~trainer.batch_size",
        "trainer.batch_size_per_device=2",
        "optimizer={name: sgd, lr: 0.05, scale_lr: linear, reference_batch_size: 2}",
    )
    said = (tmp_path / "a-out0.txt").read_text() + (tmp_path / "a-err0.txt").read_text()
    assert "optimizer.lr scaled (linear) from the reference batch 2 to the global batch 4: 0.1" in said
    records = _ranks(tmp_path, 2)
    assert [len(r["seen"][0]) for r in records] == [16, 16]  # 32 samples, 8 steps of 2 per rank
    with open(tmp_path / "runs" / "perdev" / "history.csv") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == [8]
    _same_params(records)


def test_batch_size_and_batch_size_per_device_are_exclusive(tiny_recipe):
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    with pytest.raises(RecipeError, match=r"trainer.batch_size_per_device: set either it or trainer.batch_size"):
        resolve(tiny_recipe, ["trainer.batch_size_per_device=4"])
    assert resolve(tiny_recipe, ["~trainer.batch_size", "trainer.batch_size_per_device=4"]).trainer.batch_size == 4


def test_a_signal_before_a_process_catches_it_is_held_until_it_does(tmp_path):
    """The ranks start with the forwarded signals ignored and catch them from the start of training: a signal that
    reaches launch in between (SLURM's warning signal in a job's first seconds) is held for them, not lost."""
    import signal
    import time

    from dlrecipes.tools.launch import _HeldSignals

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as a rank starts: launch ignored it while starting the launcher
(folder / "ignoring").touch()
while not (folder / "go").exists():
    time.sleep(0.01)
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))  # as a rank does when training starts
deadline = time.time() + 30
while not got and time.time() < deadline:
    time.sleep(0.01)
(folder / "result").write_text("signalled" if got else "nothing came")
""",
            str(tmp_path),
        ]
    )
    deadline = time.time() + 30
    while not (tmp_path / "ignoring").exists() and time.time() < deadline:
        time.sleep(0.01)
    held = _HeldSignals(poll=0.05)
    held.send(child.pid, signal.SIGUSR1)  # while it ignores it
    (tmp_path / "go").touch()
    assert child.wait(timeout=60) == 0
    assert (tmp_path / "result").read_text() == "signalled"
