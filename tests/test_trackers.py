"""Experiment trackers get the whole run: the resolved recipe as parameters, the run's files, an honest
status; an unreachable one fails fast. MLflow is tested against a real tracking server on loopback."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dlrecipes.loggers.run_record import flat_parameters

from . import wandb_log
from .conftest import REPO, run_cli
from .test_distributed import _free_port


def _start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    # one request worker, and no job runner (MLflow's GenAI jobs; its consumers are Pythons of their own): by default
    # the server is 15 processes and about 55 s of CPU to start on 2 cores, this way 2 processes and 13 s
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'db.sqlite'}",
            "--artifacts-destination",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=open(folder / "server.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return server, uri
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    server.kill()
    raise AssertionError((folder / "server.log").read_text()[-3000:])


def _stop(server: subprocess.Popen) -> None:
    """Stop the server and everything it started: its job runner's consumers start sessions of their own, so
    the process group's SIGTERM alone leaves them running after the test."""
    import signal

    import psutil

    family = psutil.Process(server.pid).children(recursive=True)
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)
    for process in family:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    pytest.importorskip("mlflow.server")
    server, uri = _start_server(tmp_path_factory.mktemp("mlflow"))
    yield uri
    _stop(server)


def _mlflow(uri: str, run: str) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dlr")
    (found,) = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == run]
    run_id = found.info.run_id
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    artifacts |= {a.path for a in client.list_artifacts(run_id, "report")}
    top1 = [m.value for m in sorted(client.get_metric_history(run_id, "metrics/eval/top1"), key=lambda m: m.step)]
    return {
        "status": found.info.status,
        "params": found.data.params,
        "tags": found.data.tags,
        "artifacts": artifacts,
        "top1": top1,
    }


def _loggers(uri: str) -> str:
    return f'loggers={{mlflow: {{tracking_uri: "{uri}", experiment_name: dlr}}}}'


@pytest.mark.slow
def test_mlflow_server_gets_the_recipe_the_metrics_the_files_and_the_status(mlflow_server, tiny_recipe):
    result = run_cli("train", str(tiny_recipe), _loggers(mlflow_server), "run_name=tracked", "plots=true")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tiny_recipe.parent / "runs" / "tracked"
    got = _mlflow(mlflow_server, "tracked")
    assert got["status"] == "FINISHED"
    expected = flat_parameters(yaml.safe_load((run_dir / "recipe.yaml").read_text()))
    assert {k: got["params"].get(k) for k in expected} == expected  # every leaf of the resolved recipe
    assert got["params"]["optimizer.lr"] == "0.05" and got["params"]["model.name"] == "cnn_simple"
    assert got["tags"]["dlrecipes.device"] == "cpu" and got["tags"]["dlrecipes.world_size"] == "1"
    assert "dlrecipes.git_commit" not in got["tags"]  # the recipe lies in tmp_path, in no repository
    assert got["tags"]["dlrecipes.dlrecipes_commit"]  # the suite runs dlrecipes from its git checkout
    with open(run_dir / "history.csv", newline="") as f:
        history = [float(r["eval_top1"]) for r in csv.DictReader(f)]
    assert got["top1"] == pytest.approx(history, abs=1e-6)
    assert {"recipe.yaml", "summary.json", "history.csv", "loss.png", "report/confusion_matrix.csv"} <= got["artifacts"]
    assert not any(a.endswith(".pt") for a in got["artifacts"])  # checkpoints only when asked for


@pytest.mark.slow
def test_a_diverged_run_is_failed_in_mlflow_and_checkpoints_go_when_asked(mlflow_server, tiny_recipe):
    hot = run_cli(
        "train",
        str(tiny_recipe),
        _loggers(mlflow_server),
        "run_name=hot",
        "optimizer.lr=1e12",
        "trainer.log_interval=1",
        "checkpoint.save_interval=1ba",
    )
    assert hot.returncode == 3, hot.stderr[-3000:]
    assert _mlflow(mlflow_server, "hot")["status"] == "FAILED"
    kept = run_cli(
        "train",
        str(tiny_recipe),
        _loggers(mlflow_server).replace("}}", ", log_artifacts: checkpoint}}"),
        "run_name=kept",
    )
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "checkpoints/best.pt" in {a for a in _mlflow_artifacts(mlflow_server, "kept", "checkpoints")}


def _mlflow_artifacts(uri: str, run: str, folder: str) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dlr")
    (found,) = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == run]
    return [a.path for a in client.list_artifacts(found.info.run_id, folder)]


class _Link:
    """A TCP forwarder on loopback to ``port``: the client's way to the server. Cut, it is the server going away as
    the client sees it: open connections reset, new ones refused."""

    def __init__(self, port: int):
        import socket
        import threading

        self._port, self._sockets, self._cut = port, [], threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # cut
                return
            if self._cut.is_set():
                client.close()
                return
            server = socket.create_connection(("127.0.0.1", self._port))
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source, sink) -> None:
        import socket

        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        import socket
        import struct

        self._cut.set()
        self._listener.close()
        for end in self._sockets:  # a reset, as from a host whose server died
            try:
                end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                end.close()
            except OSError:
                pass


@pytest.mark.slow
def test_a_tracker_that_drops_out_mid_run_only_warns(mlflow_server, tiny_recipe, tmp_path):
    """The server goes away after the second of eight epochs (the link to it is cut: the module's server stays up
    for the other tests): one warning, the training goes on and its own records are complete. The training is a
    process of its own (forked from the test server: its whole output, read as it goes)."""
    from . import forked

    link = _Link(int(mlflow_server.rsplit(":", 1)[1]))
    out = tmp_path / "out.txt"
    process = forked.start(
        [
            "train",
            str(tiny_recipe),
            _loggers(link.uri),
            "run_name=dropped",
            "trainer.max_duration=8ep",
            "trainer.log_interval=1",
        ],
        tiny_recipe.parent,
        out,
        None,
    )
    deadline = time.time() + 300
    while "\n2/8" not in forked._read(out) and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    link.cut()  # after the second epoch
    code = process.wait(300)
    output = out.read_text()
    assert "\n2/8" in output and code == 0, output[-3000:]
    assert "warning: loggers.mlflow:" in output and "training goes on" in output and "Traceback" not in output
    with open(tiny_recipe.parent / "runs" / "dropped" / "history.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 8  # the run's own records are complete
    assert _mlflow(mlflow_server, "dropped")["params"]["optimizer.lr"] == "0.05"  # through the link, before the cut


def test_an_unreachable_mlflow_server_fails_at_once(tiny_recipe):
    port = _free_port()  # nothing listens there
    start = time.perf_counter()
    result = run_cli("train", str(tiny_recipe), _loggers(f"http://127.0.0.1:{port}"), "run_name=lonely")
    assert time.perf_counter() - start < 10
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"loggers.mlflow.tracking_uri: nothing answers at http://127.0.0.1:{port}/health" in result.stderr
    assert "start the server" in result.stderr
    assert not (tiny_recipe.parent / "runs" / "lonely").exists()  # nothing created


@pytest.mark.slow
def test_wandb_offline_run_gets_the_recipe_the_files_and_the_exit_code(tiny_recipe):
    ok = run_cli("train", str(tiny_recipe), "loggers={wandb: {offline: true}}", "run_name=wb", "plots=true")
    assert ok.returncode == 0, ok.stderr[-3000:]
    (offline,) = (tiny_recipe.parent / "runs" / "wb" / "wandb").glob("offline-run-*")
    got = wandb_log.run_summary(offline)
    assert got["config"]["optimizer"]["lr"] == 0.05 and got["config"]["model"]["name"] == "cnn_simple"
    assert {"device=cpu", "world_size=1"} <= set(got["tags"]) and got["exit_code"] == 0
    (files,) = got["artifacts"].values()
    assert {"recipe.yaml", "summary.json", "history.csv", "loss.png"} <= set(files)
    hot = run_cli(
        "train",
        str(tiny_recipe),
        "loggers={wandb: {offline: true}}",
        "run_name=wbhot",
        "optimizer.lr=1e12",
        "trainer.log_interval=1",
        "checkpoint.save_interval=1ba",
    )
    assert hot.returncode == 3
    (offline,) = (tiny_recipe.parent / "runs" / "wbhot" / "wandb").glob("offline-run-*")
    assert wandb_log.run_summary(offline)["exit_code"] == 3  # as `dlrecipes train` exits: diverged


def test_a_tracker_uploads_and_ends_the_run_once_though_composer_closes_again_at_exit():
    """Composer registers each engine's close to run again at interpreter exit (and forgets it only when the engine is
    garbage collected unclosed): the run's files went to the tracker twice, the second time as the process ended."""
    from dlrecipes.loggers.run_record import RecordsTheRun

    class Destination:
        def post_close(self):
            self.closed = getattr(self, "closed", 0) + 1

    class Tracker(RecordsTheRun, Destination):
        def __init__(self):
            self.record_dir, self.record_history, self.ended = Path("."), type("H", (), {"status": "finished"})(), []

        def _rank_zero(self):
            return True

        def record_end(self, status, paths):
            self.ended.append(status)

    tracker = Tracker()
    tracker.post_close()
    tracker.post_close()  # what Composer's atexit hook does
    assert tracker.ended == ["finished"] and tracker.closed == 1


def test_the_recipe_flattens_to_dotted_text_parameters():
    params = flat_parameters(
        {
            "optimizer": {"name": "sgd", "lr": 0.05},
            "algorithms": {},
            "tags": ["a", "b"],
            "x": None,
            "flag": True,
            "long": "y" * 7000,
        }
    )
    assert params == {
        "optimizer.name": "sgd",
        "optimizer.lr": "0.05",
        "algorithms": "{}",
        "tags": '["a", "b"]',
        "x": "null",
        "flag": "true",
        "long": "y" * 5997 + "...",
    }


@pytest.mark.slow
def test_a_secret_in_an_address_reaches_no_file_no_output_and_no_tracker(mlflow_server, tiny_recipe):
    """The MLflow address with a password (the server takes it, it checks none), a presigned URL's token in the
    description; MLflow, TensorBoard and W&B (offline) at once: the password is in no file of the run
    directory, the output, the server's parameters, the event files or W&B's log, and the resumed run
    (the same recipe) is told of no changed address."""
    secret = "hunter2-Zq9"
    uri = mlflow_server.replace("http://", f"http://bob:{secret}@")
    loggers = (
        f'loggers={{mlflow: {{tracking_uri: "{uri}", experiment_name: dlr}}, tensorboard: {{}}, '
        "wandb: {offline: true}}"
    )
    args = [
        str(tiny_recipe),
        loggers,
        "run_name=secret",
        f"description=data at https://h/x?token={secret}&n=1",
        "trainer.train_subset_num_batches=1",
        "trainer.eval_subset_num_batches=1",
    ]
    from . import forked  # processes of their own: all they and what they start (W&B's service) write is read

    first = forked.run(["train", *args, "trainer.max_duration=1ep"], REPO)
    assert first.returncode == 0, first.stderr[-3000:]
    again = forked.run(["train", *args, "trainer.max_duration=2ep", "--resume"], REPO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "changed settings: trainer.max_duration ('1ep' -> '2ep')\n" in again.stderr  # the address: no change
    for result in (first, again):
        assert secret not in result.stdout + result.stderr
    run_dir = tiny_recipe.parent / "runs" / "secret"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert [p for p in files if secret.encode() in p.read_bytes()] == []
    redacted = mlflow_server.replace("http://", "http://***@")
    recorded = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert recorded["loggers"]["mlflow"]["tracking_uri"] == redacted
    assert recorded["description"] == "data at https://h/x?token=***&n=1"
    from dlrecipes.records.resume_check import changes

    (before,) = run_dir.glob("recipe.before-*")  # the resume's other max_duration, and nothing else
    assert changes(yaml.safe_load(before.read_text()), recorded) == [("trainer.max_duration", "1ep", "2ep")]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("dlr").experiment_id
    runs = [r for r in client.search_runs([experiment]) if r.info.run_name == "secret"]
    assert len(runs) == 2  # the run and its resumed part, each with the recipe as parameters
    for found in runs:
        assert found.data.params["loggers.mlflow.tracking_uri"] == redacted
        assert found.data.params["description"] == "data at https://h/x?token=***&n=1"
        assert not [k for k, v in {**found.data.params, **found.data.tags}.items() if secret in v]
    events = list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert events and any(redacted.encode() in p.read_bytes() for p in events)  # the hparams are there, redacted
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2
    for folder in offline:
        config = wandb_log.run_summary(folder)["config"]
        assert config["loggers"]["mlflow"]["tracking_uri"] == redacted and secret not in json.dumps(config)
