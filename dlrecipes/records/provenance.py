"""What made a run: the software and machine it trained on, how it was started, and the recipe's origin.

Recorded in the run's summary.json under ``provenance`` (and given to MLflow, W&B and TensorBoard as
``provenance/...`` parameters), shown by ``dlrecipes runs`` (torch, commit) and ``compare`` (each item that
differs among the runs, after the recipe's differences), and compared when a run's own recipe.yaml is trained
again (:func:`differences`: one warning per item that is not as it was).

- ``versions``: dlrecipes, torch, torchvision, composer, timm, numpy, python;
- ``cuda``, ``cudnn``, ``gpu`` and ``gpu_count`` where the run trains on a GPU;
- ``host``, ``world_size``, ``nodes``;
- ``command``: the command line, or the Python call (:func:`recording`), secrets redacted;
- ``recipe_file``, ``git_repo``, ``git_commit`` and ``git_dirty``: the recipe's file and the git repository
  holding it, its commit and whether that commit is not all that made the run: a tracked file changed, or a
  plugin file in the repository untracked or changed (a recipe outside any repository, or given as a dict:
  all four ``None``: the working directory's repository says nothing about the recipe);
- ``git_uncommitted``: the plugin files in the recipe's repository that its commit does not hold as they are
  (untracked or changed), the reason ``git_dirty`` is true where ``git status`` shows no change;
- ``dlrecipes_commit`` and ``dlrecipes_dirty``: where dlrecipes itself runs from a git checkout (an editable
  install), that checkout's commit and whether its package folder has uncommitted changes (new files included);
  absent for an installed release, which ``versions`` names;
- ``plugins``: ``{file: sha256}`` of each plugin module the run's registries hold entries from;
- ``seed``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.core.devices import gpu_available, gpu_count, on_gpu
from dlrecipes.core.secrets import redact_text

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig


PACKAGES = {
    "dlrecipes": "dlrecipes",
    "torch": "torch",
    "torchvision": "torchvision",
    "composer": "mosaicml",
    "timm": "timm",
    "numpy": "numpy",
}
# the items a rerun of a run's recipe compares (what would make its numbers differ), in the order warnings say them
COMPARED = (
    "versions",
    "cuda",
    "cudnn",
    "gpu",
    "git_commit",
    "git_dirty",
    "dlrecipes_commit",
    "dlrecipes_dirty",
    "plugins",
    "world_size",
)
# a dirty flag that is said with its commit where either run had none
SAID_WITH = {"git_dirty": "git_commit", "dlrecipes_dirty": "dlrecipes_commit"}

_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar("dlrecipes_call", default=None)


@contextlib.contextmanager
def recording(call: str) -> Iterator[None]:
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


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    out = {name: _version(dist) for name, dist in PACKAGES.items()}
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out


def _git(folder: Path, *args: str, strip: bool = True) -> str | None:
    """``git -C folder ARGS``'s output (``strip``: without the spaces around it), None where git fails or is
    missing."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout


def git_state(folder: Path) -> tuple[str | None, str | None, bool | None]:
    """(work tree, commit, has uncommitted changes to tracked files) of the git repository holding ``folder``;
    Nones outside one or without git."""
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return None, None, None
    status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    return _git(folder, "rev-parse", "--show-toplevel"), commit, (bool(status) if status is not None else None)


def uncommitted(repo: str, files: Iterable[str]) -> list[str]:
    """Those of ``files`` inside the work tree ``repo`` that its commit does not hold as they are: untracked
    (ignored ones included: an ignored plugin is no more in the commit) or changed."""
    root = Path(repo).resolve()
    inside = [f for f in files if Path(f).resolve().is_relative_to(root)]
    if not inside:
        return []
    status = _git(
        root,
        "status",
        "--porcelain",
        "-z",
        "--untracked-files=all",
        "--ignored",
        "--",
        *(str(Path(f).resolve().relative_to(root)) for f in inside),
        strip=False,
    )  # " M file"
    if status is None:
        return []
    named = {str((root / entry[3:]).resolve()) for entry in status.split("\0") if len(entry) > 3}
    return [f for f in inside if str(Path(f).resolve()) in named]


def dlrecipes_checkout() -> dict[str, Any]:
    """``{dlrecipes_commit, dlrecipes_dirty}`` where dlrecipes runs from a git checkout (its package folder tracked
    in the repository around it: a site-packages inside some repository is not one), else ``{}``."""
    package = Path(__file__).resolve().parents[1]
    if not _git(package, "ls-files", "--", "__init__.py"):
        return {}
    commit = _git(package, "rev-parse", "HEAD")
    if commit is None:
        return {}
    status = _git(package, "status", "--porcelain", "--", ".")
    return {"dlrecipes_commit": commit, "dlrecipes_dirty": bool(status) if status is not None else None}


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def plugin_files() -> dict[str, str | None]:
    """``{file: sha256}`` of each module outside dlrecipes that registered an entry (plugins, recipe imports)."""
    import inspect

    from dlrecipes.registry import REGISTRIES

    files: dict[str, str | None] = {}
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
    if not on_gpu(device) or not gpu_available():
        return {}
    import torch

    return {
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0),
        "gpu_count": gpu_count(),
    }


def recipe_origin(config: RecipeConfig, plugins: Iterable[str]) -> dict[str, Any]:
    """The recipe's file, the repository holding it (none where it is in none, or a dict) and whether that
    repository's commit is all that made the run (``git_dirty``, ``git_uncommitted``: see the module docstring)."""
    origin = getattr(config, "origin", None)
    recipe = Path(origin).resolve() if origin else None
    repo, commit, dirty = git_state(recipe.parent) if recipe else (None, None, None)
    loose = uncommitted(repo, plugins) if repo else []
    return {
        "recipe_file": str(recipe) if recipe else None,
        "git_repo": repo,
        "git_commit": commit,
        "git_dirty": True if loose else dirty,
        "git_uncommitted": loose,
    }


def collect(config: RecipeConfig, device: str) -> dict[str, Any]:
    """This run's provenance (see the module docstring)."""
    from composer.utils import dist

    world, local = dist.get_world_size(), max(1, dist.get_local_world_size())
    plugins = plugin_files()
    return {
        "versions": versions(),
        **gpu_facts(device),
        "host": socket.gethostname(),
        "world_size": world,
        "nodes": max(1, world // local),
        "command": command(),
        **recipe_origin(config, plugins),
        **dlrecipes_checkout(),
        "plugins": plugins,
        "seed": config.trainer.seed,
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
            if key in SAID_WITH and (old.get(SAID_WITH[key]) is None or new.get(SAID_WITH[key]) is None):
                continue  # said with the commit
            said.append(f"{name} {shown(new.get(key))} (the run had {shown(old.get(key))})")
    return said


def rerun_warnings(config: RecipeConfig, provenance: dict[str, Any]) -> list[str]:
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
