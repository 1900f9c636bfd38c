"""A run's recorded recipe is data, never a way in for code.

A run directory, whether trained here, copied from another machine or brought from a bucket, holds a
``recipe.yaml`` whose ``imports:`` name plugin modules. Whoever could write the run could have written that list and
a ``.py`` file beside it, so before a command after training (``eval``, ``predict``, ``export``, ``show`` of a
bucket's recipe, ``train`` from one) imports what a run's recipe names:

- a plugin file named by a recipe in a bucket is refused: nothing is downloaded for it and nothing runs;
- a plugin file named by a local run's recipe is refused when it is not an absolute path (training records every
  file it imported as one) or lies inside the run directory: code that came with the run, not the user's own;
- a plugin named by its module (an installed package, an entry point) is imported from this environment, as
  training imported it;
- once imported, every plugin file the run recorded with its sha256 (``summary.json``'s provenance) must have the
  same contents here: a changed file is refused, since the run's checkpoint was not made by that code.

Each refusal is one line naming the key and what to do: install the plugin and name its module, or pass
``--trust-plugins`` (as ``--trust-checkpoint`` opts in to a full unpickle) to run it anyway. The option sets
:func:`trusting_plugins` for the command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dlrecipes.errors import UserError, shown

TRUST_OPTION = "--trust-plugins"
TRUST_ENV = "DLRECIPES_TRUST_PLUGINS"  # "1": trusted; set by the option for its command and the processes it starts


class UntrustedPlugin(UserError):
    """A run's recorded recipe names code that did not come from this machine's environment, or a plugin whose
    file changed since the run was trained."""


@contextmanager
def trusting_plugins(trust: bool = True) -> Iterator[None]:
    """Inside: a run's recorded plugins are imported as named, unchecked (``--trust-plugins``), here and in the
    processes started meanwhile (a launch's ranks, a sweep's trainings: :data:`TRUST_ENV` is set)."""
    before = os.environ.get(TRUST_ENV)
    if trust:
        os.environ[TRUST_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def trusted() -> bool:
    """Whether a run's recorded plugins are trusted (:func:`trusting_plugins`, or ``DLRECIPES_TRUST_PLUGINS=1``)."""
    return os.environ.get(TRUST_ENV) == "1"


def is_file_spec(spec: str) -> bool:
    """Whether an ``imports:`` entry names a file (as :func:`dlrecipes.plugins.import_plugin` reads it)."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def check_imports(
    imports: Any, recipe: Path, run: Path, address: str, bring: Callable[[str], None] | None = None
) -> None:
    """Refuse (:class:`UntrustedPlugin`) a plugin file the run's recorded recipe ``recipe`` names in ``imports``
    (its ``imports:``; ``run``: the run directory or its local copy, ``address``: where the run lives, as the line
    names it) unless trusted: see the module docstring. ``bring``: for a run brought from a bucket, what downloads
    one more of its files into the copy (a trusted plugin file that lies in the run); None for a local run."""
    if not isinstance(imports, list):
        return
    inside = Path(run).resolve()
    for spec in imports:
        if not isinstance(spec, str) or not is_file_spec(spec):
            continue
        path = Path(spec).expanduser()
        target = (path if path.is_absolute() else recipe.parent / path).resolve()
        within = target == inside or inside in target.parents
        if trusted():
            if bring is not None and within:
                bring(target.relative_to(inside).as_posix())
            continue
        if bring is not None:
            why = "a run's recipe in a bucket is data: dlrecipes runs no code it names"
        elif not path.is_absolute() or within:
            why = "it lies inside the run directory, so it came with the run, not from this machine"
        else:
            continue
        raise UntrustedPlugin(
            f"imports: {address}/{recipe.name} names the plugin file {shown(spec)}; {why}. Install the plugin here "
            f"and name its module (imports: [my_package.my_module]), or pass {TRUST_OPTION} to run that file"
        )


def check_plugin_files(summary: Path, address: str, now: dict[str, Any]) -> None:
    """Refuse (:class:`UntrustedPlugin`) a plugin file imported now (``now``: ``{file: sha256}``, as
    :func:`dlrecipes.records.provenance.plugin_files` gives) whose sha256 differs from the one the run recorded
    in ``summary`` (its summary.json; ``address``: the run as the line names it), unless trusted."""
    if trusted():
        return
    try:
        recorded = json.loads(summary.read_text()).get("provenance", {}).get("plugins", {})
    except (OSError, ValueError, AttributeError):
        return  # no record (a run that never wrote its summary): nothing to compare with
    if not isinstance(recorded, dict):
        return
    for file, sha in now.items():
        then = recorded.get(file)
        if isinstance(then, str) and sha is not None and then != sha:
            raise UntrustedPlugin(
                f"plugins: {file} differs from the file {address} was trained with (sha256 {sha[:12]}... now, "
                f"{then[:12]}... then); restore that file, or pass {TRUST_OPTION} to use it as it is"
            )


__all__ = [
    "TRUST_ENV",
    "TRUST_OPTION",
    "UntrustedPlugin",
    "check_imports",
    "check_plugin_files",
    "is_file_spec",
    "trusted",
    "trusting_plugins",
]
