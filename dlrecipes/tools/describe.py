"""Human-readable views of what the commands return: a resolved recipe with the source of every value,
registry listings, the closing lines of validate, train and eval, predict's rows, the comparison of runs."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from dlrecipes.registry import Entry, Registry

if TYPE_CHECKING:
    from pathlib import Path

    from dlrecipes.after_training.evaluate import EvalResult
    from dlrecipes.config.sections import RecipeConfig
    from dlrecipes.fit.outcome import TrainResult
    from dlrecipes.tools.sweep.plan import SweepPlan

DEFAULT_SOURCE = "default"


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _source_of(path: str, sources: dict[str, str]) -> str:
    """Where a value came from: its own key's source, else the nearest enclosing key's (a list such as
    ``metrics: [top1]`` is recorded as a whole and shown as a mapping), else the default."""
    while path:
        if path in sources:
            return sources[path]
        path = path.rpartition(".")[0]
    return DEFAULT_SOURCE


def render_with_sources(
    data: dict[str, Any], sources: dict[str, str], meaning: Callable[[str], str | None] | None = None
) -> str:
    """YAML lines of ``data``, each leaf followed by ``# <file or override>`` (or ``# default``); with ``meaning``
    (key path -> its meaning), each key is preceded by its meaning as comment lines (still valid YAML)."""
    import textwrap

    rows: list[tuple[str, str]] = []

    def explain(path: str, pad: str) -> None:
        said = meaning(path) if meaning is not None else None
        for line in textwrap.wrap(said or "", max(40, 100 - len(pad))):
            rows.append((f"{pad}# {line}", ""))

    def walk(node: dict[str, Any], prefix: str, indent: int) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            pad = "  " * indent
            explain(path, pad)
            if isinstance(value, dict) and value:
                rows.append((f"{pad}{key}:", ""))
                walk(value, f"{path}.", indent + 1)
            else:
                rows.append((f"{pad}{key}: {_scalar(value)}", _source_of(path, sources)))

    walk(data, "", 0)
    width = min(60, max(len(text) for text, src in rows if src) if any(src for _, src in rows) else 0)
    return "\n".join(f"{text.ljust(width)}  # {src}" if src else text for text, src in rows)


def describe_parameters(reg: Registry, name: str) -> list[tuple[str, str, str]]:
    """(parameter, type, default) for a registry entry."""
    import typing

    from dlrecipes.config.schema import type_name

    entry = reg.get(name)
    try:
        hints = typing.get_type_hints(entry.factory, include_extras=True)
    except Exception:
        hints = {}
    out = []
    for pname, param in entry.parameters.items():
        default = "(required)" if param.default is inspect.Parameter.empty else _scalar(param.default)
        out.append((pname, type_name(hints[pname]) if pname in hints else "any", default))
    return out


MODEL_CARD_COLUMNS = ("input", "param count", "pretrained")


def model_card(entry: Entry) -> dict[str, str]:
    """What ``list models`` says about a model beyond its parameters, from the entry's metadata:
    ``input_size`` (C, H, W), ``param_count`` (at the factory's defaults) and ``pretrained``
    (how to get pretrained weights; none when absent).  Nothing is built: ``list`` stays fast."""
    size = "x".join(str(s) for s in entry.metadata["input_size"]) if "input_size" in entry.metadata else "-"
    count = entry.metadata.get("param_count")
    if "arch" in entry.parameters:  # timm/torchvision: one factory, many architectures
        example = entry.metadata.get("example_params", {}).get("arch")
        size = f"depends on arch\n({example}: {size})" if example and size != "-" else "depends on arch"
        params = "depends on arch" if count is None else f"{count:,}"
    else:
        params = "-" if count is None else f"{count:,}"
    return {"input": size, "param count": params, "pretrained": entry.metadata.get("pretrained", "no")}


def _output_width() -> int:
    """The terminal's width, or 250 when standard output is a file or a pipe."""
    import shutil
    import sys

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else 250


def fitted_columns(
    columns: Sequence[tuple[str, str]],
    rows: list[list[str]],
    drop_order: Sequence[str],
    width: int,
    overhead: int = 2,
    per_column: int = 3,
) -> list[int]:
    """The indices of ``columns`` (key, header) a table of ``rows`` shows in ``width`` characters: the columns
    named in ``drop_order`` give way in that order, the others stay. ``per_column``: the border and padding
    a column adds; ``overhead``: the table's own."""
    natural = [max([len(header), *(len(row[i]) for row in rows)]) for i, (_, header) in enumerate(columns)]
    shown = list(range(len(columns)))
    keys = [key for key, _ in columns]
    for key in drop_order:
        if sum(natural[i] + per_column for i in shown) + overhead <= width:
            break
        if key in keys and keys.index(key) in shown:
            shown.remove(keys.index(key))
    return shown


def column_groups(
    columns: Sequence[tuple[str, str]],
    rows: list[list[str]],
    order: Sequence[int],
    width: int,
    overhead: int = 1,
    per_column: int = 3,
) -> list[list[int]]:
    """The columns of a table too wide for ``width``, as several tables stacked, each repeating column 0 (what
    names a row) and each fitting ``width``: the columns taken in ``order`` (most wanted first), each table
    filled before the next begins; no column is left out.  ``per_column``/``overhead``: as for
    :func:`fitted_columns`."""
    natural = [
        max([len(header), *(len(line) for row in rows for line in row[i].splitlines())])
        for i, (_, header) in enumerate(columns)
    ]
    groups, current = [], [0]
    for i in (i for i in order if i != 0):
        if len(current) > 1 and sum(natural[j] + per_column for j in (*current, i)) + overhead > width:
            groups.append(current)
            current = [0]
        current.append(i)
    return groups + [current]


def _rendered(renderable: Any, width: int | None = None) -> str:
    """A rich table as plain text: as wide as the terminal (rich wraps cells to fit), or unwrapped (up to
    250 columns) when the output goes to a file or a pipe, where a wrapped row would be hard to read back."""
    import io

    from rich.console import Console

    width = width or _output_width()
    out = io.StringIO()
    Console(file=out, width=width).print(renderable)
    return out.getvalue().rstrip("\n")


def _parameter_lines(reg: Registry, entry: Entry) -> list[str]:
    """``name: type = default``, then its meaning (indented), per parameter."""
    meanings = entry.meanings
    lines = []
    for p, t, d in describe_parameters(reg, entry.name):
        lines.append(f"{p}: {t} = {d}")
        if meanings.get(p):
            lines.append(f"  {meanings[p]}")
    return lines


def format_registry(reg: Registry, width: int | None = None) -> str:
    """What a registry holds: name, description, (model card,) parameters, defaults and meanings; a table, or one
    block per entry where the table's columns could not show their words whole in ``width`` (default: the
    terminal's)."""
    from rich.table import Table
    from rich.text import Text

    width = width or _output_width()
    cards = reg.group == "models"
    entries = [(entry, model_card(entry) if cards else {}, _parameter_lines(reg, entry)) for entry in reg]
    table = Table(title=f"{reg.group} ({len(reg)})", title_justify="left", show_lines=True)
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("description", min_width=24 if cards else None, overflow="fold")
    if cards:
        for column, most in zip(MODEL_CARD_COLUMNS, (10, 10, 12)):
            table.add_column(column, max_width=most, overflow="fold")
    table.add_column("parameters (default), each with its meaning", overflow="fold", min_width=40)
    for entry, card, params in entries:
        # plain text: a default such as [torchscript, onnx] would otherwise read as rich markup
        table.add_row(
            *(Text(cell) for cell in (entry.name, entry.description, *card.values(), "\n".join(params) or "-"))
        )
    if _narrowest(table) <= width and width >= 120:
        return _rendered(table, width)
    return "\n".join(
        [
            f"{reg.group} ({len(reg)})",
            *(_entry_block(entry.name, entry.description, card, params, width) for entry, card, params in entries),
        ]
    )


def format_entry(reg: Registry, name: str, width: int | None = None) -> str:
    """One entry in full (``dlrecipes list GROUP NAME``): its name, its whole description, its model card, and each
    parameter with its type, default and meaning, in ``width`` columns."""
    from dlrecipes.core.param_docs import summary

    entry = reg.get(name, key_path=f"list {reg.group}")
    width = width or _output_width()
    block = _entry_block(
        f"{reg.group}: {entry.name}",
        " ".join(summary(entry.factory.__doc__).split()),
        model_card(entry) if reg.group == "models" else {},
        _parameter_lines(reg, entry),
        min(width, 100),
    )
    return block + f"\n  (from {entry.source})"


def _narrowest(table: Any) -> int:
    """How narrow ``table`` can be with every word whole (rich's minimum measure, unclamped)."""
    from rich.console import Console

    return Console(width=100_000).measure(table).minimum


def _entry_block(name: str, description: str, card: dict[str, str], params: list[str], width: int) -> str:
    """A registry entry as lines of at most ``width - 1`` characters: the name, then indented its description,
    its model card and one parameter per line (a long one wrapped, further indented)."""
    import textwrap

    def fill(text: str) -> str:
        return textwrap.fill(
            text,
            width - 1,
            initial_indent="  ",
            subsequent_indent="      ",
            break_long_words=False,
            break_on_hyphens=False,
        )

    def meaning(text: str) -> str:
        return textwrap.fill(
            text.strip(),
            width - 1,
            initial_indent="      ",
            subsequent_indent="      ",
            break_long_words=False,
            break_on_hyphens=False,
        )

    lines = [name, fill(description)]
    if card:
        lines.append(fill(", ".join(f"{key}: {value}".replace("\n", " ") for key, value in card.items())))
    lines += [meaning(param) if param.startswith("  ") else fill(param) for param in params] or [
        fill("(no parameters)")
    ]
    return "\n".join(lines)


def validated(recipe: str | Path, config: RecipeConfig) -> str:
    """``validate``'s line: the recipe is valid, and what it trains; then what its GPU steps must read back."""
    from dlrecipes.config.device_checks import read_back_notes
    from dlrecipes.data.source_sizes import upsampling_notes

    return "\n".join(
        [
            f"ok: {recipe} ({config.model.name} on {config.dataset.name}, {config.trainer.max_duration})",
            *upsampling_notes(config),
            *read_back_notes(config),
        ]
    )


def trained(result: TrainResult, width: int | None = None) -> str:
    """``train``'s closing line and newline: epochs, batches, time, the last evaluation and the run directory, one
    part per line when wider than ``width`` (a terminal's); nothing but in the run's first process (torchrun's)."""
    from dlrecipes.core.distributed import rank

    if rank():
        return ""
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.eval_metrics.items()))
    ended = "done" if getattr(result, "status", "finished") == "finished" else result.status  # pruned
    parts = [
        f"{ended}: {result.epochs} epochs, {result.batches} batches in {result.seconds:.1f}s",
        *([result.reason] if getattr(result, "reason", "") and ended != "done" else []),
        *([f"eval {metrics}"] if metrics else []),  # none: nothing ran
        f"run directory {getattr(result, 'address', None) or result.run_dir}",
    ]  # a bucket's run: its address
    line = "; ".join(parts)
    return ("\n  ".join(parts) if width is not None and len(line) > width - 1 else line) + "\n"


def format_eval(result: EvalResult, width: int | None = None) -> str:
    """``eval``'s closing line, in train's form: the metrics, images/s and where the report went; in a
    terminal ``width`` wide, a longer line becomes the checkpoint's line and one indented line per part."""
    import textwrap

    metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.metrics.items()))
    tta = f" (tta {result.tta})" if result.tta else ""
    speed = f"{result.images:,} images in {result.seconds:.1f}s ({result.images_per_sec:,.0f} img/s)"
    where = f"report {result.out_dir}" if result.out_dir else ""
    line = f"eval {result.checkpoint}{tta}: {metrics}; {speed}" + (f"; {where}" if where else "")
    if width is None or len(line) <= width - 1:
        return line
    parts = [metrics, speed, *([where] if where else [])]
    return "\n".join(
        [
            f"eval {result.checkpoint}{tta}:",
            *(
                textwrap.fill(
                    part,
                    width - 1,
                    initial_indent="  ",
                    subsequent_indent="    ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
                for part in parts
            ),
        ]
    )


def format_predictions(rows: list[dict[str, Any]], out: str | Path | None = None, width: int | None = None) -> str:
    """One line per file (path, class, probability, the other top classes), then the count line; in a terminal
    ``width`` wide, a longer line puts the path on a line of its own and the classes on the next ones."""
    skipped = len(getattr(rows, "skipped", ()))
    fits = (lambda line: True) if width is None else (lambda line: len(line) <= width - 1)
    lines = []
    for row in rows:
        pieces = [f"{row['class']} {row['probability']:.3f}", *(f"{name} {p:.3f}" for name, p in row["top"][1:])]
        line = f"{row['path']}  {pieces[0]}" + (f"  ({'  '.join(pieces[1:])})" if pieces[1:] else "")
        if fits(line):
            lines.append(line)
            continue
        lines.append(str(row["path"]))
        current = " "
        for piece in pieces:  # each class and its probability stay together
            if current.strip() and not fits(f"{current} {piece}"):
                lines.append(current)
                current = " "
            current += f" {piece}"
        lines.append(current)
    count = f"{len(rows)} predicted, {skipped} skipped"
    written = f"written to {out}" if out is not None else ""
    if written and fits(f"{count}; {written}"):
        lines.append(f"{count}; {written}")
    else:
        lines += [count, written] if written else [count]
    return "\n".join(lines)


def format_comparison(summaries: list[dict[str, Any]], plot_path: Any, width: int | None = None) -> str:
    """``compare``'s table (one row per run) and where the plot went.  The recipe keys that differ among the
    runs come first after the run; wider than ``width`` (default: the terminal's), the table goes on in a
    second one below (the run repeated), and so on: no column is left out."""
    from rich.table import Table

    from dlrecipes.records.plots import COMPARE_COLUMNS, format_cell

    def shown(key: str) -> bool:  # a column nobody has a value in is left out, and status when all finished
        values = {format_cell(s.get(key)) for s in summaries}
        return values - {"-", "finished"} != set() or key == "run"

    settings = list(summaries[0].get("settings", {})) if summaries else []  # recipe keys that differ among them
    environment = list(summaries[0].get("environment", {})) if summaries else []  # provenance that differs
    columns = [(key, header) for key, header in COMPARE_COLUMNS[:1]]
    columns += [(f"settings.{k}", k) for k in settings]
    columns += [(f"environment.{k}", k) for k in environment]
    columns += [(key, header) for key, header in COMPARE_COLUMNS[1:] if shown(key)]

    def cell(summary: dict[str, Any], key: str) -> str:
        for group in ("settings", "environment"):
            if key.startswith(f"{group}."):
                return format_cell(summary.get(group, {}).get(key.removeprefix(f"{group}.")))
        return format_cell(summary.get(key))

    rows = [[cell(summary, key) for key, _ in columns] for summary in summaries]
    wanted = (
        "run",
        *(f"settings.{k}" for k in settings),
        *(f"environment.{k}" for k in environment),
        "best_top1",
        "status",
        "epochs",
        "batch_size",
        "precision",
        "images_per_sec",
        "wall_time_sec",
        "recipe",
        "peak_memory_mb",
        "microbatch",
    )
    keys = [key for key, _ in columns]
    order = [keys.index(key) for key in wanted if key in keys] + [i for i, key in enumerate(keys) if key not in wanted]
    width = width or _output_width()
    tables = []
    for n, group in enumerate(column_groups(columns, rows, order, width)):
        table = Table(title="runs" if n == 0 else None, title_justify="left")
        for i in sorted(group):
            table.add_column(columns[i][1], overflow="fold")
        for row in rows:
            table.add_row(*(row[i] for i in sorted(group)))
        tables.append(_rendered(table, width))
    return "\n".join(tables) + (f"\naccuracy vs wall-clock time: {plot_path}" if plot_path else "")


def format_runs(rows: list[dict[str, Any]], width: int | None = None) -> str:
    """``runs``' table: one line per run, as wide as ``width`` (default: the terminal's); wider, the columns
    that do not fit go on in a second table below (the run repeated), none left out."""
    from rich.table import Table

    from dlrecipes.records.runs import RUN_COLUMNS

    if not rows:
        return "no runs yet"
    cells = [[str(row.get(key) if row.get(key) is not None else "-") for key, _ in RUN_COLUMNS] for row in rows]
    wanted = ("run", "status", "epochs", "best", "recipe", "wall_time", "device", "precision", "started")
    keys = [key for key, _ in RUN_COLUMNS]
    order = [keys.index(key) for key in wanted if key in keys] + [i for i, key in enumerate(keys) if key not in wanted]
    width = width or _output_width()
    tables = []
    for group in column_groups(RUN_COLUMNS, cells, order, width - 1, overhead=0, per_column=1):
        table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0))
        for i in sorted(group):
            table.add_column(RUN_COLUMNS[i][1], overflow="fold")
        for row in cells:
            table.add_row(*(row[i] for i in sorted(group)))
        tables.append(_rendered(table, width))
    return "\n\n".join(tables)


def format_sweep(plan: SweepPlan, rows: list[dict[str, Any]]) -> str:
    """A sweep's table, one row per grid point, fitted to the terminal: each swept key headed by its last part
    (the line above names it in full), a mean ± std on one line, and on a narrow terminal peak memory, images/s,
    wall time and the final metric give way, in that order (summary.csv and summary.md keep them).  Below: why
    each point that did not finish stopped, where the files are and, when any did not finish, how many."""
    import textwrap

    from rich.table import Table

    from dlrecipes.tools.sweep.report import closing_line, key_legend, table_rows, unfinished

    header, body = table_rows(plan, rows, short=True)
    width = _output_width()
    first = next(i for i, column in enumerate(header) if column.startswith("best "))  # after the keys
    drop = ("peak MiB", "img/s", "wall s", header[first + 1], "runs")
    kept = fitted_columns([(column, column) for column in header], body, drop, width)
    table = Table()
    for i in kept:
        table.add_column(header[i], no_wrap=i >= first, overflow="fold")  # a key's long value may fold, no number
    for cells in body:
        table.add_row(*(cells[i] for i in kept))
    legend = key_legend(plan)
    lines = [textwrap.fill(f"sweep {plan.name}" + (f": {legend}" if legend else ""), width), _rendered(table)]
    left = unfinished(plan)
    lines += [
        textwrap.fill(
            f"{name}: {outcome['status']}: {outcome['reason']}", width, subsequent_indent="    ", break_on_hyphens=False
        )
        for name, outcome in left.items()
        if outcome["reason"]
    ]
    lines.append(f"{plan.folder}/summary.csv, summary.md, summary.png")
    return "\n".join(lines + ([closing_line(plan, left)] if left else []))


def version_line() -> str:
    """``dlrecipes --version``: ours, and the Composer and torch it runs on (read without importing them)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    from dlrecipes import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (
        f"dlrecipes {__version__} (composer {installed('mosaicml')}, torch {installed('torch')}, "
        f"python {sys.version.split()[0]})"
    )
