"""What a bucket says is checked before it names a local file.

A bucket's contents are written by whoever can write there, and its listings come from a server: neither is trusted
to name a path on this machine.  Two things a bucket supplies become local paths:

- the resume pointer, ``checkpoints/latest.txt``, whose text names the run's newest checkpoint: it must be a plain
  periodic checkpoint name (``ep<E>-ba<B>-rank0.pt``, with its writer's tag: no ``/``, no ``..``, no control
  characters, not empty) and well-formed writer lines, or it is refused in one line naming the pointer's address
  (:func:`~.commit.read_pointer`);
- every key downloaded into a staging folder or a local copy (``--resume``'s records and checkpoint; ``eval``,
  ``runs``, ``compare`` and the other readers iterate over the bucket's listing): its target is resolved (links
  followed) and refused in one line unless it stays under that folder (:func:`staged_path`), before anything is
  created or written.
"""

from __future__ import annotations

from pathlib import Path

from dlrecipes.errors import UserError, shown


class UnsafeKey(UserError):
    """A bucket named a local path that is no checkpoint name, or one outside the folder it is downloaded into."""


def staged_path(folder: Path, relative: str, address: str) -> Path:
    """``folder / relative`` for the bucket's key ``relative`` (``address``: the run's address), refused
    (:class:`UnsafeKey`) when it is not a plain relative path (absolute, an empty, ``.`` or ``..`` segment, as in
    ``a//b``, which S3 keeps apart from ``a/b`` and a path does not; a backslash; a control character) or would
    resolve outside ``folder`` through a folder on the way that is a link leading out."""
    plain = bool(relative) and not any(ord(c) < 32 or ord(c) == 127 or c == "\\" for c in relative)
    if plain and not any(part in ("", ".", "..") for part in relative.split("/")):
        base = Path(folder).resolve()
        target = (base / relative).resolve()  # links on the way (and the key's own, if any) followed
        if base in target.parents:
            return Path(folder) / relative
        where = f"would be written at {target}, outside {folder}"
    else:
        where = f"is not a plain relative path under {folder}"
    raise UnsafeKey(f"{address}: the bucket's key {shown(relative)} {where}; refused, nothing was downloaded")


__all__ = ["UnsafeKey", "staged_path"]
