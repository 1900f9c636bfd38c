"""The linter (ruff, configured in pyproject.toml) finds nothing in the package, the tests, the benchmarks and the
scripts: unused imports and names, undefined names, shadowed definitions, ambiguous names and the like."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))  # the dev extra installs it
    result = subprocess.run(
        [ruff, "check", "--no-cache", "--output-format", "concise", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
