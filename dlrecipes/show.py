"""Human-readable views: a resolved recipe with the source of every value, and registry listings."""

from __future__ import annotations

import inspect
from typing import Any

import yaml

from dlrecipes.registry import Registry

DEFAULT_SOURCE = "default"


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def render_with_sources(data: dict[str, Any], sources: dict[str, str]) -> str:
    """YAML lines of ``data``, each leaf followed by ``# <file or override>`` (or ``# default``)."""
    rows: list[tuple[str, str]] = []

    def walk(node: dict[str, Any], prefix: str, indent: int) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            pad = "  " * indent
            if isinstance(value, dict) and value:
                rows.append((f"{pad}{key}:", ""))
                walk(value, f"{path}.", indent + 1)
            else:
                rows.append((f"{pad}{key}: {_scalar(value)}", sources.get(path, DEFAULT_SOURCE)))

    walk(data, "", 0)
    width = min(60, max(len(text) for text, _ in rows))
    return "\n".join(f"{text.ljust(width)}  # {src}" if src else text for text, src in rows)


def describe_parameters(reg: Registry, name: str) -> list[tuple[str, str, str]]:
    """(parameter, type, default) for a registry entry."""
    import typing

    from dlrecipes.schema import type_name

    entry = reg.get(name)
    try:
        hints = typing.get_type_hints(entry.factory)
    except Exception:
        hints = {}
    out = []
    for pname, param in entry.parameters.items():
        default = "(required)" if param.default is inspect.Parameter.empty else _scalar(param.default)
        out.append((pname, type_name(hints[pname]) if pname in hints else "any", default))
    return out


def print_registry(reg: Registry) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{reg.group} ({len(reg)})", title_justify="left", show_lines=False)
    table.add_column("name", style="bold")
    table.add_column("description")
    table.add_column("parameters (default)")
    for entry in reg:
        params = "\n".join(f"{p}: {t} = {d}" for p, t, d in describe_parameters(reg, entry.name)) or "-"
        description = entry.description
        if "input_size" in entry.metadata:
            description += f"\ninput: {'x'.join(str(s) for s in entry.metadata['input_size'])}"
        table.add_row(entry.name, description, params)
    Console(width=max(120, Console().width)).print(table)
