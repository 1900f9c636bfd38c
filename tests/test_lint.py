"""The linter (ruff, configured in pyproject.toml) finds nothing in the package, the tests, the benchmarks and the
scripts: unused imports and names, undefined names, shadowed definitions, ambiguous names, lines over 120 characters
and the like; and the formatter (ruff format) would change nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

RUFF = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))  # the dev extra installs it


def test_ruff_finds_nothing():
    result = subprocess.run(
        [RUFF, "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_code_is_formatted():
    result = subprocess.run(
        [RUFF, "format", "--check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"run `ruff format .`:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
