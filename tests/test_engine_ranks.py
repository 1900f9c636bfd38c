"""Our Trainer in two gloo processes (tests/engine_ranks.py): uneven per-rank data, a NaN on one
rank, a stalled peer, the host-side reductions a steady step makes and a gloo interface failure."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from . import forked
from .conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    scenario: str,
    out: Path,
    world: int = 2,
    timeout: float = 120,
    env: dict | None = None,
    stop_on_error: bool = False,
):
    """Start ``world`` processes of the scenario; returns [(exit code, stderr)] and, per rank, the
    seconds until it had ended (rank 0 first)."""
    out.mkdir(parents=True, exist_ok=True)
    port, procs, start = _free_port(), [], time.monotonic()
    for rank in range(world):
        rank_env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "NODE_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        # a process of its own, forked from one that has imported torch and Composer (tests/forked.py)
        procs.append(
            forked.start(
                [scenario, str(out)],
                REPO,
                out / f".out{rank}",
                out / f".err{rank}",
                rank_env,
                module="tests.engine_ranks",
            )
        )
    results, ended = [], []
    try:
        for rank, proc in enumerate(procs):
            remaining = max(1.0, timeout - (time.monotonic() - start))
            if proc.wait(remaining) is None:
                raise subprocess.TimeoutExpired(f"rank {rank} of {scenario}", remaining)
            results.append((proc.returncode, (out / f".err{rank}").read_text(errors="replace")))
            ended.append(time.monotonic() - start)
            if proc.returncode and stop_on_error:  # the others would only wait for their own timeouts
                for other in procs:
                    other.kill()
    finally:
        for proc in procs:
            proc.kill()
    return results, ended


def _ranks(out: Path, world: int = 2) -> list[dict]:
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _same_params(records: list[dict]) -> None:
    for name, value in records[0]["params"].items():
        for other in records[1:]:
            assert torch.equal(value, other["params"][name]), name


@pytest.mark.slow
def test_uneven_per_rank_data_trains_the_shorter_length_on_every_rank(tmp_path):
    results, seconds = run_ranks("uneven", tmp_path)
    assert [code for code, _ in results] == [0, 0], [err[-1500:] for _, err in results]
    records = _ranks(tmp_path)
    assert [r["batches"] for r in records] == [10, 10]  # 2 epochs of 5 batches: the shorter rank's length
    assert [r["samples"] for r in records] == [2 * (4 * 8 + 2 + 4)] * 2  # both ranks' samples, counted on the host
    _same_params(records)
    assert records[0]["losses"] == records[1]["losses"] and len(records[0]["losses"]) == 10  # every batch, averaged
    assert records[0]["train_top1"] == records[1]["train_top1"]  # computed together at the epoch's end
    assert records[0]["reductions"] >= 10 * 3  # per batch: the end of the data, the batch size, the samples
    # Composer's own Trainer on the same data: the same weights, counts and logged losses
    results, _ = run_ranks("uneven", tmp_path / "reference", env={"REFERENCE": "1"})
    assert [code for code, _ in results] == [0, 0], [err[-1500:] for _, err in results]
    reference = _ranks(tmp_path / "reference")
    _same_params([records[0], reference[0]])
    assert reference[0]["samples"] == records[0]["samples"] and reference[0]["losses"] == records[0]["losses"]


@pytest.mark.slow
def test_equal_shards_take_no_host_reduction_in_a_steady_step(tmp_path):
    results, _ = run_ranks("equal", tmp_path)
    assert [code for code, _ in results] == [0, 0], [err[-1500:] for _, err in results]
    records = _ranks(tmp_path)
    assert [r["batches"] for r in records] == [10, 10] and [r["samples"] for r in records] == [80, 80]
    assert [r["reductions"] for r in records] == [2, 2]  # one per epoch: the ranks compare their batch plans
    _same_params(records)


@pytest.mark.slow
def test_a_nan_on_one_rank_is_skipped_by_every_rank(tmp_path):
    results, _ = run_ranks("nan_skip", tmp_path)
    assert [code for code, _ in results] == [0, 0], [err[-1500:] for _, err in results]
    records = _ranks(tmp_path)
    assert [r["skipped"] for r in records] == [1, 1]
    _same_params(records)
    assert all(torch.isfinite(v).all() for v in records[0]["params"].values())


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_every_rank_with_one_line(tmp_path):
    results, seconds = run_ranks("nan_stop", tmp_path, timeout=90)
    assert [code for code, _ in results] == [2, 2]
    for _, err in results:
        assert (
            err.strip().splitlines()[-1].startswith("error: nan_monitor: the loss is not finite at batch 4 (epoch 1)")
        )
        assert "Traceback" not in err


@pytest.mark.slow
def test_a_stalled_peer_ends_the_run_after_dist_timeout_with_one_line(tmp_path):
    results, seconds = run_ranks("stalled_peer", tmp_path, timeout=90, stop_on_error=True)
    code, err = results[0]  # rank 0 waited for rank 1, which sleeps for 25 s
    assert code == 2 and "another process of this run stopped or stopped answering" in err, err[-1500:]
    assert "Traceback" not in err
    # rank 0 gave up after dist_timeout (4 s) while rank 1 still slept: rank 1 never ended by itself, the test
    # stopped it (had rank 0 waited the 25 s out, rank 1 would have gone on and ended on its own)
    assert results[1][0] == -signal.SIGKILL, results[1][1][-1500:]


@pytest.mark.slow
def test_a_gloo_interface_that_does_not_exist_is_one_line_naming_gloo_socket_ifname(tmp_path):
    results, _ = run_ranks("uneven", tmp_path, timeout=90, env={"GLOO_SOCKET_IFNAME": "nosuchif0"})
    for code, err in results:
        assert code == 2, err[-1500:]
        line = err.strip().splitlines()[-1]
        assert (
            line.startswith("error: the process group (torch.distributed, gloo) could not connect")
            and "GLOO_SOCKET_IFNAME=nosuchif0" in line
        ), line
