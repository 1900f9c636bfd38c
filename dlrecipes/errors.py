"""Errors meant for users.

A :class:`UserError` is a mistake in what the user asked for (a recipe key, a file, a
device setting).  The CLI prints its message alone and exits with code 2; anything
else is a bug in dlrecipes and keeps its traceback.  A message never shows a secret
(:func:`dlrecipes.core.secrets.redact_text`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from dlrecipes.core.secrets import redact_text


class UserError(Exception):
    """A mistake the user can fix; the message says what and where.  The CLI prints ``prefix`` and
    the message, and exits with ``exit_code``."""

    exit_code = 2
    prefix = "error: "
    hint = ""  # a line after the message: what the key it names means (validation sets it)

    def __init__(self, *args: object):
        # a value quoted in the message (an address with its password, ``api_key=...``) is shown redacted
        super().__init__(*(redact_text(a) if isinstance(a, str) else a for a in args))

    def _render_traceback_(self) -> list[str]:
        """How IPython (a notebook) shows it: the one line the CLI prints, not a traceback into dlrecipes."""
        return [f"{type(self).__name__}: {self}", *([self.hint] if self.hint else [])]


class RecipeError(UserError):
    """The recipe (a file, a key, a value or an override) is not valid."""


class DataError(UserError):
    """A dataset is missing or unreadable."""


class PluginError(UserError):
    """A plugin could not be imported or registered."""


def user_message(exc: UserError) -> str:
    """The message of a user error as its one line: one raised in a DataLoader worker process comes back wrapped by
    torch ("Caught DataError in DataLoader worker process 0. Original Traceback ..."), its own line last."""
    message = str(exc)
    if message.startswith("Caught ") and "Original Traceback" in message:
        message = message.strip().splitlines()[-1].split(": ", 1)[-1]
    return message


def first_line(exc: BaseException, limit: int | None = None, default: str | None = None) -> str:
    """An exception's message as one line: its first non-empty line, cut at ``limit`` characters; ``default`` (the
    exception's type's name when None) for a message with none."""
    line = next((text.strip() for text in str(exc).splitlines() if text.strip()), None)
    if line is None:
        return type(exc).__name__ if default is None else default
    return line if limit is None else line[:limit]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, shortened to ``limit`` characters: an error line names a value, it does not print it."""
    text = redact_text(repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."
