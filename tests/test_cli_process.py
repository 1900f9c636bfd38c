"""Every command as a real process gives what the suite sees in this process.

The other tests run the CLI in the pytest process (tests/conftest.py ``run_cli``: the same ``main`` with its
output captured), which saves the seconds a new Python spends importing torch and Composer. This module keeps
the process contract itself under test: for each command, ``python -m dlrecipes ...`` as a child process
exits with the same code and prints the same (timings aside) as the in-process call, and a user error is
one line on stderr with exit code 2, no traceback, from the console script as from ``python -m``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from .conftest import RECIPES, run_cli

pytestmark = pytest.mark.slow  # a fresh Python per command (a few seconds each)

TIMING = re.compile(r"\b\d[\d,.]*\s*(img/s|s|ms|MB|GB)\b|\b\d+\.\d+e[-+]\d+\b")
TIMING_KEYS = {
    "img_s",
    "images_per_sec",
    "seconds",
    "elapsed_sec",
    "time_s",
    "wall_s",
    "latency_ms",
    "throughput",
    "images_per_second",
    "duration_s",
}


def _both(*args: str, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    return run_cli(*args, cwd=cwd), run_cli(*args, cwd=cwd, subprocess_=True)


def _untimed(value):
    """A JSON document without the fields that measure time or speed (they differ between any two runs)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING_KEYS and not k.endswith(("_s", "_ms"))}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _same(inside: subprocess.CompletedProcess, child: subprocess.CompletedProcess, as_json: bool = False) -> None:
    assert inside.returncode == child.returncode, (inside.stderr[-2000:], child.stderr[-2000:])
    if as_json:
        assert _untimed(json.loads(inside.stdout)) == _untimed(json.loads(child.stdout))
    else:
        assert TIMING.sub("#", inside.stdout) == TIMING.sub("#", child.stdout)


@pytest.fixture(scope="module")
def digit_png(tmp_path_factory) -> Path:
    from dlrecipes.data.digits import load_digits_arrays

    images, _ = load_digits_arrays()
    path = tmp_path_factory.mktemp("png") / "digit.png"
    Image.fromarray((images[0] * 15).astype(np.uint8)).save(path)
    return path


def test_commands_that_read_a_finished_run(trained_tiny, digit_png, tmp_path):
    _same(*_both("eval", str(trained_tiny), "--json", "--out", str(tmp_path / "eval")), as_json=True)
    _same(*_both("predict", str(trained_tiny), str(digit_png), "--json"), as_json=True)
    _same(*_both("runs", str(trained_tiny.parent)))
    _same(*_both("compare", str(trained_tiny), "--json"), as_json=True)
    inside, child = _both("export", str(trained_tiny), "--out", str(tmp_path / "export"))
    assert inside.returncode == child.returncode == 0, child.stderr[-2000:]
    assert (tmp_path / "export" / "model.torchscript.pt").is_file()
    copy = Path(shutil.copytree(trained_tiny, tmp_path / "runs" / "tiny"))
    drawn = run_cli("plot", str(copy), subprocess_=True)
    assert drawn.returncode == 0 and all(Path(line.split()[-1]).is_file() for line in drawn.stdout.splitlines()), (
        drawn.stderr[-2000:]
    )


def test_commands_that_read_a_recipe(tiny_recipe):
    _same(*_both("validate", str(tiny_recipe)))
    _same(*_both("show", str(tiny_recipe)))
    _same(*_both("list", "losses"))
    _same(*_both("profile", str(tiny_recipe), "--repeats", "1", "--warmup", "0", "--json"), as_json=True)


def test_training_and_a_sweep(tiny_recipe, tmp_path):
    one = ("trainer.max_duration=1ep", "trainer.train_subset_num_batches=1", "trainer.eval_subset_num_batches=1")
    inside = run_cli("train", str(tiny_recipe), *one, "run_name=inside")
    child = run_cli("train", str(tiny_recipe), *one, "run_name=child", subprocess_=True)
    assert inside.returncode == child.returncode == 0, child.stderr[-2000:]
    assert [line.split()[0] for line in inside.stderr.splitlines()] == [
        line.split()[0] for line in child.stderr.splitlines()
    ]  # the same lines, each starting alike
    runs = tiny_recipe.parent / "runs"
    assert (runs / "inside" / "summary.json").is_file() and (runs / "child" / "summary.json").is_file()
    # a sweep whose every point fails exits non-zero from a real process too
    swept = run_cli("sweep", str(tiny_recipe), "optimizer.lr=[1e12]", *one, "trainer.log_interval=1", subprocess_=True)
    assert swept.returncode != 0 and "Traceback" not in swept.stderr, swept.stderr[-2000:]


@pytest.mark.parametrize(
    "args, names",
    [
        (["train", "{recipe}", "trainer.bogus=1"], "trainer.bogus"),
        (["eval", "{missing}"], "no such run directory or checkpoint file"),
        (["predict", "{missing}", "x.png"], "{missing}"),
        (["validate", str(RECIPES / "no-such-recipe.yaml")], "no-such-recipe.yaml"),
    ],
)
def test_a_user_error_is_one_line_and_exit_2(args, names, tiny_recipe, tmp_path):
    fill = {"recipe": str(tiny_recipe), "missing": str(tmp_path / "nope")}
    args = [a.format(**fill) for a in args]
    names = names.format(**fill)
    inside, child = _both(*args)
    script = subprocess.run(
        [str(Path(sys.executable).parent / "dlrecipes"), *args], capture_output=True, text=True, timeout=300
    )
    for result in (inside, child, script):
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], (
            result.stderr[-2000:]
        )
    assert inside.stderr == child.stderr == script.stderr
