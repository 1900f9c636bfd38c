"""The run store chosen from an address: every object store Composer's URI factory knows (s3://, gs://, oci://,
azure://) is a bucket store, parsed and checked by the same rules; one whose library is not installed is one line."""

from __future__ import annotations

import pytest

from dlrecipes.errors import UserError
from dlrecipes.records.store import open_for_reading, store_for

from .conftest import run_cli


@pytest.mark.parametrize(
    "address, staged",
    [
        ("s3://runs/exp", "runs/exp"),
        ("gs://my_runs/a/b", ".gs/my_runs/a/b"),
        ("oci://Runs.1/x", ".oci/Runs.1/x"),
        ("azure://runs-1/x", ".azure/runs-1/x"),
    ],
)
def test_each_scheme_composer_knows_is_a_bucket_store(address, staged, tmp_path, monkeypatch):
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path))
    store = store_for(address)
    assert type(store).__name__ == "BucketStore" and str(store.root) == address
    assert store.root.staging() == tmp_path / staged  # no two schemes' buckets share a staging folder
    assert type(store_for("runs")).__name__ == "LocalStore"
    with pytest.raises(
        UserError,
        match=r"^runs_dir: 'ftp://x/y' is an address, and runs cannot be kept at ftp:// "
        r"ones; give a local folder or s3://BUCKET/PREFIX",
    ):
        store_for("ftp://x/y")  # not a local folder named "ftp:"


@pytest.mark.parametrize(
    "address, said",
    [
        (
            "gs://-bad/x",
            "'-bad' is not a valid bucket name (3 to 63 lowercase letters, digits, dots, hyphens and underscores",
        ),
        ("azure://a--b/x", "'a--b' is not a valid bucket name (3 to 63 lowercase letters, digits and single hyphens"),
        ("oci://b/x/../y", "the prefix has a '..' segment; give oci://BUCKET/PREFIX with plain folder names"),
        ("gs://user:pw@bucket/x", "GS credentials are not taken from the address"),
    ],
)
def test_an_address_is_checked_by_its_services_rules(address, said):
    with pytest.raises(UserError, match="^runs_dir: ") as caught:
        store_for(address)
    assert said in str(caught.value) and "pw" not in str(caught.value)


def test_a_store_whose_library_is_missing_is_one_line_before_anything(tiny_recipe, tmp_path, monkeypatch):
    """Composer installed without its GCS extra: gs:// is refused naming the address and the extra to install, and
    nothing is created; a command reading a run there says the same."""
    pytest.importorskip("composer")
    try:
        import google.cloud.storage  # noqa: F401

        pytest.skip("google-cloud-storage is installed here")
    except ImportError:
        pass
    monkeypatch.setenv("DLRECIPES_STAGING_DIR", str(tmp_path / "staging"))
    result = run_cli("train", str(tiny_recipe), "runs_dir=gs://my-runs/exp", "run_name=x", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: runs_dir: gs://my-runs/exp: Composer's gs:// store cannot be made here: ")
    assert "mosaicml[gcs]" in result.stderr and not (tmp_path / "staging").exists()
    with pytest.raises(UserError, match="^run: gs://my-runs/exp: Composer's gs:// store cannot be made here"):
        open_for_reading("gs://my-runs/exp/x")


def test_the_upload_process_leaves_the_signals_to_training(monkeypatch):
    """Ctrl-C or SLURM's SIGTERM reach the whole process group; the upload process ignores them (training answers
    them, and its checkpoint still goes up): after SIGINT and SIGTERM it still answers, here an upload of a file that
    is not there with its error, and it ends when its stdin closes."""
    import os
    import signal
    import time

    from dlrecipes.records.store.upload_process import UploadProcess

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    process = UploadProcess("a-bucket", 2)
    with pytest.raises(RuntimeError, match="FileNotFoundError|No such file"):
        process.upload("k", "/no/such/file")  # started, and answering
    child = process._process
    time.sleep(0.5)  # its signal handlers are set before it reads its first request: it answered one
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(child.pid, sig)
    time.sleep(0.3)
    assert child.poll() is None and process.usable()
    with pytest.raises(RuntimeError, match="FileNotFoundError|No such file"):
        process.upload("k", "/no/such/file")
    process.close()
    assert child.returncode == 0


@pytest.mark.parametrize(
    "options, overrides, said",
    [
        ({"resume": True, "restart": True}, [], "--resume continues a run and --restart starts it over: give one"),
        ({"restart": True}, [], "--restart: name the run to start over with run_name=..."),
        ({"resume": True}, ["checkpoint.best_only=true"], "--resume needs periodic checkpoints (checkpoint.save=true"),
    ],
)
def test_run_options_that_cannot_go_together_are_refused_in_one_line(tiny_recipe, options, overrides, said):
    """--resume with --restart, --restart without a run_name, --resume without periodic checkpoints: refused by the
    options themselves (RunOptions.check), the one check train and launch make before anything starts."""
    from dlrecipes.api import resolve
    from dlrecipes.records.store import RunOptions

    config = resolve(tiny_recipe, overrides)
    with pytest.raises(UserError) as refused:
        RunOptions(**options).check(config)
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)
    RunOptions(resume=True).check(resolve(tiny_recipe, ["run_name=kept"]))  # what goes together passes
