"""A run handed to another process: :class:`RunRequest`, the recipe as this process loaded it (its merged data, where
each value came from, the plugins it needs), the store and name it trains under (in the data: ``runs_dir`` and
``run_name``), the command's options, and the command line it stands for.

A sweep writes one for each training it starts (:mod:`dlrecipes.tools.sweep.run`); ``dlrecipes train-request FILE``
(:func:`dlrecipes.api.train_request`) opens the run from it: the recipe is not read, nor any override parsed,
again.  The file is a hand-off between two processes, not a record: it holds the values as given (secrets
unmasked, as the training needs them), so it is written readable by its owner only, and the process that wrote it
deletes it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dlrecipes.errors import UserError, first_line
from dlrecipes.recipe import LoadedRecipe, parse_yaml
from dlrecipes.records.store import RunOptions

if TYPE_CHECKING:
    from dlrecipes.config import RecipeConfig

_FIELDS = ("recipe", "data", "sources", "plugins", "options", "command")


@dataclass(frozen=True)
class RunRequest:
    """A run for another process to open: ``recipe`` (the file whose path the run records), ``data`` (the merged
    recipe, overrides applied), ``sources`` (key path -> the file or override it came from), the ``plugins`` to
    import, the command's ``options``, and ``command``: the ``dlrecipes train`` line it stands for, recorded as the
    run's."""

    recipe: str
    data: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()
    options: RunOptions = RunOptions()
    command: str = ""

    @classmethod
    def of(
        cls, loaded: LoadedRecipe, overrides: list[str], plugins: tuple[str, ...] | list[str], options: RunOptions
    ) -> RunRequest:
        """The request for ``loaded``: its file with ``overrides`` applied (the run's store and name among them, as
        ``runs_dir=`` and ``run_name=``); its command is the train line that loads the same recipe."""
        flags = [
            *(["--resume"] if options.resume else []),
            *(["--restart"] if options.restart else []),
            *(["--trust-checkpoint"] if options.trust else []),
            *(["--verbose"] if options.verbose else []),
            *(a for p in plugins for a in ("--plugin", p)),
        ]
        command = shlex.join(["dlrecipes", "train", str(loaded.path), *overrides, *flags])
        return cls(str(loaded.path), loaded.data, loaded.sources, tuple(plugins), options, command)

    def loaded(self) -> LoadedRecipe:
        """The recipe as the requesting process loaded it."""
        return LoadedRecipe(Path(self.recipe), dict(self.data), dict(self.sources), from_file=True)

    def config(self) -> RecipeConfig:
        """The recipe validated here (this machine's device and data paths checked), with the plugins it needs
        imported, as :func:`dlrecipes.config.resolving.load_local` imports them."""
        from dlrecipes.config.resolving import import_plugins
        from dlrecipes.config.validation import validate

        loaded = self.loaded()
        import_plugins(loaded, self.plugins)
        return validate(loaded)

    def write(self, folder: Path, name: str) -> Path:
        """Write the request to ``folder/NAME.yaml``, readable by its owner only; returns its path."""
        path = Path(folder) / f"{name}.yaml"
        text = yaml.safe_dump(
            {
                "recipe": self.recipe,
                "data": self.data,
                "sources": self.sources,
                "plugins": list(self.plugins),
                "options": vars(self.options),
                "command": self.command,
            },
            sort_keys=False,
            allow_unicode=True,
        )
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        return path

    @classmethod
    def read(cls, path: str | Path) -> RunRequest:
        """The request written to ``path``; one line naming the file when it is missing or not a request."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{path}: cannot read the run request ({exc.strerror or first_line(exc)})") from None
        raw = parse_yaml(text, str(path))
        if not isinstance(raw, dict) or set(raw) != set(_FIELDS) or not isinstance(raw["data"], dict):
            raise UserError(f"{path}: not a run request (a mapping of {', '.join(_FIELDS)}, as a sweep writes)")
        try:
            options = RunOptions(**raw["options"])
        except TypeError as exc:
            raise UserError(f"{path}: options: {first_line(exc)}") from None
        return cls(
            str(raw["recipe"]),
            raw["data"],
            dict(raw["sources"] or {}),
            tuple(raw["plugins"] or ()),
            options,
            str(raw["command"]),
        )


__all__ = ["RunRequest"]
