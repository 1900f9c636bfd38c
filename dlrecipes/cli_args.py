"""What the commands of :mod:`dlrecipes.cli` share, declared once: the Typer ``app`` and its ``--version``, the
options several commands take, the arguments every recipe command is given (the recipe, its ``key=value``
overrides and ``--plugin``: :func:`recipe_command`), and how a command ends on an error (:func:`guarded`: one line,
exit code 2 for a user's mistake). It imports nothing of torch or Composer: the CLI starts fast.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from dlrecipes.errors import UserError, first_line, user_message

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train image classifiers from YAML recipes on MosaicML Composer.",
)

PluginOpt = typer.Option([], "--plugin", help="import this module or .py file first (repeatable)")
TrustOpt = typer.Option(
    False,
    "--trust-checkpoint",
    help="load a checkpoint that holds Python objects beyond tensors "
    "(a full unpickle, which can run code): only a file you trust",
)
TrustPluginsOpt = typer.Option(
    False,
    "--trust-plugins",
    help="import the plugin files a run's recorded recipe names (one in a bucket, or inside the run directory) and "
    "plugins changed since the run was trained: only code you trust",
)
ResumeOpt = typer.Option(False, "--resume", help="continue the latest checkpoint of the same run")
RestartOpt = typer.Option(
    False,
    "--restart",
    help="train run_name again from the beginning; the old run is kept as <run_name>.restarted-<time>",
)
JsonOpt = typer.Option(False, "--json", help="print JSON")


@dataclass(frozen=True)
class RecipeArgs:
    """What every recipe command is given: the recipe file, its overrides and the plugins to import."""

    recipe: (
        Path | str | None
    )  # a file, or (str) a run's recorded recipe in a bucket: s3://BUCKET/PREFIX/RUN/recipe.yaml
    overrides: list[str]
    plugins: list[str]


def recipe_command(name: str | None = None, required: bool = True, app: typer.Typer = app) -> Callable:
    """Register a command whose first parameter receives :class:`RecipeArgs`: the recipe argument, the
    overrides and ``--plugin`` are declared here, once, and added to the command's own options."""
    recipe_arg = typer.Argument(
        ... if required else None,
        show_default=False,
        help="recipe YAML file"
        + (" (or a run's in a bucket: s3://BUCKET/PREFIX/RUN/recipe.yaml)" if required else " (or use --model)"),
    )
    overrides_arg = typer.Argument(
        None, help="key.path=value overrides (YAML values), key.path=null, or ~key.path to delete", show_default=False
    )
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD

    def decorate(fn: Callable) -> Callable:
        own = list(inspect.signature(fn).parameters.values())[1:]
        params = [
            inspect.Parameter(
                "recipe",
                positional,
                default=recipe_arg,  # str: Path() would make s3:// s3:/
                annotation=str if required else str | None,
            ),
            inspect.Parameter("overrides", positional, default=overrides_arg, annotation=list[str] | None),
            *own,
            inspect.Parameter("plugin", positional, default=PluginOpt, annotation=list[str]),
            inspect.Parameter("trust_plugins", positional, default=TrustPluginsOpt, annotation=bool),
        ]

        @functools.wraps(fn)
        def command(**values: Any) -> Any:
            from dlrecipes import api

            recipe = values.pop("recipe")
            recipe = recipe if recipe is None or "://" in recipe else Path(recipe)  # an address: api reads it
            args = RecipeArgs(recipe, list(values.pop("overrides") or []), list(values.pop("plugin")))
            with api.trusting_plugins(values.pop("trust_plugins")):
                return fn(args, **values)

        del command.__wrapped__  # typer reads the signature below, not fn's
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {
            **fn.__annotations__,
            "recipe": params[0].annotation,
            "overrides": params[1].annotation,
            "plugin": params[-2].annotation,
            "trust_plugins": bool,
        }
        command.__annotations__.pop("args", None)
        return app.command(name)(command)

    return decorate


RunTargetArg = typer.Argument(
    ...,
    help="a run directory (runs/<name> or s3://BUCKET/PREFIX/RUN), or a checkpoint file (then with --recipe)",
    show_default=False,
)
CheckpointOpt = typer.Option("best", "--checkpoint", help="best, latest, or a checkpoint file of the run")
RecipeOpt = typer.Option(None, "--recipe", help="the recipe, for a checkpoint outside a run directory")
OverridesArg = typer.Argument(
    None, help="changes to the run's recipe, as key.path=value (YAML values)", show_default=False
)


def trusting(trust_plugins: bool, call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` as a command after training makes it, with a run's recorded plugins trusted or not
    (``--trust-plugins``: :func:`dlrecipes.api.trusting_plugins`)."""

    def trusted_call() -> Any:
        from dlrecipes import api

        with api.trusting_plugins(trust_plugins):
            return call()

    return trusted_call


def print_version(value: bool) -> None:
    if value:
        from dlrecipes.tools.describe import version_line

        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=print_version,
        is_eager=True,
        help="print the versions of dlrecipes, Composer, torch and Python, and exit",
    ),
) -> None:
    """Train image classifiers from YAML recipes on MosaicML Composer."""


def terminal_width(stream: Any) -> int | None:
    """The terminal's width when ``stream`` is one (lines are fitted to it), else ``None`` (lines stay whole)."""
    import shutil

    return shutil.get_terminal_size().columns if stream.isatty() else None


MAX_MESSAGE = 1000  # characters: no error line is longer than a terminal screen


def fail(message: str, code: int = 2, prefix: str = "error: ", hint: str = "") -> None:
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    typer.echo(f"{prefix}{message}", err=True)
    if hint:  # what the key means: after the one line that says what is wrong
        typer.echo(f"  {hint[:MAX_MESSAGE]}", err=True)
    raise typer.Exit(code=code)


TRACEBACK_SWITCH = "DLRECIPES_TRACEBACK"  # =1: an unexpected error keeps its traceback


def guarded(fn: Callable[[], Any]) -> Any:
    """``fn()``; a user error becomes its one line and exit code, and so does any other exception (a bug, or a
    case not foreseen), which names itself and how to see its traceback."""
    import os

    try:
        return fn()
    except UserError as exc:
        fail(user_message(exc), exc.exit_code, exc.prefix, exc.hint)  # one raised in a DataLoader worker: its own line
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        if os.environ.get(TRACEBACK_SWITCH) == "1":
            raise
        if isinstance(exc, OSError) and exc.strerror:  # the machine said no (disk full, permissions): not a bug
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror}{where} ({TRACEBACK_SWITCH}=1 shows where)", code=1)
        first = first_line(exc, 300, "")
        fail(
            f"{type(exc).__name__}{': ' + first if first else ''} (unexpected: please report it; "
            f"{TRACEBACK_SWITCH}=1 shows the traceback)",
            code=1,
        )


def assignments(items: list[str] | None, what: str) -> dict[str, Any]:
    from dlrecipes.recipe import parse_assignment

    return dict(guarded(lambda: [parse_assignment(item, what) for item in items or []]))


__all__ = [
    "CheckpointOpt",
    "JsonOpt",
    "MAX_MESSAGE",
    "OverridesArg",
    "PluginOpt",
    "RecipeArgs",
    "RecipeOpt",
    "RestartOpt",
    "ResumeOpt",
    "RunTargetArg",
    "TRACEBACK_SWITCH",
    "TrustOpt",
    "app",
    "assignments",
    "fail",
    "guarded",
    "print_version",
    "recipe_command",
    "terminal_width",
]
