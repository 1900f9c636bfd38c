"""Secrets stay secret: what counts as one, and the one redaction every writer of the run calls.

Credentials come from the environment or the provider's own files (``WANDB_API_KEY``/``~/.netrc``,
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``/``MLFLOW_TRACKING_TOKEN``, the AWS chain), never
from a recipe key: a recipe is copied, committed, shared and recorded with every run.  So

- a key named like a secret (:func:`is_secret_key`: ``password``, ``secret``, ``token``, ``api_key``,
  ``access_key``, ``credentials``, ... as a whole word of its name) that holds text is refused by
  validation, one line naming the key path and the environment variable to set instead
  (:func:`secret_keys`, :func:`refusal`);
- an address keeps working with its user info (``http://bob:pw@host``, a presigned URL's
  ``?X-Amz-Signature=...``), but is written everywhere with it masked (``http://***@host``,
  ``X-Amz-Signature=***``).

:func:`redact` (data: a recipe, a summary, a tracker's parameters) and :func:`redact_text` (a line: an error,
a log line, a traceback) are the only redaction in dlrecipes; recipe.yaml, ``show``, summary.json, the run's
log, error lines and the trackers' parameters all go through them.  Redacting is idempotent and keeps the
shape of the data, so a recorded recipe compares with a new one once that is redacted too
(:mod:`dlrecipes.records.resume_check`): another password for the same address is no change.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

MASK = "***"
# whole words of a key's name (split at _ - . and camelCase) that make it a secret's
SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "secrets",
        "token",
        "credential",
        "credentials",
        "apikey",
        "accesskey",
        "privatekey",
        "signature",
        "sig",
    }
)
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "key")})
# where a recipe's credential belongs instead, by the key path it was found under (longest prefix first)
CREDENTIAL_HOMES = {
    "loggers.wandb": "WANDB_API_KEY (or `wandb login`)",
    "loggers.mlflow": "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN",
    "runs_dir": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
}

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# scheme://USERINFO@ : everything between :// and the last @ of the authority
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/\s?#@'\"<>\[\]{}\\]+(?:@[^/\s?#@'\"<>\[\]{}\\]+)*)@")
# ?name=value / &name=value in an address
_QUERY = re.compile(r"([?&;])([^=&\s#'\"?;]+)=([^&\s#'\";]*)")
# name=value, and 'name': value (a mapping's repr, JSON) in a line; an error's "key.path: what is wrong" is prose
_ASSIGNED = re.compile(
    r"(?<![\w.\-])(?P<q>['\"]?)(?P<name>[A-Za-z_][\w.\-]*)(?P=q)"
    r"(?P<sep>[ \t]*=[ \t]*|(?<=['\"])[ \t]*:[ \t]*)(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",}\])&;#]+)"
)
_PLAIN = re.compile(r"(?i)(true|false|none|null|~|[-+]?[0-9][0-9_.e+\-]*)")


def key_words(name: str) -> list[str]:
    """The lower-case words of a key's name: ``loggers.wandb.apiKey`` -> ``['loggers', 'wandb', 'api', 'key']``."""
    return [w.lower() for w in _WORDS.findall(str(name))]


def is_secret_key(name: str) -> bool:
    """Whether a key's name says it holds a secret: one of :data:`SECRET_WORDS`, or two words of
    :data:`SECRET_PAIRS` in a row, as whole words (``db_password``, ``api_key``, ``X-Amz-Signature``; not
    ``tokenizer``, ``max_tokens``, ``keys``)."""
    words = key_words(name)
    return any(w in SECRET_WORDS for w in words) or any(pair in SECRET_PAIRS for pair in zip(words, words[1:]))


def _holds_text(value: Any) -> bool:
    """A value that can be a credential: text, or a list or mapping holding some (``class_token: true`` is a switch)."""
    if isinstance(value, str):
        return value != ""
    if isinstance(value, dict):
        return any(_holds_text(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_text(v) for v in value)
    return False


def _masked(value: Any) -> Any:
    """Every text inside ``value`` masked, its shape kept."""
    if isinstance(value, str):
        return MASK if value else value
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_masked(v) for v in value)
    return value


def redact_uri(text: str) -> str:
    """An address (or a line holding some) with its user info and secret-named query values masked:
    ``http://bob:pw@host:5000/x?token=t&a=1`` -> ``http://***@host:5000/x?token=***&a=1``."""
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    return _QUERY.sub(
        lambda m: f"{m.group(1)}{m.group(2)}={MASK}" if is_secret_key(m.group(2)) and m.group(3) else m.group(0), text
    )


def without_user_info(uri: str) -> str:
    """The address without its user info (``http://bob:pw@host/x`` -> ``http://host/x``): for asking whether a
    server answers at all, which needs no credentials (and urllib cannot take them from an address)."""
    return _USERINFO.sub(lambda m: m.group(1), uri, count=1)


def redact_text(text: str) -> str:
    """A line as it may be shown: addresses redacted (:func:`redact_uri`), and the value of a secret-named key
    written as ``name=value`` or ``'name': value`` masked (``api_key=abc`` -> ``api_key=***``); an error's
    ``key.path: what is wrong`` is left as it is."""
    if not isinstance(text, str) or not text:
        return text

    def assigned(m: re.Match) -> str:
        value = m.group("value")
        bare = value.strip("'\"")
        if not is_secret_key(m.group("name")) or not bare or _PLAIN.fullmatch(bare) or bare == MASK:
            return m.group(0)
        quote = value[0] if value[0] in "'\"" else ""
        return m.group(0)[: m.start("value") - m.start()] + f"{quote}{MASK}{quote}"

    return _ASSIGNED.sub(assigned, redact_uri(text))


def redact(data: Any) -> Any:
    """A copy of ``data`` (mappings, lists, scalars) fit to write down: the text under a secret-named key masked,
    and every other text redacted as a line is (:func:`redact_text`).  Numbers, switches and the shape stay."""
    if isinstance(data, dict):
        return {k: _masked(v) if is_secret_key(k) and _holds_text(v) else redact(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(redact(v) for v in data)
    if isinstance(data, str):
        return redact_text(data)
    return data


class _RedactingStream:
    """A text stream whose writes are redacted line by line (:func:`redact_text`); everything else is the stream's."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """While inside, what is written to ``sys.stdout`` and ``sys.stderr`` is redacted: for a library that prints
    the address it was given (MLflow's "View run at: http://user:password@host/...")."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _RedactingStream(out), _RedactingStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def redacted_argv() -> Iterator[None]:
    """While inside, ``sys.argv`` is redacted: for a library that records the command line (W&B's run metadata
    keeps its arguments, an override ``tracking_uri=http://user:password@host`` among them)."""
    argv = sys.argv
    sys.argv = [redact_text(arg) for arg in argv]
    try:
        yield
    finally:
        sys.argv = argv


def secret_keys(data: Any, prefix: str = "") -> list[str]:
    """The key paths under which ``data`` holds a credential (a secret-named key with text), outermost only."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if is_secret_key(key) and _holds_text(value):
                found.append(path)
            else:
                found += secret_keys(value, path)
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            found += secret_keys(value, f"{prefix}[{i}]")
    return found


def credential_home(path: str) -> str:
    """Where the credential found at key ``path`` belongs: the environment variable its component reads."""
    for prefix in sorted(CREDENTIAL_HOMES, key=len, reverse=True):
        if path == prefix or path.startswith(prefix + "."):
            return CREDENTIAL_HOMES[prefix]
    return "the environment variable or configuration file of the service it is for"


def refusal(path: str) -> str:
    """The line that refuses a credential at recipe key ``path`` (its value is not repeated)."""
    return (
        f"{path}: a credential is not taken from a recipe (recipes are copied, shared and recorded with every "
        f"run); set {credential_home(path)} in the environment instead, and remove the key"
    )


__all__ = [
    "CREDENTIAL_HOMES",
    "MASK",
    "SECRET_PAIRS",
    "SECRET_WORDS",
    "credential_home",
    "is_secret_key",
    "key_words",
    "redact",
    "redact_text",
    "redact_uri",
    "redacted_argv",
    "redacted_output",
    "refusal",
    "secret_keys",
    "without_user_info",
]
