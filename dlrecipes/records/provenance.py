"""What made a run: the software and machine it trained on, how it was started, and the recipe's origin.

Recorded in the run's summary.json under ``provenance`` (and given to MLflow, W&B and TensorBoard as
``provenance/...`` parameters), shown by ``dlrecipes runs`` (torch, commit) and ``compare`` (each item that
differs among the runs, after the recipe's differences), and compared when a run's own recipe.yaml is trained
again (:func:`differences`: one warning per item that is not as it was).

- ``versions``: dlrecipes, torch, torchvision, composer, timm, numpy, python;
- ``cuda``, ``cudnn``, ``gpu`` and ``gpu_count`` where the run trains on a GPU;
- ``host``, ``world_size``, ``nodes``;
- ``command``: the command line, or the Python call (:func:`invoked`), secrets redacted;
- ``recipe_file``, ``git_repo``, ``git_commit`` and ``git_dirty``: the recipe's file and the git repository
  holding it, its commit and whether it had uncommitted changes (a recipe outside any repository, or given as a
  dict: the working directory's repository);
- ``plugins``: ``{file: sha256}`` of each plugin module the run's registries hold entries from;
- ``seed``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from dlrecipes.core.devices import gpu_available, gpu_count
from dlrecipes.core.secrets import redact_text

PACKAGES = {"dlrecipes": "dlrecipes", "torch": "torch", "torchvision": "torchvision", "composer": "mosaicml",
            "timm": "timm", "numpy": "numpy"}
# the items a rerun of a run's recipe compares (what would make its numbers differ), in the order warnings say them
COMPARED = ("versions", "cuda", "cudnn", "gpu", "git_commit", "git_dirty", "plugins", "world_size")

_CALL: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("dlrecipes_call", default=None)


@contextlib.contextmanager
def invoked(call: str) -> Iterator[None]:
    """Within this block, the run was started by ``call`` (a Python call, as the notebook functions describe
    themselves), not by the command line."""
    token = _CALL.set(call)
    try:
        yield
    finally:
        _CALL.reset(token)


def command() -> str:
    """How this run was started: the Python call, else this process's command line."""
    call = _CALL.get()
    if call is None:
        name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        call = " ".join(shlex.quote(a) for a in (name, *sys.argv[1:]))
    return redact_text(call)


def _version(distribution: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Optional[str]]:
    out = {name: _version(dist) for name, dist in PACKAGES.items()}
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out


def git_state(folder: Path) -> tuple[Optional[str], Optional[str], Optional[bool]]:
    """(work tree, commit, has uncommitted changes) of the git repository holding ``folder``; Nones outside one or
    without git."""
    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--show-toplevel"), commit, (bool(status) if status is not None else None)


def sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def plugin_files() -> dict[str, Optional[str]]:
    """``{file: sha256}`` of each module outside dlrecipes that registered an entry (plugins, recipe imports)."""
    import inspect

    from dlrecipes.registry import REGISTRIES

    files: dict[str, Optional[str]] = {}
    for reg in REGISTRIES.values():
        for entry in reg:
            module = sys.modules.get(getattr(entry.factory, "__module__", "") or "")
            if module is None or module.__name__.split(".")[0] == "dlrecipes":
                continue
            try:
                source = inspect.getsourcefile(module)
            except TypeError:
                source = None
            if source and source not in files:
                files[source] = sha256(Path(source))
    return files


def gpu_facts(device: str) -> dict[str, Any]:
    if device != "gpu" or not gpu_available():
        return {}
    import torch

    return {"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(0), "gpu_count": gpu_count()}


def collect(config: Any, device: str) -> dict[str, Any]:
    """This run's provenance (see the module docstring)."""
    from composer.utils import dist

    world, local = dist.get_world_size(), max(1, dist.get_local_world_size())
    origin = getattr(config, "origin", None)
    repo, commit, dirty = git_state(Path(origin).resolve().parent) if origin else (None, None, None)
    if commit is None:  # a recipe outside any repository (or a dict): the working directory's, where the code is
        repo, commit, dirty = git_state(Path.cwd())
    return {
        "versions": versions(), **gpu_facts(device),
        "host": socket.gethostname(), "world_size": world, "nodes": max(1, world // local),
        "command": command(),
        "recipe_file": str(Path(origin).resolve()) if origin else None, "git_repo": repo, "git_commit": commit,
        "git_dirty": dirty,
        "plugins": plugin_files(), "seed": config.trainer.seed,
    }


def flat(provenance: dict[str, Any], prefix: str = "provenance/") -> dict[str, Any]:
    """The provenance as one level of ``provenance/<item>`` keys (trackers' parameters)."""
    out: dict[str, Any] = {}
    for key, value in provenance.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One phrase per compared item (:data:`COMPARED`) that differs: ``torch 2.7.0 (the run had 2.6.0)``."""
    said = []
    old, new = flat({k: before.get(k) for k in COMPARED}, ""), flat({k: now.get(k) for k in COMPARED}, "")
    def shown(value: Any) -> str:
        return "none" if value is None else str(value)

    for key in dict.fromkeys([*old, *new]):
        if old.get(key) != new.get(key):
            name = key.removeprefix("versions/").replace("plugins/", "plugin ").replace("_", " ")
            if key == "git_dirty" and (old.get("git_commit") is None or new.get("git_commit") is None):
                continue  # said with the commit
            said.append(f"{name} {shown(new.get(key))} (the run had {shown(old.get(key))})")
    return said


def rerun_warnings(config: Any, provenance: dict[str, Any]) -> list[str]:
    """When the recipe is a run's own recipe.yaml (``dlrecipes train runs/NAME/recipe.yaml``): one warning per
    provenance item that differs from that run's (another torch, another commit), else none."""
    from dlrecipes.records.layout import RECIPE_FILE, RunDir
    from dlrecipes.records.run_files import read_summary

    origin = getattr(config, "origin", None)
    if not origin or Path(origin).name != RECIPE_FILE or not RunDir(Path(origin).parent).is_run():
        return []
    run = Path(origin).resolve().parent
    try:
        before = (read_summary(run) or {}).get("provenance")
    except Exception:  # a damaged summary: nothing to compare with (`dlrecipes runs` names it)
        before = None
    if not isinstance(before, dict):
        return []
    return [f"warning: {run.name} was trained differently: {item}" for item in differences(before, provenance)]
