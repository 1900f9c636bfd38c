"""The worked plugin examples: a local file and an installable package with an entry point."""

from __future__ import annotations

import importlib.util
import os

import pytest

from .conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def test_local_plugin_file_trains_through_the_cli(tiny_recipe, tmp_path):
    result = run_cli(
        "train",
        str(tiny_recipe),
        "--plugin",
        str(REPO / "examples" / "local_plugin.py"),
        "algorithms.input_jitter={std: 0.1}",
        "trainer.max_duration=2ba",
        "run_name=jitter",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 0 epochs, 2 batches" in result.stderr


def test_installed_example_package_registers_by_entry_point_and_trains(tiny_recipe, tmp_path):
    if importlib.util.find_spec("dlrecipes_gradient_noise") is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs examples/plugin_package (see README's test command)")
        pytest.skip("pip install ./examples/plugin_package to run this test")
    listing = run_cli("list", "algorithms").stdout
    assert "gradient_noise" in listing
    result = run_cli(
        "train",
        str(tiny_recipe),
        "algorithms.gradient_noise={eta: 0.05}",
        "run_name=noisy",
        "trainer.max_duration=1ep",
        "trainer.console_log_interval=1ba",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "runs" / "noisy" / "train-rank0.log").read_text()
    assert "gradient_noise/std" in log
