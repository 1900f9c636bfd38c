"""The package's structure, enforced: which parts may import which, no import cycles, and the module tree that
docs/architecture.md shows (``python tests/test_architecture.py`` prints it as it should read).

Imports are read from the source (module level and inside functions alike), so a cycle
hidden behind an import inside a function counts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dlrecipes"

# Parts of the package, each a list of module prefixes, in the order of the stages.
PARTS = {
    "foundation": [
        "dlrecipes",
        "dlrecipes.errors",
        "dlrecipes.registry",
        "dlrecipes.core",
    ],  # "dlrecipes": its __init__, a docstring
    "runtime": ["dlrecipes.runtime"],  # the process around a run, beside the foundation
    "load+validate": ["dlrecipes.recipe", "dlrecipes.config", "dlrecipes.plugins"],
    # what recipes name by registry, and the engine: the Trainer class the builders put them in
    "components": [
        "dlrecipes.models",
        "dlrecipes.data",
        "dlrecipes.optim",
        "dlrecipes.algorithms",
        "dlrecipes.losses",
        "dlrecipes.metrics",
        "dlrecipes.callbacks",
        "dlrecipes.loggers",
        "dlrecipes.engine",
    ],
    "records": ["dlrecipes.records"],
    "build": ["dlrecipes.builders"],
    "fit": ["dlrecipes.fit"],
    "after training": ["dlrecipes.after_training"],  # a stage beside fit: a trained run evaluated, exported, predicted
    "tools": ["dlrecipes.tools"],
    "interface": [
        "dlrecipes.api",
        "dlrecipes.notebook",
        "dlrecipes.cli",
        "dlrecipes.cli_args",
        "dlrecipes.__main__",
        "dlrecipes.preload",
    ],  # preload: what the CLI's fork server imports once
}
# What each part must not import.
FORBIDDEN = {
    "foundation": [
        "runtime",
        "load+validate",
        "components",
        "records",
        "build",
        "fit",
        "after training",
        "tools",
        "interface",
    ],
    "runtime": ["load+validate", "components", "records", "build", "fit", "after training", "tools", "interface"],
    "load+validate": ["components", "records", "build", "fit", "after training", "tools", "interface"],
    "components": ["build", "fit", "after training", "tools", "interface"],
    "records": ["components", "build", "fit", "after training", "tools", "interface"],
    "build": ["fit", "after training", "tools", "interface"],
    "fit": ["after training", "tools", "interface"],
    "after training": ["fit", "tools", "interface"],
    "tools": ["interface"],
    "interface": [],
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """dlrecipes modules that ``name`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    targets = set()
    tree = ast.parse(path.read_text())
    if name == "dlrecipes":  # the lazy facade: its __getattr__ imports the interface when a name is first asked for
        tree.body = [
            node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
        ]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in MODULES:
                candidate = candidate.rpartition(".")[0]
            if candidate.startswith("dlrecipes") and candidate != name:
                targets.add(candidate)
    return targets


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def part_of(module: str) -> str:
    best = max(
        (
            (prefix, part)
            for part, prefixes in PARTS.items()
            for prefix in prefixes
            if module == prefix or module.startswith(prefix + ".")
        ),
        key=lambda pp: len(pp[0]),
    )
    return best[1]


def test_every_module_belongs_to_a_part():
    for module in MODULES:
        assert part_of(module) in PARTS


def test_parts_import_only_what_their_layer_allows():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        part = part_of(module)
        for target in sorted(targets):
            if part_of(target) in FORBIDDEN[part]:
                wrong.append(f"{module} ({part}) imports {target} ({part_of(target)})")
    assert not wrong, "\n".join(wrong)


def _cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return groups


def test_no_import_cycles():
    assert _cycles() == []


def test_the_checks_see_a_cycle_and_a_forbidden_import(monkeypatch):
    """The tests above would notice: a made-up registry -> builders -> registry loop."""
    graph = {**GRAPH, "dlrecipes.registry": GRAPH["dlrecipes.registry"] | {"dlrecipes.builders"}}
    monkeypatch.setitem(globals(), "GRAPH", graph)
    assert any({"dlrecipes.registry", "dlrecipes.builders"} <= set(group) for group in _cycles())
    assert part_of("dlrecipes.builders") in FORBIDDEN[part_of("dlrecipes.registry")]


def test_functions_stay_short():
    """No function in the package runs past about 60 lines (the stages' least of all)."""
    long = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, "\n".join(long)


MAX_MODULE_LINES = 500


def test_no_module_over_500_lines():
    """A module past 500 lines holds more than one responsibility: split it (as tools/sweep/ is, into its plan,
    its run and search, and its report; and engine/, into its loop, step, train metrics, events and close)."""
    long = [
        f"{module}: {len(path.read_text().splitlines())} lines"
        for module, path in sorted(MODULES.items())
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES
    ]
    assert not long, f"over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_no_private_name_is_imported_across_modules():
    """A name with a leading underscore is its module's own: another module of the package asks for a public one."""
    private = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("dlrecipes")):
                private += [
                    f"{module} imports {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not private, "\n".join(private)


def test_the_top_level_shows_the_stages_and_little_else():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == ["__main__", "api", "cli", "cli_args", "errors", "plugins", "preload", "recipe", "registry"]
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages == [
        "after_training",
        "algorithms",
        "builders",
        "callbacks",
        "config",
        "core",
        "data",
        "engine",
        "fit",
        "loggers",
        "losses",
        "metrics",
        "models",
        "notebook",
        "optim",
        "records",
        "runtime",
        "tools",
    ]


def test_import_dlrecipes_is_a_lazy_facade():
    """``import dlrecipes`` imports none of its modules (the top-level functions come on first use: a
    notebook's first cell stays instant) and takes under 0.3 s in a new Python."""
    import subprocess
    import sys
    import time

    code = (
        "import sys, time; t = time.perf_counter(); import dlrecipes; t = time.perf_counter() - t; "
        "print(t, sorted(m for m in sys.modules if m.startswith('dlrecipes')))"
    )
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    ).stdout.split(" ", 1)
    whole = time.perf_counter() - started
    assert out[1].strip() == "['dlrecipes']"
    assert float(out[0]) < 0.3, f"import dlrecipes took {float(out[0]):.2f} s (the interpreter, {whole:.2f} s)"
    import dlrecipes

    assert set(dlrecipes.PUBLIC) <= set(dir(dlrecipes)) and callable(dlrecipes.train)


def test_each_component_package_registers_in_its_registered_module():
    """One convention: a package's built-ins are registered in <package>/registered.py, nowhere else."""
    registering = {}
    for module, path in MODULES.items():
        text = path.read_text()
        if ".register(" in text and "@" in text and part_of(module) == "components":
            if any(line.lstrip().startswith("@") and ".register(" in line for line in text.splitlines()):
                registering[module] = path
    packages = {m.rsplit(".", 1)[0] for m in registering}
    assert all(m.endswith(".registered") for m in registering), sorted(registering)
    assert packages == {
        f"dlrecipes.{p}" for p in ("models", "data", "optim", "algorithms", "losses", "metrics", "callbacks", "loggers")
    }


def test_the_cli_is_thin():
    """Each command calls one dlrecipes.api function (and formats what it returns with tools/); the
    recipe arguments are declared once (recipe_command, in cli_args.py beside it)."""
    source = (PACKAGE / "cli.py").read_text()
    shared = (PACKAGE / "cli_args.py").read_text()
    tree = ast.parse(source)
    commands = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any("command" in ast.unparse(d) for d in node.decorator_list)
    ]
    assert len(commands) >= 12
    for command in commands:
        called = {
            n.attr
            for n in ast.walk(command)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "api"
        }
        assert len(called) == 1, f"{command.name} calls {sorted(called)} of dlrecipes.api"
    assert source.count('"recipe YAML file"') == 0 and source.count("key.path=value overrides") == 0
    assert shared.count('"recipe YAML file"') == 1 and shared.count("key.path=value overrides") == 1
    parts = set()
    for node in [*ast.walk(tree), *ast.walk(ast.parse(shared))]:
        if isinstance(node, ast.ImportFrom) and node.module.startswith("dlrecipes"):
            names = [a.name for a in node.names] if node.module == "dlrecipes" else [node.module.split(".")[1]]
            parts.update(names)
    assert parts <= {"api", "cli_args", "tools", "errors", "recipe", "data"}, parts


# --- the run directory's names have one owner ----------------------------------------------------------------

LAYOUT = "dlrecipes.records.layout"
# The run directory's file names (dlrecipes.records.layout owns them), spelled anywhere in a string ...
RUN_FILE_NAMES = re.compile(
    r"recipe\.yaml|recipe\.before-|summary\.json|history\.csv|run\.lock|run\.lease|train-rank|"
    r"latest-rank|latest\.txt|best\.pt|best\.json|eval\.json|\b(loss|accuracy|lr)\.png|\*\.png|-ba[*{\d]|"
    r"model\.torchscript\.pt|model\.onnx|verify\.json|preprocess\.json|classes\.json"
)
# ... and its folders' names, spelled as a path: `run_dir / "export"`, f"{run_dir}/tensorboard", "checkpoints/"
RUN_FOLDERS = ("checkpoints", "report", "export", "eval", "profiler", "tensorboard", "mlruns")
_FOLDER_IN_PATH = re.compile(rf"(^/|/$|^)({'|'.join(RUN_FOLDERS)})(/|$)")


def _run_file_spellings(source: str) -> list[str]:
    """The string literals in ``source`` that spell a name of the run directory; docstrings and help texts
    (``help=...``, ``_help(...)``: documentation, like docstrings) left out."""
    tree = ast.parse(source)
    prose = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            helps = [k.value for k in node.keywords if k.arg == "help"]
            if isinstance(node.func, ast.Name) and node.func.id == "_help":
                helps += node.args[:1]
            prose |= {id(n) for h in helps for n in ast.walk(h)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = node.value
            as_path = any(
                text == f"/{folder}" or text.startswith(f"/{folder}/") or f" {folder}/" in text
                for folder in RUN_FOLDERS
            )
            if RUN_FILE_NAMES.search(text) or as_path:
                found.append(f"line {node.lineno}: {text!r}")
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and str(node.right.value).strip("/") in RUN_FOLDERS
        ):
            found.append(f"line {node.lineno}: / {node.right.value!r}")
    return found


def test_only_the_layout_spells_the_run_directorys_names():
    """Every module asks dlrecipes.records.layout (a RunDir, or its constants) where a run's files are."""
    spelled = [
        f"{module} {where}"
        for module, path in sorted(MODULES.items())
        if module != LAYOUT
        for where in _run_file_spellings(path.read_text())
    ]
    assert not spelled, "\n".join(spelled)


def test_the_names_check_sees_every_name_the_layout_owns():
    from dlrecipes.records import layout

    names = [value for key, value in vars(layout).items() if key.isupper() and isinstance(value, str)]
    names += [*layout.PLOT_FILES.values(), *layout.EXPORTED_MODELS.values()]
    for name in names:
        spelled = name.format(rank=0, epoch=1, batch=2, stamp="20250101") if "{" in name else name
        assert RUN_FILE_NAMES.search(spelled) or spelled in RUN_FOLDERS, f"{name}: add it to the check"
    assert (
        _run_file_spellings(
            '"""in summary.json"""\nx = _help("keep best.pt")\ny = f(help="its export/")\nz = "metrics/eval/top1"'
        )
        == []
    )
    assert (
        len(
            _run_file_spellings(
                'p = run / "best.pt"\nq = run / "export"\nr = f"{run}/checkpoints"\n'
                's = f"train-rank{r}.log"\nt = "in its checkpoints/ folder"'
            )
        )
        == 5
    )


# --- one home per fact -------------------------------------------------------------------------------------------

PRECISION = "dlrecipes.core.precision"


def _precision_spellings(source: str) -> list[str]:
    """String literals equal to a ``trainer.precision`` value ("amp_fp16", ...): code that decodes the precision
    itself (prose that names one, an error message say, is a longer string and not counted)."""
    from dlrecipes.core.precision import PRECISIONS

    return [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRECISIONS
    ]


def test_only_the_precision_module_decodes_a_precision():
    """What fp32 / amp_fp16 / amp_bf16 mean (autocast dtype, GradScaler, half data, fused optimizer) is
    dlrecipes.core.precision's; the schema (config/sections.py) lists the values, and every other module asks."""
    spelled = [
        f"{module} {where}"
        for module, path in sorted(MODULES.items())
        if module not in (PRECISION, "dlrecipes.config.sections")
        for where in _precision_spellings(path.read_text())
    ]
    assert not spelled, "\n".join(spelled)
    assert len(_precision_spellings('if p == "amp_fp16":\n    raise E("amp_fp16 needs a GPU")\n')) == 1


def test_the_schema_and_the_precision_module_name_the_same_precisions():
    import typing

    from dlrecipes.config import TrainerConfig
    from dlrecipes.core.precision import PRECISIONS

    hint = typing.get_type_hints(TrainerConfig)["precision"]
    assert set(typing.get_args(hint)) == set(PRECISIONS)


def test_lr_scaling_has_one_home():
    """optimizer.scale_lr (its keys, check, rule and report) is dlrecipes.core.lr_scaling's: no other module
    reads its keys."""
    keys = {"scale_lr", "reference_batch_size"}
    spelled = [
        f"{module} line {node.lineno}: {node.value!r}"
        for module, path in sorted(MODULES.items())
        if module != "dlrecipes.core.lr_scaling"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in keys
    ]
    assert not spelled, "\n".join(spelled)


def test_secrets_are_redacted_in_one_place():
    """What a secret is and how it is hidden is dlrecipes.core.secrets': no other module spells a mask ("***") or
    matches an address's user info itself; every writer calls it."""
    spelled = [
        f"{module} line {node.lineno}: {node.value!r}"
        for module, path in sorted(MODULES.items())
        if module != "dlrecipes.core.secrets"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and ("***" in node.value or "://" in node.value and "@" in node.value)
    ]
    assert not spelled, "\n".join(spelled)
    writers = {
        "dlrecipes.records.run_dir",
        "dlrecipes.records.resume_check",
        "dlrecipes.records.history",
        "dlrecipes.loggers.run_record",
        "dlrecipes.loggers.run_log",
        "dlrecipes.errors",
        "dlrecipes.api",
        "dlrecipes.config.validation",
        "dlrecipes.fit.outcome",
    }
    assert {w for w in writers if "dlrecipes.core.secrets" not in GRAPH[w]} == set()


# --- what is built is kept, not searched for ---------------------------------------------------------------------


def _run_components() -> set[str]:
    """The package's callback and logger classes (and their mixins): what a builder makes for a run."""
    roots = re.compile(r"(Callback|Logger|LoggerDestination)$")
    bases: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if part_of(module) in ("components", "records"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases[node.name] = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
    found = {name for name, of in bases.items() if any(roots.search(b) for b in of)}
    found |= {base for name in found for base in bases[name] if base in bases}  # their mixins
    return found


def _type_scans(source: str, classes: set[str]) -> list[str]:
    """``isinstance(x, C)`` with C one of ``classes``: looking for an object by its type."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            names = {ast.unparse(n).rpartition(".")[2] for n in ast.walk(node.args[1])}
            if names & classes:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_the_builder_made_is_searched_for_by_its_type():
    """The run's history, terminal report, trackers and exporter are given what they need as they are built
    (a RunContext, dlrecipes.core.run_context) and the fit stage keeps what build_trainer returns (BuiltRun):
    no module finds one of the run's callbacks or loggers again with isinstance."""
    classes = _run_components()
    assert {"RunHistory", "TerminalReport", "RecordsTheRun", "ReadsAtInterval", "ExportForInference"} <= classes
    scans = [
        f"{module} {where}"
        for module, path in sorted(MODULES.items())
        for where in _type_scans(path.read_text(), classes)
    ]
    assert not scans, "\n".join(scans)
    assert _type_scans("h = next(c for c in cs if isinstance(c, RunHistory))\nisinstance(e, Diverged)", classes) == [
        "line 1: isinstance(c, RunHistory)"
    ]


def test_the_builders_are_given_the_device_and_the_recipe():
    """The device is resolved and the recipe turned into plain data once, by the caller (the fit stage): no builder
    resolves the device again, and nothing falls back to ``config.to_dict()`` when the recipe was not passed."""
    found = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if part_of(module) == "build" and isinstance(node, ast.Call) and ast.unparse(node.func) == "resolve_device":
                found.append(f"{module} line {node.lineno}: resolves the device")
            if isinstance(node, ast.IfExp) and "to_dict()" in ast.unparse(node.orelse):
                found.append(f"{module} line {node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


STORE = "dlrecipes.records.store"
STORE_SCHEMES = r"\b(s3|gs|oci|azure|dbfs):/"  # the object stores Composer's URI factory knows


def _where_branches(module: str, source: str) -> list[str]:
    """What in ``source`` asks whether a run is local or in a bucket: an import of one of the run store's
    implementations (only :mod:`dlrecipes.records.store` itself is public), an ``is_remote``, or a test of a
    string against an object store's scheme (``x.startswith("s3://")``, ``"gs://" in x``, ``== SCHEME``); whether
    a value is a URL at all (``"://" in value``: an input path that is not a file here) is not a run's place."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(STORE + "."):
            found.append(f"{module} line {line}: imports {node.module}")
        elif (
            isinstance(node, ast.Name)
            and node.id in ("is_remote", "SCHEME")
            or isinstance(node, ast.Attribute)
            and node.attr in ("is_remote", "SCHEME")
        ):
            found.append(f"{module} line {line}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Compare, ast.Call)):
            probe = (
                [node.left, *node.comparators]
                if isinstance(node, ast.Compare)
                else node.args
                if isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith", "find", "index")
                else []
            )
            if any(
                isinstance(arg, ast.Constant) and isinstance(arg.value, str) and re.search(STORE_SCHEMES, arg.value)
                for arg in probe
            ):
                found.append(f"{module} line {line}: {ast.unparse(node)}")
    return found


def test_only_the_run_store_asks_where_a_run_lives():
    """Whether a run is in a local folder or a bucket is decided inside dlrecipes.records.store alone: every other
    module goes through its interface (store_for, open_for_reading, select_runs, ...)."""
    found = [
        where
        for module, path in sorted(MODULES.items())
        if module != STORE and not module.startswith(STORE + ".")
        for where in _where_branches(module, path.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_store_check_sees_each_way_of_asking():
    source = (
        "from dlrecipes.records.store.bucket import RemoteRoot\nif url.startswith('s3://'): pass\n"
        "x = 's3://' in url\nis_remote(u)\nfrom dlrecipes.records.store import store_for\n"
    )
    assert [w.split(":")[0] for w in _where_branches("m", source)] == ["m line 1", "m line 2", "m line 3", "m line 4"]


# --- the package tree in docs/architecture.md cannot drift -------------------------------------------------------

ARCHITECTURE_DOC = PACKAGE.parent / "docs" / "architecture.md"
TREE_HEADING = "## The package, module by module"


def package_entries() -> list[str]:
    """Every package (``dlrecipes/core/``) and module (``dlrecipes/core/durations.py``) of dlrecipes, in the tree's
    order: a package's line (its ``__init__.py``), then its modules, then its subpackages, each alphabetically."""

    def walk(folder: Path) -> list[str]:
        found = [folder.relative_to(PACKAGE.parent).as_posix() + "/"]
        found += [
            p.relative_to(PACKAGE.parent).as_posix() for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"
        ]
        for package in sorted(p.parent for p in folder.glob("*/__init__.py")):
            found += walk(package)
        return found

    return walk(PACKAGE)


def documented_tree(markdown: str) -> list[tuple[str, str]]:
    """(path, its words) for each line of the first fenced block under :data:`TREE_HEADING`; a line's indentation
    (two spaces a level) puts it in the package on the line above it at one level less."""
    if TREE_HEADING not in markdown:
        return []
    block = markdown.split(TREE_HEADING, 1)[1].split("```", 2)[1]
    entries, packages = [], []
    for line in block.splitlines()[1:]:  # the first is the fence's language
        if line.strip():
            name, _, words = line.strip().partition(" ")
            del packages[(len(line) - len(line.lstrip())) // 2 :]
            entries.append(("".join(packages) + name, words.strip()))
            packages += [name] if name.endswith("/") else []
    return entries


def _docstring_words(path: str) -> str:
    """A new module's words, until someone writes better ones: its docstring's first line, shortened."""
    file = PACKAGE.parent / path / "__init__.py" if path.endswith("/") else PACKAGE.parent / path
    first = (ast.get_docstring(ast.parse(file.read_text())) or "(what it holds)").splitlines()[0]
    return first if len(first) <= 75 else first[:72].rsplit(" ", 1)[0] + " ..."


def tree_block(words: dict[str, str]) -> str:
    """The fenced block architecture.md shows under :data:`TREE_HEADING`: one line per package and module, indented
    by its depth, with its few ``words`` (by path: the doc's, else the module docstring's first line)."""
    rows = []
    for path in package_entries():
        depth = path.rstrip("/").count("/")
        name = path.rstrip("/").rpartition("/")[2] + ("/" if path.endswith("/") else "")
        rows.append(("  " * depth + name, words.get(path) or _docstring_words(path)))
    width = max(len(left) for left, _ in rows) + 2
    return "\n".join(["```text", *(left.ljust(width) + right for left, right in rows), "```"])


def test_the_architecture_doc_lists_every_module_and_nothing_else():
    """docs/architecture.md's tree names every package and module of dlrecipes, once, in the tree's order, each with
    a few words; ``python tests/test_architecture.py`` prints the block as it should read."""
    listed = documented_tree(ARCHITECTURE_DOC.read_text())
    paths, expected = [path for path, _ in listed], package_entries()
    missing = [p for p in expected if p not in paths]
    extra = [p for p in dict.fromkeys(paths) if p not in expected or paths.count(p) > 1]
    wordless = [p for p, words in listed if not words]
    problems = (
        ([f"no {TREE_HEADING!r} section with a fenced block"] if not listed else [])
        + [f"missing: {p}" for p in missing]
        + [f"listed but not in the package (or twice): {p}" for p in extra]
        + [f"no words: {p}" for p in wordless]
        + (["out of order"] if not (missing or extra) and paths != expected else [])
    )
    assert not problems, (
        "docs/architecture.md's package tree is not the package:\n  "
        + "\n  ".join(problems)
        + "\nthe block as it should read (the new lines' words from their docstrings):\n"
        + tree_block(dict(listed))
    )


def test_the_tree_check_sees_a_missing_and_an_extra_module():
    doc = (
        f"{TREE_HEADING}\n\n```text\ndlrecipes/  the package\n  core/  shared\n    made_up.py  not there\n"
        "  fit.py  the fit stage\n```\n"
    )
    assert documented_tree(doc) == [
        ("dlrecipes/", "the package"),
        ("dlrecipes/core/", "shared"),
        ("dlrecipes/core/made_up.py", "not there"),
        ("dlrecipes/fit.py", "the fit stage"),
    ]
    assert "dlrecipes/core/durations.py" in package_entries() and "dlrecipes/core/made_up.py" not in package_entries()
    assert tree_block({}).splitlines()[1].startswith("dlrecipes/ ")


if __name__ == "__main__":  # python tests/test_architecture.py: the tree block for docs/architecture.md
    print(tree_block(dict(documented_tree(ARCHITECTURE_DOC.read_text()))))


# strings naming a dlrecipes module (or package), and why each is one: the import graph above cannot see a module
# named by string, so that a name is never a way round the layers
NAMED_BY_STRING = {
    (
        "dlrecipes.api",
        "dlrecipes.preload",
    ): "multiprocessing's fork server imports its preload by name, in the server's "
    "own process only (the parent would pay the imports it is there to spare)",
    **{
        ("dlrecipes.plugins", f"dlrecipes.{package}"): "the built-in registrations are loaded as a plugin's are, by "
        "name: validation imports no component otherwise"
        for package in ("models", "data", "optim", "algorithms", "callbacks", "loggers", "losses", "metrics")
    },
    ("dlrecipes.loggers.run_record", "dlrecipes.recipe"): "a tracker's tag key, not the module",
    ("dlrecipes.loggers.wandb_logger", "dlrecipes.recipe"): "a tracker's tag key, not the module",
}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def test_no_module_names_another_by_string_but_those_listed_with_their_reason():
    """A module is imported by an import statement (which the graph above sees), or named as ``__name__`` /
    ``__package__`` where it names itself: a string naming another dlrecipes module is listed above, with why."""
    named = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                target = node.value.split(":")[0]
                if target in MODULES and target != "dlrecipes":
                    named.add((module, target))
    assert sorted(named - set(NAMED_BY_STRING)) == []
    assert sorted(set(NAMED_BY_STRING) - named) == []  # a reason for a name no longer there goes too


def test_the_builder_and_the_fit_stage_take_the_opened_run_not_paths_and_flags():
    """The run is opened once (dlrecipes.fit.open_run, in its store) and travels as that object: the builder and
    the fit stage take it: none of their functions takes a run directory as a path, none of their public ones the
    command's options as flags. After training likewise: what eval, export and predict take is the Trained that
    after_training.opened.open_trained yields (not a target, a recipe and a trust flag)."""
    import inspect

    from dlrecipes.after_training.evaluate import evaluate_run
    from dlrecipes.after_training.export import export_run
    from dlrecipes.after_training.predict import run_predictor
    from dlrecipes.after_training.trained_model import trained_model
    from dlrecipes.builders import build_bench_trainer, build_trainer
    from dlrecipes.fit import fit
    from dlrecipes.records.store import TrainingRun

    for function in (build_trainer, build_bench_trainer, fit):
        first = next(iter(inspect.signature(function).parameters.values()))
        assert first.annotation in (TrainingRun, "TrainingRun"), function.__name__
    for function in (evaluate_run, export_run, run_predictor, trained_model):  # after training: the opened run
        first = next(iter(inspect.signature(function).parameters.values()))
        assert first.annotation == "Trained", function.__name__
    paths = []
    opening = ("dlrecipes.after_training.opened", "dlrecipes.after_training.target")  # what makes the Trained
    after = [m for m in MODULES if m.startswith("dlrecipes.after_training.") and m not in opening]
    for module in ("dlrecipes.builders.trainer", "dlrecipes.builders.components", "dlrecipes.fit", *after):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                flags = () if node.name.startswith("_") else ("resume", "trust_checkpoint", "verbose", "restart")
                if module in after and not node.name.startswith("_"):  # the opened run carries these too
                    flags += ("trust", "config", "target")
                paths += [
                    f"{module}.{node.name}({a.arg})"
                    for a in [*node.args.args, *node.args.kwonlyargs]
                    if a.arg == "run_dir" or a.arg in flags
                ]
    assert paths == []


def test_the_default_runs_folder_and_the_gpu_comparison_are_each_written_once():
    """``runs`` (runs_dir's default) is dlrecipes.core.addresses.RUNS_DIR everywhere but the CLI's option defaults
    (the CLI imports no core module); whether a resolved device is the GPU is dlrecipes.core.devices.on_gpu, but in
    core/distributed.py, which devices.py imports; an exception's first line is dlrecipes.errors.first_line."""
    runs, gpu, first = [], [], []
    for module, path in MODULES.items():
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value == "gpu" for c in node.comparators
            ):
                gpu.append(module)
            if isinstance(node, ast.arguments):
                runs += [
                    module
                    for d in [*node.defaults, *node.kw_defaults]
                    if isinstance(d, ast.Constant) and d.value == "runs"
                ]
        idioms = (
            "str(exc).splitlines()[0]",
            "str(exc).splitlines() or [",
            "str(exc).strip().splitlines()",
            "for line in str(exc).splitlines() if line.strip())",
        )
        if module != "dlrecipes.errors" and any(idiom in source for idiom in idioms):
            first.append(module)
    assert set(runs) <= {"dlrecipes.cli"} and set(gpu) <= {"dlrecipes.core.devices", "dlrecipes.core.distributed"}
    assert first == []


# --- domain objects are named by their type -------------------------------------------------------------------

TYPED_PACKAGES = (
    "dlrecipes.records",
    "dlrecipes.tools",
    "dlrecipes.config",
    "dlrecipes.core",
    "dlrecipes.runtime",
    "dlrecipes.engine",
    "dlrecipes.loggers",
    "dlrecipes.callbacks",
    "dlrecipes.notebook",
    "dlrecipes.fit",
    "dlrecipes.metrics",
    "dlrecipes.losses",
    "dlrecipes.registry",
    "dlrecipes.recipe",
    "dlrecipes.api",
    "dlrecipes.plugins",
    "dlrecipes.data",
    "dlrecipes.algorithms",
    "dlrecipes.optim",
    "dlrecipes.models",
    "dlrecipes.after_training",
    "dlrecipes.builders",
)
# Parameters that always hold one of the package's (or Composer's, or torch's) own objects: a recipe (RecipeConfig), a
# run store (RunStore, or a bucket's Backend), Composer's State, Logger and Trainer, a sweep's SweepPlan, the fork
# server's Program; a batch (Composer's Batch, or the tensors a model takes), an Optimizer, a run (RunDir, TrainingRun,
# ...) and its layout, lock, history and checkpoint saver, a dataset's splits (DatasetSplits) or one split (a Dataset).
# Not here: ``model``, ``dataset`` and ``loader`` (the objects a notebook user passes, checked when given) and
# ``data`` (also a JSON value: secrets, resume_check).
DOMAIN_PARAMETERS = {
    "config",
    "store",
    "state",
    "logger",
    "trainer",
    "plan",
    "program",
    "batch",
    "optimizer",
    "run",
    "layout",
    "lock",
    "history",
    "saver",
    "splits",
    "split",
}


def _any_typed_domain_parameters() -> list[str]:
    found = []
    for module, path in sorted(MODULES.items()):
        if not any(module == p or module.startswith(p + ".") for p in TYPED_PACKAGES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [
                f"{module}:{node.lineno} {node.name}({arg.arg}: Any)"
                for arg in arguments
                if arg.arg in DOMAIN_PARAMETERS
                and arg.annotation is not None
                and ast.unparse(arg.annotation) in ("Any", "typing.Any", "Optional[Any]")
            ]
    return found


def test_domain_parameters_are_not_annotated_any():
    """A parameter named as in :data:`DOMAIN_PARAMETERS` (``config``, ``store``, ``state``, ``logger``, ``trainer``,
    ``plan``, ``program``, ``batch``, ``optimizer``, ``run``, ...) holds one known type (a RecipeConfig, a RunStore or
    a bucket's Backend, Composer's State, Logger, Trainer or Batch, a SweepPlan, a fork server's Program, an
    Optimizer, a RunDir, ...): annotated ``Any``, a reader (and a type checker) learns nothing of it, and the 286
    ``Any`` of issue 65 came back one convenient annotation at a time.  The types are imported under
    ``if TYPE_CHECKING:`` (nothing more is imported when the CLI starts) and within the layers above; where a
    module may not import the type, the parameter takes another name or a Protocol of the module's own layer."""
    assert not _any_typed_domain_parameters(), "\n".join(_any_typed_domain_parameters())


def _named_in(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def _module_exists(dotted: str) -> bool:
    return dotted in MODULES


def test_every_package_docstring_names_its_modules_and_every_reference_resolves():
    """What ``help(dlrecipes.X)`` says stays current, as the tree in docs/architecture.md does: each package's
    docstring names each of its modules and subpackages, every ``:mod:`` reference in it (relative or absolute) is
    a module, and docs/architecture.md's prose names only modules and files that exist."""
    stale = []
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        children = sorted(p.stem for p in path.parent.glob("*.py") if p.name != "__init__.py") + sorted(
            p.name for p in path.parent.iterdir() if (p / "__init__.py").is_file()
        )
        stale += [f"{name}: its docstring does not name {child}" for child in children if not _named_in(doc, child)]
        for ref in re.findall(r":mod:`~?([\w.]+)`", doc):
            dotted = name + ref if ref.startswith(".") else ref
            if not _module_exists(dotted):
                stale.append(f"{name}: :mod:`{ref}` is no module")
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    files = {
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.parent.rglob("*.py")
        if not {".venv", ".git", ".venv-newest-torch"} & set(p.parts)
    }
    for ref in set(re.findall(r"`([\w./]+\.py)`", text)):
        if not any(f == ref or f.endswith("/" + ref) for f in files):
            stale.append(f"docs/architecture.md: `{ref}` is no file")
    for ref in set(re.findall(r"`(dlrecipes\.[\w.]+)`", text)):
        if not (_module_exists(ref) or _module_exists(ref.rsplit(".", 1)[0])):  # a module, or a name in one
            stale.append(f"docs/architecture.md: `{ref}` is no module")
    assert stale == []
