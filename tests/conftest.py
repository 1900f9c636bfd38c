"""Shared test helpers: tiny recipes, a tiny run trained once per test process, and the CLI run in this process
(or a real one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

from dlrecipes.plugins import load_builtins

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"

# The suite draws the same examples every run (a failure is a bug, not bad luck); HYPOTHESIS_PROFILE=explore draws
# new ones, to look for more.
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

load_builtins()  # at collection time: tests parametrize over the registries


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker (and the processes its tests start) gets its share of the cores: N
    workers each running torch on every core would spend their time fighting over them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(threads)


_share_the_cores()


@pytest.fixture(autouse=True)
def _plugins_stay_in_their_test():
    """What a test's plugins register (a plugin file it loads, a recipe's ``imports:``, a package it installs in a
    temporary folder) leaves with the test: the registries are as before it, and its plugin modules unloaded, so
    that no other test in the same worker sees them (as no other process would). Installed packages' entry
    points are loaded first: they belong to every test."""
    from dlrecipes import plugins
    from dlrecipes.registry import REGISTRIES

    plugins.load_entry_points()
    before = {name: dict(registry._entries) for name, registry in REGISTRIES.items()}
    modules = set(sys.modules)
    yield
    for name, registry in REGISTRIES.items():
        if registry._entries != before[name]:
            registry._entries.clear()
            registry._entries.update(before[name])
    for module in set(sys.modules) - modules:
        path = str(getattr(sys.modules.get(module), "__file__", None) or "")
        if module.startswith("dlrecipes_plugin_") or (path and not path.startswith(_KEPT)):
            sys.modules.pop(module, None)


_KEPT = (sys.prefix, sys.base_prefix, str(REPO))  # installed packages, dlrecipes/ and tests/ stay imported


# The modules that take longest (seconds on 2 workers, measured 2026-11-26; test_sync_census 155 s on 2026-11-27), run
# first: with --dist loadfile each module runs whole on one worker, so the last to start must be a short one, or one
# worker ends alone (pyproject.toml turns xdist's own order off: it starts the modules with the most tests first). The
# SLURM job goes first: it mostly waits on the scheduler, which the other worker's work fills.
LONGEST_FIRST = (
    "test_slurm",
    "test_sync_census",
    "test_benchmarks",
    "test_sweep",
    "test_distributed",
    "test_docs_run",
    "test_wheelhouse",
    "test_ffcv",
    "test_train_e2e",
    "test_multihost",
    "test_shards",
    "test_shards_hosts",
    "test_torchrun",
    "test_data_order",
    "test_cli_process",
    "test_remote_runs",
    "test_bucket_faults",
    "test_algorithms",
    "test_notebooks",
    "test_trackers",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.nodeid.split("::")[0]).stem, len(rank)))  # stable: in-module order


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
    plots: false  # about 1 s of each tiny run's 1.4 s; tests of the PNGs say plots=true (plots_on_each_history_shape)
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


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory) -> Path:
    """The tiny recipe trained once per test process (2 epochs of 3 batches, a checkpoint each epoch, the best
    by top-1): the run directory ``runs/tiny``, which tests read and never change (``tiny_run`` is a copy)."""
    from dlrecipes import api

    root = tmp_path_factory.mktemp("trained_tiny")
    recipe = write(root / "tiny.yaml", TINY_RECIPE)
    result = api.train(recipe, [f"runs_dir={root / 'runs'}", "run_name=tiny", "plots=true"])  # a run as users have it
    assert result.run_dir == root / "runs" / "tiny"
    return result.run_dir


@pytest.fixture
def tiny_run(trained_tiny: Path, tmp_path: Path) -> Path:
    """A copy of ``trained_tiny`` in this test's ``tmp_path/runs/tiny``, to resume, damage or add to."""
    import shutil

    return Path(shutil.copytree(trained_tiny, tmp_path / "runs" / "tiny", symlinks=True))


def build_trainer(
    config, run_dir: Path, resume: bool = False, trust_checkpoint: bool = False, resume_from: Path | None = None
):
    """:func:`dlrecipes.builders.build_trainer` for a test that builds a run's Trainer by hand, in ``run_dir`` as it
    is (no store, no lock), the resume point ``resume_from`` or looked up as the fit stage does: the Trainer it
    built."""
    from dlrecipes.builders import build_trainer as build
    from dlrecipes.core.devices import resolve_device
    from dlrecipes.records.run_dir import find_resume_point
    from dlrecipes.records.store import RunOptions, TrainingRun

    point = resume_from or (
        find_resume_point(Path(run_dir), config.trainer.max_duration, trust_checkpoint) if resume else None
    )
    options = RunOptions(resume=resume, trust=trust_checkpoint)
    return build(
        TrainingRun.in_folder(config, Path(run_dir), resolve_device(config.trainer.device), options, point)
    ).trainer


def fit(config, resume: bool = False, trust_checkpoint: bool = False, verbose: bool = False, restart: bool = False):
    """:func:`dlrecipes.fit.fit` of the run ``config`` trains, opened in its store as ``dlrecipes train`` opens it."""
    from dlrecipes.fit import RunOptions, open_run
    from dlrecipes.fit import fit as fit_opened

    return fit_opened(open_run(config, RunOptions(resume, restart, trust_checkpoint, verbose)))


def prepare_run_dir(config, run_name: str, resume: bool) -> Path:
    """``runs/<run_name>/`` made and the resolved recipe recorded in it, as the fit stage does, for a test that
    builds the Trainer by hand."""
    from dlrecipes.records.run_dir import make_run_dir, record_recipe

    run = make_run_dir(Path(config.runs_dir) / run_name)
    record_recipe(run, config.to_dict(), resume)
    return run.path


def run_cli(
    *args: str, cwd: Path | None = None, timeout: int = 300, module: bool = True, subprocess_: bool = False
) -> subprocess.CompletedProcess:
    """Run ``dlrecipes ARGS`` and capture its output, exit code and all.

        In this process by default: the same ``main`` the console script runs, with stdout and stderr captured,
        the working directory and signal handlers restored afterwards, and whatever escapes ``main`` written as a
        traceback with exit code 1, as Python would. A call with the fault-injection plugin (it kills or signals its
    process) gets a process of its own, forked from a server that has imported everything once (tests/forked.py).
    ``subprocess_=True`` (one test per command keeps the real
        process contract under test) or ``module=False`` (any command) starts a real process; so does every call
        when DLRECIPES_TEST_SUBPROCESS=1.
    """
    in_process = module and not subprocess_ and os.environ.get("DLRECIPES_TEST_SUBPROCESS") != "1"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if in_process and any("fault_injection" in arg for arg in args):  # it kills or signals its process
        from tests import forked

        return forked.run(list(args), cwd or REPO, timeout, env)
    if in_process:
        return _run_in_process(list(args), cwd or REPO)
    cmd = [sys.executable, "-m", "dlrecipes", *args] if module else list(args)
    return subprocess.run(cmd, cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=env)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _run_in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    import contextlib
    import io
    import traceback
    import warnings

    from dlrecipes import plugins
    from dlrecipes.cli import main

    plugins.load_builtins()
    plugins.load_entry_points()
    modules = set(sys.modules)
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    before = os.getcwd()
    code = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.resetwarnings()  # a fresh process's filters: shown once per place, deprecations hidden
            warnings.simplefilter("default")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
            try:
                main(args)
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except Exception:  # noqa: BLE001 - what a real process would print before exiting 1
                traceback.print_exc(file=sys.stderr)
                code = 1
    finally:
        os.chdir(before)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        _forget_plugins(set(sys.modules) - modules)
    return subprocess.CompletedProcess(["dlrecipes", *args], code, out.getvalue(), err.getvalue())


def _forget_plugins(new_modules: set[str]) -> None:
    """Unload what a call's ``--plugin`` files and recipe ``imports:`` brought in (modules from outside the
    installed packages and dlrecipes/), and their registry entries: the next call imports them afresh, as a
    new process would, and another test's plugin may use the same names."""
    from dlrecipes.registry import REGISTRIES

    installed = (sys.prefix, sys.base_prefix, str(REPO / "dlrecipes"))
    dropped = {
        name
        for name in new_modules
        if not str(getattr(sys.modules.get(name), "__file__", None) or sys.prefix).startswith(installed)
    }
    for registry in REGISTRIES.values():
        for name, entry in list(registry._entries.items()):
            if getattr(entry.factory, "__module__", None) in dropped:
                del registry._entries[name]
    for name in dropped:
        sys.modules.pop(name, None)
