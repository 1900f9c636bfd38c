"""The offline wheelhouse: built here (needs the package index), installed with --no-index into a
fresh venv whose torch comes from elsewhere, as on a cluster whose torch is a site module."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrecipes.tools.wheelhouse import TORCH_STACK, closure, requirements

from .conftest import REPO, TINY_RECIPE, write


def _site_torch(folder: Path) -> Path:
    """The installed torch stack (torch, torchvision and what they need) linked into one folder,
    the way a cluster module puts its torch on the path."""
    folder.mkdir(parents=True)
    for name in closure([(n, ()) for n in TORCH_STACK]):
        dist = metadata.distribution(name)
        site = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, link = site / top, folder / top
            if source.exists() and not link.exists() and not top.startswith(".."):
                link.symlink_to(source)
    return folder


def test_the_wheelhouse_leaves_the_torch_stack_out_and_keeps_the_rest():
    held = requirements(["ffcv"])
    assert not {"torch", "torchvision", "triton", "nvidia-cudnn-cu12", "numpy"} & set(
        held
    )  # the target's torch has them
    assert {"mosaicml", "mosaicml-cli", "timm", "torchmetrics", "typer", "ffcv", "numba", "opencv-python"} <= set(held)
    assert held["mosaicml"] == f"mosaicml=={metadata.version('mosaicml')}"  # the versions tested here


def test_a_target_python_s_own_needs_are_followed_too():
    """Markers are read for the target: Python 3.10 needs backports this 3.11+ machine does not have."""
    held = requirements(python_version="3.10")
    assert "tomli" not in requirements() and held["tomli"].startswith("tomli")  # huggingface-hub's, below 3.11
    try:  # installed here anyway (by another package): pinned to that version; else the requiring specifier
        assert held["tomli"] == f"tomli=={metadata.version('tomli')}"
    except metadata.PackageNotFoundError:
        assert "==" not in held["tomli"] and held["tomli"].startswith("tomli>")


@pytest.mark.slow
def test_built_here_installed_offline_next_to_an_existing_torch(tmp_path):
    out = tmp_path / "wheelhouse"
    built = subprocess.run(
        [sys.executable, "-m", "dlrecipes", "wheelhouse", str(out), "--extra", "ffcv"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    install = next(line.strip() for line in built.stdout.splitlines() if line.strip().startswith("pip install"))
    assert "--no-index" in install and not list(out.glob("torch-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    site_torch = _site_torch(tmp_path / "site-torch")
    (site_packages / "site_torch.pth").write_text(f"{site_torch}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHONNOUSERSITE="1")
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", *install.split()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]

    python = str(venv / "bin" / "python")
    recipe = write(tmp_path / "tiny.yaml", TINY_RECIPE)
    # one Python of the new venv says where torch and dlrecipes come from, then trains as `python -m dlrecipes`
    train = ["dlrecipes", "train", str(recipe), f"runs_dir={tmp_path}/runs"]
    run = subprocess.run(
        [
            python,
            "-c",
            "import runpy, sys, torch, composer, ffcv, dlrecipes; print(torch.__file__); "
            f"print(dlrecipes.__file__, flush=True); sys.argv = {train!r}; "
            "runpy.run_module('dlrecipes', run_name='__main__', alter_sys=True)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0 and "done: 2 epochs" in run.stderr, run.stderr[-3000:]
    torch_file, dlrecipes_file = run.stdout.split()[:2]
    assert torch_file.startswith(str(site_torch))  # the existing torch, not a new one
    assert dlrecipes_file.startswith(str(site_packages))  # dlrecipes from the wheelhouse, not this checkout


@pytest.mark.slow
def test_a_wheelhouse_for_another_python_holds_wheels_for_it(tmp_path):
    target = "3.12" if sys.version_info[:2] != (3, 12) else "3.11"
    out = tmp_path / "wheelhouse"
    built = subprocess.run(
        [sys.executable, "-m", "dlrecipes", "wheelhouse", str(out), "--python-version", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = [w.name for w in out.glob("*.whl")]
    tag = "cp" + target.replace(".", "")
    for wheel in wheels:
        python_tag, abi_tag = wheel[:-4].split("-")[-3:-1]
        pythons = python_tag.split(".")
        assert abi_tag in ("none", "abi3", tag) and (tag in pythons or "py3" in pythons or abi_tag == "abi3"), wheel
    pinned = [line for line in (out / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert len(pinned) == len(requirements(python_version=target)) + 1 and len(wheels) == len(pinned)
