"""Shared test helpers: tiny recipes and a way to run the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"


from dlrecipes.plugins import load_builtins

load_builtins()  # at collection time: tests parametrize over the registries


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


TINY_RECIPE = """
    model: {name: cnn_simple, width: 4, hidden: 16}
    dataset: {name: digits, image_size: 8, augment: false}
    trainer:
      max_duration: 2ep
      batch_size: 64
      num_workers: 0
      progress_bar: false
      device: cpu
      train_subset_num_batches: 3
      eval_subset_num_batches: 2
    optimizer: {name: sgd, lr: 0.05}
    checkpoint: {save_interval: 1ep, keep: -1, monitor: top1}
"""


def image_folders(root: Path, classes, per_class: int = 2, size: tuple[int, int] = (40, 30)) -> Path:
    """Random-pixel JPEGs of ``size`` (width, height) in root/{train,val}/<class>/<i>.jpg."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.jpg")
    return root


@pytest.fixture
def tiny_recipe(tmp_path: Path) -> Path:
    """A recipe that trains a 4-channel CNN on 8x8 digits for 3 batches an epoch."""
    path = write(tmp_path / "tiny.yaml", TINY_RECIPE)
    path.write_text(path.read_text() + f"runs_dir: {tmp_path / 'runs'}\n")
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300, module: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m dlrecipes ARGS`` (or any command) and capture its output."""
    cmd = [sys.executable, "-m", "dlrecipes", *args] if module else list(args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=env)
