"""Where a run or a file may be named: a local path, or an object store's address (``s3://BUCKET/PREFIX``, and the
other schemes Composer's URI factory makes). What looks like an address but is not one is refused here, before
anything reads it as a local path (``S3://b/p`` would make a folder ``S3:`` in the working directory):

- a known scheme in another case or with the wrong slashes (``S3://``, ``s3:/``, ``s3:b``), or another library's
  name for it (``s3a://``, ``s3n://``, ``gcs://``): ``did you mean s3://...?``;
- ``file://PATH``: give the plain path; another scheme's address (``ftp://``, ``https://``) is no place for runs;
- control characters (a pasted line end, an escape sequence), in any address or path.

The limits of an object store's keys are here too: S3 takes keys of at most 1,024 bytes (UTF-8).
"""

from __future__ import annotations

import re
from typing import Any

from dlrecipes.errors import UserError

SCHEMES = ("s3", "gs", "oci", "azure")  # the object stores Composer's URI factory makes
RUNS_DIR = "runs"  # where runs go when nothing says otherwise (runs_dir's default, and the commands that list runs)
OTHER_NAMES = {
    "s3a": "s3",
    "s3n": "s3",
    "gcs": "gs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "wasb": "azure",
    "wasbs": "azure",
}  # what other tools call them (Hadoop's, fsspec's)
KEY_LIMIT = 1024  # bytes an S3 key may hold (UTF-8), the strictest of the schemes
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(/*)(.*)$", re.DOTALL)  # two letters at least: C:/ is a drive


def scheme_of(value: Any) -> str | None:
    """The object store an address names (``s3``, ``gs``, ``oci``, ``azure``), or None (a local path)."""
    scheme, sep, _ = str(value).partition("://")
    return scheme if sep and scheme in SCHEMES else None


def control_character(text: str) -> str | None:
    """The first control character in ``text`` (as Python writes it, ``'\\n'``), or None."""
    found = next((c for c in text if ord(c) < 32 or 127 <= ord(c) < 160), None)
    return repr(found) if found is not None else None


def check_address(value: Any, key_path: str) -> None:
    """One line when ``value`` (a runs_dir, a run's address or path) holds a control character or looks like an
    object store's address without being one (see the module docstring); nothing otherwise."""
    text = str(value)
    bad = control_character(text)
    if bad is not None:
        raise UserError(f"{key_path}: {text!r} holds a control character ({bad}); give the address or path without it")
    found = _SCHEME.match(text)
    if found is None:
        return
    scheme, slashes, rest = found.groups()
    if scheme.lower() == "file":
        path = "/" + rest.lstrip("/") if slashes else rest
        raise UserError(f"{key_path}: {text!r} is a file:// URL; give the plain path {path!r}")
    meant = OTHER_NAMES.get(scheme.lower(), scheme.lower())
    if meant in SCHEMES and (scheme != meant or slashes != "//"):
        raise UserError(
            f"{key_path}: {text!r} looks like an object-store address; did you mean {meant}://{rest.lstrip('/')}?"
        )
    if slashes == "//" and scheme not in SCHEMES:  # ftp://, https://: not a folder named "ftp:"
        raise UserError(
            f"{key_path}: {text!r} is an address, and runs cannot be kept at {scheme}:// ones; give a "
            f"local folder or {', '.join(f'{known}://BUCKET/PREFIX' for known in SCHEMES)}"
        )


def check_key_room(address: str, longest_key: str, key_path: str) -> None:
    """One line when ``longest_key`` (the longest key a run under ``address`` would write) exceeds what S3 takes."""
    size = len(longest_key.encode("utf-8"))
    if size > KEY_LIMIT:
        raise UserError(
            f"{key_path}: the longest key a run writes under {shortened(address)} would be {size:,} bytes, "
            f"over the object store's limit of {KEY_LIMIT:,}; choose a shorter prefix or run_name"
        )


def shortened(text: str, room: int = 80) -> str:
    """``text`` as a line shows it: whole when short, else its first ``room`` characters and how long it is."""
    return text if len(text) <= room else f"{text[:room]}... ({len(text):,} characters)"


__all__ = [
    "KEY_LIMIT",
    "OTHER_NAMES",
    "SCHEMES",
    "check_address",
    "check_key_room",
    "control_character",
    "scheme_of",
    "shortened",
]
