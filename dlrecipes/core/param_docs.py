"""What each parameter of a factory means, read from where a Python programmer writes it.

A factory (a registered model, dataset, optimizer, ...; a plugin's too) documents its recipe keys in one of two
ways, and ``dlrecipes list``, ``show --explain``, validation errors and the reference pages read them here:

- an ``Args:`` section in its docstring (Google style, as Composer and timm write them)::

      def my_net(num_classes: int = 10, width: int = 64):
          \"\"\"A small CNN.

          Args:
              num_classes: how many classes the head predicts.
              width: channels of the first convolution; each stage doubles it.
          \"\"\"

- or ``Annotated[T, Doc("...")]`` (``typing_extensions.Doc``, PEP 727), which also travels with a type shared by
  several factories (:mod:`dlrecipes.data.preprocess_params`): the meaning is declared once, beside the range.

``Annotated`` wins over the docstring; a variant (``Registry.add_variant``) has its base factory's meanings.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

from typing_extensions import Doc

__all__ = ["Doc", "docstring_args", "meaning_of_type", "meanings", "summary"]

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Keyword Args|Keyword Arguments):\s*$")
_OTHER_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")  # Returns:, Raises:, Example:, ...
_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:\s*(.*)$")


def docstring_args(doc: str | None) -> dict[str, str]:
    """``{name: meaning}`` from the ``Args:`` sections of a (cleaned, ``inspect.getdoc``) docstring; a meaning
    that runs over several lines is joined into one."""
    out: dict[str, str] = {}
    if not doc:
        return out
    lines = doc.expandtabs().splitlines()
    i = 0
    while i < len(lines):
        if not _SECTION.match(lines[i].strip()):
            i += 1
            continue
        base = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        entry_indent, current = None, None
        while i < len(lines):
            line = lines[i]
            text = line.strip()
            indent = len(line) - len(line.lstrip())
            if text and indent <= base:
                break  # the section ended (the next section, or the docstring's own text)
            if not text:
                i += 1
                continue
            match = _ENTRY.match(text)
            if match and (entry_indent is None or indent <= entry_indent):
                entry_indent = indent
                current = match.group(1).lstrip("*")
                out[current] = match.group(3).strip()
            elif current is not None:
                out[current] = f"{out[current]} {text}".strip()
            i += 1
    return {name: _sentence(text) for name, text in out.items() if text}


def _sentence(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def meaning_of_type(tp: Any) -> str | None:
    """The ``Doc`` of an ``Annotated`` type (also inside ``Optional[...]``), or None."""
    if typing.get_origin(tp) is Annotated:
        for extra in reversed(typing.get_args(tp)[1:]):
            if isinstance(extra, Doc):
                return extra.documentation
        return meaning_of_type(typing.get_args(tp)[0])
    for option in typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ():
        found = meaning_of_type(option)
        if found:
            return found
    return None


def meanings(factory: Callable[..., Any]) -> dict[str, str]:
    """``{parameter: meaning}`` for a factory: its (base factory's) docstring's ``Args:``, then ``Doc`` annotations."""
    out: dict[str, str] = {}
    wrapped = getattr(factory, "__wrapped__", None)
    if wrapped is not None:
        out.update(meanings(wrapped))
    out.update(docstring_args(inspect.getdoc(factory)))
    try:
        hints = typing.get_type_hints(factory, include_extras=True)
    except Exception:  # an annotation that does not resolve here: the docstring's meanings only
        hints = {}
    for name, hint in hints.items():
        doc = meaning_of_type(hint)
        if doc:
            out[name] = doc
    return out


def summary(doc: str | None) -> str:
    """A docstring without its sections (``Args:``, ``Returns:``, ...): what it says about the whole."""
    if not doc:
        return ""
    kept = []
    for line in inspect.cleandoc(doc).splitlines():
        if _SECTION.match(line.strip()) or (_OTHER_SECTION.match(line) and line == line.lstrip()):
            break
        kept.append(line)
    return "\n".join(kept).strip()
