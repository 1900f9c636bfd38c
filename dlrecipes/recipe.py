"""Load a recipe: read YAML safely, follow ``base:``, apply ``key.path=value`` overrides.

The result is a plain nested dict plus, for every leaf, where its value came from (a file
or an override), which ``dlrecipes show`` prints.  Nothing here knows the schema: that is
:mod:`dlrecipes.config`'s job.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dlrecipes.errors import RecipeError, shown

MAX_BASE_DEPTH = 16
MAX_VALUES = 100_000  # values a YAML document may expand to through its aliases (recipes hold hundreds)

# A run's recipe.yaml begins and ends with these lines, so that one cut short where a line ends (a full disk, an
# interrupted copy), which still reads as a valid recipe with defaults for what was lost, is told from a whole one.
RUN_RECIPE_HEADER = "# The recipe this run trained with, every key resolved; its last line marks its end.\n"
RUN_RECIPE_END = "# end of the recipe\n"


# libyaml's parser where PyYAML was built with it (a 10 MB recipe read in about 1 s instead of 12; a recipe of
# the usual size in 2 ms instead of 5), PyYAML's own otherwise: the same constructors and resolvers either way.
# yaml.load(text, Loader=SAFE_LOADER) is yaml.safe_load(text), faster
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` keys may be overridden by explicit ones
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {key!r}", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
        seen[key] = True
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


def strict_loader(base: type = SAFE_LOADER) -> type:
    """A safe loader on ``base``'s parser that refuses duplicate keys instead of silently keeping the last, and
    reads ``1e-3`` as a float (YAML 1.1, PyYAML's, reads it as a string; people writing learning rates mean a
    float)."""

    class StrictSafeLoader(base):  # type: ignore[misc, valid-type]
        pass

    StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    StrictSafeLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return StrictSafeLoader


_StrictSafeLoader = strict_loader()


def parse_yaml(text: str, origin: str) -> Any:
    """Safe-load YAML ``text``; errors name ``origin`` and the line."""
    try:
        data = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{origin}, line {mark.line + 1}" if mark is not None else origin
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(f"{where}: invalid YAML: {problem}") from None
    try:
        expanded, written = _sizes(data, {}, set())
    except ValueError as exc:
        raise RecipeError(f"{origin}: {exc}") from None
    except RecursionError:
        raise RecipeError(f"{origin}: nested too deeply to read; a recipe needs a few levels") from None
    if expanded - written > MAX_VALUES:
        raise RecipeError(
            f"{origin}: its aliases expand to more than {MAX_VALUES:,} values (about {expanded:.3g}); "
            "a recipe needs a few hundred: write the values out, or use fewer nested aliases"
        )
    return data


def _sizes(value: Any, seen: dict[int, int], open_: set[int]) -> tuple[int, int]:
    """How many values ``value`` holds once every alias is expanded, and how many are written out (each
    aliased part counted once). Shared parts are measured once each, so a "billion laughs" document is
    measured in microseconds; an alias inside its own anchor (``a: &x [*x]``) is an error."""
    if not isinstance(value, (dict, list)):
        return 1, 1
    if id(value) in open_:
        raise ValueError("an alias refers to the node that holds it (a recursive anchor); write the value out")
    known = seen.get(id(value))
    if known is not None:
        return known, 0
    open_.add(id(value))
    parts = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    expanded = written = 1
    for part in parts:
        part_expanded, part_written = _sizes(part, seen, open_)
        expanded, written = expanded + part_expanded, written + part_written
    open_.discard(id(value))
    seen[id(value)] = expanded
    return expanded, written


def run_recipe_text(data: dict) -> str:
    """The text of a run's recipe.yaml: ``data`` as YAML between the header and the end line."""
    return RUN_RECIPE_HEADER + yaml.safe_dump(data, sort_keys=False) + RUN_RECIPE_END


def cut_short(text: str) -> bool:
    """Whether ``text`` begins as a run's recipe does but lacks its end line: the file was cut short. A recipe
    without the header (written by hand, or by an earlier dlrecipes) is never taken for one."""
    return text.startswith(RUN_RECIPE_HEADER) and not text.endswith(RUN_RECIPE_END)


def read_yaml_file(path: Path) -> dict:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {path}") from None
    except IsADirectoryError:
        raise RecipeError(f"recipe path is a directory, not a file: {path}") from None
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    if cut_short(text):
        raise RecipeError(
            f"{path}: cut short: a run's recipe ends with the line {RUN_RECIPE_END.strip()!r}, and this "
            "one stops before it; restore it from a copy (or delete its first line to use it as it is)"
        )
    data = parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    return data


@dataclass
class LoadedRecipe:
    """A merged recipe before validation."""

    path: Path
    data: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # "a.b.c" -> file or override
    from_file: bool = False  # read from ``path`` (a dict recipe, or the notebook's defaults, only stands for it)

    @property
    def name(self) -> str:
        return self.path.stem


def load_recipe(
    recipe: str | Path | Mapping[str, Any],
    overrides: Iterable[str] | Mapping[str, Any] = (),
    root: str | Path | None = None,
) -> LoadedRecipe:
    """Read ``recipe`` (a file, or a recipe as a Python mapping), merge its ``base:`` files in order (the recipe
    last), then ``overrides``: ``key=value`` strings, or a mapping of key paths to values
    (``{"optimizer.lr": 0.1}``).

    A mapping stands for a file named after its ``name`` (else ``recipe.yaml``) in ``root`` (default: the working
    directory): its ``base:`` files and relative data paths are found from there, as a file's are from its folder.
    """
    if isinstance(recipe, Mapping):
        folder = Path(root if root is not None else Path.cwd()).expanduser().resolve()
        data = plain_recipe(recipe)
        stem = data.get("name") if isinstance(data.get("name"), str) and data["name"].strip() else "recipe"
        path = folder / f"{Path(stem).name}.yaml"
        merged, sources = _with_bases(data, path, chain=(), origin="the recipe dict")
    elif isinstance(recipe, (str, Path)):
        path = Path(recipe)
        merged, sources = _load_with_bases(path.resolve(), chain=())
    else:
        raise RecipeError(f"recipe: expected a recipe file's path or a dict of sections, got {type(recipe).__name__}")
    loaded = LoadedRecipe(path=path, data=merged, sources=sources, from_file=not isinstance(recipe, Mapping))
    for override in override_strings(overrides):
        apply_override(loaded, override)
    return loaded


def plain_recipe(recipe: Mapping[str, Any]) -> dict:
    """A recipe given as a mapping, copied as the plain data a YAML file holds; a value YAML cannot hold (an
    object, a tensor, a function) is refused naming its key path."""

    def plain(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise RecipeError(f"{path or 'recipe'}: keys are strings, got {type(key).__name__} {shown(key)}")
                out[key] = plain(item, f"{path}.{key}" if path else key)
            return out
        if isinstance(value, (list, tuple)):
            return [plain(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, Path):
            return str(value)
        raise RecipeError(
            f"{path}: a recipe holds what a YAML file can (strings, numbers, lists, mappings), got "
            f"{type(value).__name__} {shown(value, 40)}; pass a model or data object as model=/train_data= instead"
        )

    return plain(recipe, "")


def override_strings(overrides: Iterable[str] | Mapping[str, Any]) -> list[str]:
    """Overrides as ``key=value`` strings; a mapping's values are written as YAML.  A bare string is refused: it
    would be read character by character."""
    if isinstance(overrides, str):
        raise RecipeError(
            f"overrides: expected a list of key=value strings or a dict, got the string "
            f"{overrides[:60]!r} (write [{overrides[:60]!r}])"
        )
    if isinstance(overrides, Mapping):
        return [
            f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            for key, value in overrides.items()
        ]
    items = list(overrides)
    wrong = next((item for item in items if not isinstance(item, str)), None)
    if wrong is not None:
        raise RecipeError(f"overrides: each one is a key=value string, got {type(wrong).__name__} {wrong!r}"[:300])
    return items


def _load_with_bases(path: Path, chain: tuple[Path, ...]) -> tuple[dict, dict[str, str]]:
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise RecipeError(f"base: recipes include each other in a cycle: {cycle}")
    if len(chain) >= MAX_BASE_DEPTH:
        raise RecipeError(f"base: more than {MAX_BASE_DEPTH} levels of base recipes at {path}")
    return _with_bases(read_yaml_file(path), path, chain, _display_path(path))


def _with_bases(data: dict, path: Path, chain: tuple[Path, ...], origin: str) -> tuple[dict, dict[str, str]]:
    """``data`` (the recipe read from ``path``, or standing for it) over its ``base:`` files."""
    bases = data.pop("base", None)
    if bases is None:
        bases = []
    elif isinstance(bases, str):
        bases = [bases]
    elif not (isinstance(bases, list) and all(isinstance(b, str) for b in bases)):
        raise RecipeError(f"{origin}: base: must be a file name or a list of file names, got {shown(bases)}")

    merged: dict = {}
    sources: dict[str, str] = {}
    for base in bases:
        base_path = (path.parent / base).resolve()
        if not base_path.exists():
            raise RecipeError(f"{origin}: base: file not found: {base} (looked for {base_path})")
        base_data, base_sources = _load_with_bases(base_path, (*chain, path))
        _merge_into(merged, sources, base_data, base_sources, prefix="")
    own_sources = {p: origin for p in _leaf_paths(data)}
    _merge_into(merged, sources, data, own_sources, prefix="")
    return merged, sources


def _merge_into(dst: dict, dst_sources: dict, src: dict, src_sources: dict, prefix: str) -> None:
    """Deep-merge ``src`` into ``dst``: mappings merge, everything else (lists too) replaces."""
    for key, value in src.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge_into(dst[key], dst_sources, value, src_sources, prefix=f"{path}.")
            continue
        if key in dst:  # replacing: the old value's sources go (a new key has none)
            _forget_sources(dst_sources, path)
        dst[key] = copy.deepcopy(value)
        for leaf in _leaf_paths({key: value}, prefix):
            dst_sources[leaf] = src_sources.get(leaf, "?")


def _leaf_paths(data: dict, prefix: str = "") -> list[str]:
    paths = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths.extend(_leaf_paths(value, f"{path}."))
        else:
            paths.append(path)
    return paths


def _forget_sources(sources: dict[str, str], path: str) -> None:
    for key in [k for k in sources if k == path or k.startswith(path + ".")]:
        del sources[key]


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def parse_assignment(item: str, what: str, form: str = "key=value") -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)`` with the value read as YAML: the one parser of assignments
    (recipe overrides, ``profile --param``, ``data convert``'s dataset parameters)."""
    if "=" not in item:
        raise RecipeError(f"{what} '{item}': expected {form}")
    key, _, raw = item.partition("=")
    return key, (parse_yaml(raw, f"{what} {item}") if raw.strip() else "")


def apply_override(recipe: LoadedRecipe, override: str) -> None:
    """Apply ``key.path=value`` (YAML value), ``key.path=null`` or ``~key.path`` (delete)."""
    label = f"override {override}"
    if override.startswith("~"):
        keys = _split_key_path(override[1:], override)
        parent = _walk(recipe.data, keys[:-1], override, create=False)
        if parent is None or keys[-1] not in parent:
            raise RecipeError(f"override {override}: nothing to delete at '{'.'.join(keys)}'")
        del parent[keys[-1]]
        _forget_sources(recipe.sources, ".".join(keys))
        return
    key_path, value = parse_assignment(override, "override", "key.path=value (or ~key.path to delete a key)")
    keys = _split_key_path(key_path, override)
    parent = _walk(recipe.data, keys[:-1], override, create=True)
    _forget_sources(recipe.sources, ".".join(keys))
    parent[keys[-1]] = value
    leaves = _leaf_paths({keys[-1]: value}, ".".join(keys[:-1]) + "." if len(keys) > 1 else "")
    for leaf in leaves:
        recipe.sources[leaf] = label


def _split_key_path(key_path: str, override: str) -> list[str]:
    keys = key_path.strip().split(".")
    if not all(keys):
        raise RecipeError(f"override '{override}': '{key_path}' is not a valid key path (a.b.c)")
    if keys[0] == "base":
        raise RecipeError(f"override '{override}': base: can only be set in a recipe file")
    return keys


def _walk(data: dict, keys: list[str], override: str, create: bool) -> dict | None:
    node = data
    for i, key in enumerate(keys):
        child = node.get(key)
        if child is None and create:
            child = node[key] = {}
        if child is None:
            return None
        if not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            raise RecipeError(f"override '{override}': '{where}' is a {type(child).__name__}, not a section")
        node = child
    return node
