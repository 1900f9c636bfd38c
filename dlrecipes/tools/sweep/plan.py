"""A sweep's plan: its points, each a set of overrides, all known (and validated) before the first one trains.

``dlrecipes sweep RECIPE optimizer.lr=0.01,0.03 trainer.precision=fp32,amp_bf16 [--seeds N]`` sweeps the
Cartesian product of the comma-separated values (times N seeds), each point named from its values
(``lr=0.01,precision=amp_bf16,seed=1``).  A value in brackets or braces stays one value (``'key=[a,b]'``), as in
Hydra's multirun.  ``--trials N --search random`` instead samples N points from ranges:
``loguniform(1e-4,1e-1)``, ``uniform(a,b)``, ``randint(a,b)`` (both ends included), ``choice(a,b,c)``; an Optuna
search (``--search optuna``) draws its points one trial at a time (:mod:`dlrecipes.tools.sweep.run`), from
ranges checked here.  ``sweep.yaml`` in the sweep's folder records the plan.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dlrecipes.core.addresses import RUNS_DIR
from dlrecipes.core.secrets import redact
from dlrecipes.errors import RecipeError, UserError
from dlrecipes.records.store import RunStore, SweepFolder

SWEEP_FILE = "sweep.yaml"
DISTRIBUTION = re.compile(r"^(loguniform|uniform|randint|choice)\((.*)\)$")
SEARCHES = ("random", "optuna")


@dataclass
class Point:
    name: str
    values: dict[str, Any]  # swept key -> value (the seed included, as trainer.seed)
    overrides: list[str]  # what the point's train command adds to the fixed overrides
    trial: int | None = None  # its Optuna trial's number (--search optuna)


@dataclass
class SweepPlan:
    recipe: Path
    name: str
    fixed: list[str]
    swept: dict[str, list[Any]]  # key -> values (grid) or key -> [distribution text] (search)
    seeds: int
    points: list[Point]
    search: str | None = None
    trials: int | None = None
    folder: Path | None = None  # the sweep's folder here (runs_dir/<name>), given by its run store
    plugins: list[str] = field(default_factory=list)
    seed: int = 0  # the random search's (and Optuna's sampler's)
    nproc: int = 1  # processes (devices) per run: more than one trains through `dlrecipes launch -n nproc`
    trust_checkpoint: bool = False  # each training with --trust-checkpoint (this command's word: not in sweep.yaml)
    monitor: str = "top1"  # what an Optuna search optimizes (the recipe's checkpoint.monitor and mode)
    mode: str = "max"
    trains_into: str | None = None  # the points' runs_dir: ``folder``, or a bucket's s3://.../<name>
    after_point: Callable[[], None] | None = None  # called as each point's training ends (a bucket's upload)
    requests: Path | None = None  # where each training's run request is written for it (private, temporary)

    def record(self) -> dict[str, Any]:
        """What sweep.yaml records (secrets redacted, as in a run's recipe.yaml; compared redacted alike)."""
        return redact(
            {
                "recipe": str(self.recipe),
                "name": self.name,
                "fixed": self.fixed,
                "swept": self.swept,
                "seeds": self.seeds,
                "search": self.search,
                "trials": self.trials,
                "nproc": self.nproc,
                "points": [
                    {
                        "name": p.name,
                        "values": p.values,
                        "overrides": p.overrides,
                        **({"trial": p.trial} if p.trial is not None else {}),
                    }
                    for p in self.points
                ],
            }
        )


def split_values(raw: str) -> list[str]:
    """``a,b,[c,d],{e: 1, f: 2}`` -> ``['a', 'b', '[c,d]', '{e: 1, f: 2}']``: commas outside brackets,
    braces, parentheses and quotes."""
    parts, depth, quote, current = [], 0, "", ""
    for char in raw:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [p.strip() for p in parts]


def _value(text: str, key: str) -> Any:
    from dlrecipes.recipe import parse_assignment

    return parse_assignment(f"{key}={text}", "sweep value")[1]


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each key's name in a run name and a table header: its last part, or the whole path where two keys share
    a last part."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (short if last.count(short) == 1 else k) for k, short in zip(keys, last)}


def value_text(value: Any) -> str:
    """A swept value as run names and tables write it."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def point_name(values: dict[str, Any]) -> str:
    """``lr=0.003,precision=amp_bf16,seed=1``, filesystem-safe and at most 120 characters."""
    short = short_names(list(values))
    name = ",".join(f"{short[k]}={value_text(v)}" for k, v in values.items())
    name = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", name).strip("._") or "point"
    return name if len(name) <= 120 else f"{name[:100]}-{abs(hash(name)) % 10**8:08d}"


def _sample(key: str, spec: str, rng: random.Random) -> Any:
    match = DISTRIBUTION.match(spec.replace(" ", ""))
    if match is None:
        raise RecipeError(
            f"{key}: with --trials, a value is loguniform(a,b), uniform(a,b), randint(a,b) or "
            f"choice(a,b,...), got '{spec}'"
        )
    kind, args = match.group(1), split_values(match.group(2))
    if kind == "choice":
        return _value(rng.choice(args), key)
    try:
        low, high = (float(a) for a in args)
    except ValueError:
        raise RecipeError(f"{key}: {kind} takes two numbers, got '{spec}'") from None
    if not low < high or (kind == "loguniform" and low <= 0):
        raise RecipeError(
            f"{key}: {kind}({args[0]},{args[1]}) needs 0 {'< ' if kind == 'loguniform' else ''}low < high"
        )
    if kind == "loguniform":
        return float(f"{math.exp(rng.uniform(math.log(low), math.log(high))):.4g}")
    if kind == "uniform":
        return float(f"{rng.uniform(low, high):.4g}")
    return rng.randint(int(low), int(high))


def _range_spec(key: str, values: list[Any]) -> tuple[str, list[Any]] | None:
    """A swept key's range (``loguniform(a,b)`` ...) as its kind and parsed arguments (a choice's values, a range's
    two ends), checked as the random search checks them; None for a list of values."""
    if not (len(values) == 1 and isinstance(values[0], str) and DISTRIBUTION.match(values[0].replace(" ", ""))):
        return None
    _sample(key, values[0], random.Random(0))  # sound bounds
    match = DISTRIBUTION.match(values[0].replace(" ", ""))
    assert match is not None
    kind, args = match.group(1), split_values(match.group(2))
    if kind == "choice":
        return kind, [_value(a, key) for a in args]
    return kind, [int(float(a)) for a in args] if kind == "randint" else [float(a) for a in args]


def optuna_distribution(key: str, values: list[Any]) -> Any:
    """The Optuna distribution of a swept key: its range, or a choice among its listed values."""
    from dlrecipes.callbacks.optuna_trial import import_optuna

    distributions = import_optuna().distributions
    spec = _range_spec(key, values)
    if spec is not None and spec[0] == "randint":
        return distributions.IntDistribution(*spec[1])
    if spec is not None and spec[0] != "choice":
        return distributions.FloatDistribution(*spec[1], log=spec[0] == "loguniform")
    if spec is not None:
        values = spec[1]
    if not all(v is None or isinstance(v, (bool, int, float, str)) for v in values):
        raise RecipeError(f"{key}: with --search optuna, choices are numbers, strings or booleans, got {values}")
    return distributions.CategoricalDistribution(values)


def probe_points(plan: SweepPlan) -> list[dict[str, Any]]:
    """What a search can pick, to validate before the first run: each range's low end, then its high end, and
    every listed choice (at least two points)."""
    options = {
        key: (spec[1] if (spec := _range_spec(key, values)) else list(values)) for key, values in plan.swept.items()
    }
    count = max(2, *(len(v) for v in options.values()))
    return [{k: v[i % len(v)] for k, v in options.items()} for i in range(count)]


def overrides_of(values: dict[str, Any]) -> list[str]:
    """``key=value`` for each swept value (JSON for anything but a plain string)."""
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in values.items()]


def _split_assignments(assignments: Sequence[str], search: str | None) -> tuple[list[str], dict[str, list[Any]]]:
    """The fixed overrides, and each swept key's values (or, for a search, its range)."""
    fixed, swept = [], {}
    for item in assignments:
        if "=" not in item or item.startswith("~"):
            fixed.append(item)
            continue
        key, _, raw = item.partition("=")
        parts = split_values(raw)
        if search is not None and re.match(r"^\w+\(.*\)$", raw.strip()):
            _sample(key, raw, random.Random(0))  # a distribution we know, with sound bounds
            swept[key] = [raw]
        elif len(parts) > 1:
            if any(p == "" for p in parts):
                raise RecipeError(f"{key}: an empty value in '{raw}' (values are separated by commas)")
            swept[key] = [_value(p, key) for p in parts]
        else:
            fixed.append(item)
    return fixed, swept


def plan_sweep(
    recipe: str | Path,
    assignments: Sequence[str],
    seeds: int = 0,
    name: str | None = None,
    trials: int | None = None,
    search: str | None = None,
    seed: int = 0,
) -> SweepPlan:
    """The points of a sweep: the grid of the comma-separated values (or ``trials`` random samples), times
    ``seeds`` seeds; an Optuna search's points come later, one trial at a time."""
    fixed, swept = _split_assignments(assignments, search)
    if seeds < 0:
        raise RecipeError(f"--seeds: must be 0 or more, got {seeds}")
    if "trainer.seed" in swept and seeds:
        raise RecipeError("--seeds: trainer.seed is swept already; drop one of them")
    if search is not None:
        if search not in SEARCHES:
            raise RecipeError(f"--search: expected random or optuna, got '{search}'")
        if not trials or trials < 1:
            raise RecipeError(f"--trials: --search {search} needs --trials N (at least 1)")
        if not swept:
            raise RecipeError("nothing to search: give a key a range, e.g. optimizer.lr=loguniform(1e-4,1e-1)")
    if search == "optuna":
        if seeds:
            raise RecipeError(
                "--seeds: an Optuna search trains each trial once; search trainer.seed=choice(1,2,3) or drop --seeds"
            )
        for key, values in swept.items():
            optuna_distribution(key, values)  # every range one Optuna can sample
        return SweepPlan(
            Path(recipe), name or f"{Path(recipe).stem}-sweep", fixed, swept, 0, [], search, trials, seed=seed
        )
    if search is not None:
        rng = random.Random(seed)
        combos = []
        for _ in range(trials):
            combos.append(
                {k: (_sample(k, v[0], rng) if _range_spec(k, v) else rng.choice(v)) for k, v in swept.items()}
            )
    else:
        if trials is not None:
            raise RecipeError("--trials: only with --search random or --search optuna")
        if not swept and not seeds:
            raise RecipeError("nothing to sweep: give a key with several values (key=a,b) or --seeds N")
        combos = [dict(zip(swept, values)) for values in itertools.product(*swept.values())]
    points = []
    for combo in combos:
        for s in range(1, seeds + 1) if seeds else [None]:
            values = {**combo, **({"trainer.seed": s} if s is not None else {})}
            points.append(Point(point_name(values), values, overrides_of(values)))
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise RecipeError(f"two points of the sweep get the same name '{duplicate}': give distinct values")
    recipe = Path(recipe)
    return SweepPlan(recipe, name or f"{recipe.stem}-sweep", fixed, swept, seeds, points, search, trials, seed=seed)


def check_points(plan: SweepPlan) -> RunStore:
    """Validate every point of ``plan`` before the first one trains (an Optuna search, whose points come one by one:
    each range's ends instead; its monitored metric and mode taken from the recipe), each point's run checked to fit
    its store and, on ``plan.nproc`` processes, launch's setup; an error names its point. Returns the sweep's run
    store, made once."""
    from dlrecipes.config.device_checks import check_launch
    from dlrecipes.config.resolving import load_local
    from dlrecipes.config.validation import validate
    from dlrecipes.records.store import store_for

    checked = [(point.name, point.overrides) for point in plan.points]
    if plan.search == "optuna":
        base = validate(load_local(plan.recipe, plan.fixed, plan.plugins))
        plan.monitor, plan.mode = base.checkpoint.monitor or "top1", base.checkpoint.mode
        trial = json.dumps({"storage": "optuna.journal", "study": plan.name, "trial": 0, "monitor": plan.monitor})
        checked = [
            (point_name(values), [*overrides_of(values), f"callbacks.optuna_trial={trial}"])
            for values in probe_points(plan)
        ]
    store = None
    for name, overrides in checked:
        try:
            config = validate(load_local(plan.recipe, [*plan.fixed, *overrides, f"run_name={name}"], plan.plugins))
            store = store or store_for(config.runs_dir)  # the sweep's store, made once
            store.check_room(config)
            if plan.nproc > 1:
                check_launch(config, plan.nproc, plan.nproc)  # its batches divide over the processes, on the GPUs
        except UserError as exc:
            exc.args = (f"sweep point {name}: {exc}",)
            raise
    return store or store_for(RUNS_DIR)


def prepare_folder(plan: SweepPlan, store_folder: SweepFolder) -> Path:
    """The sweep's folder as its run store gives it (:meth:`~dlrecipes.records.store.RunStore.sweep`), with
    ``sweep.yaml``; the plan's points train where the store says (``trains_into``) and its ``after_point`` runs
    after each. An existing folder must hold a sweep with the same fixed overrides (its grid may grow or change:
    points already trained under their names are reused)."""
    folder = store_folder.folder
    record = plan.record()
    existing = folder / SWEEP_FILE
    if existing.is_file():
        before = yaml.safe_load(existing.read_text()) or {}
        if before.get("fixed") != record["fixed"] or str(before.get("recipe")) != record["recipe"]:
            raise UserError(
                f"--name: {folder} holds a sweep of other fixed settings ({existing}: recipe "
                f"{before.get('recipe')}, fixed {before.get('fixed')}); give another --name"
            )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SWEEP_FILE).write_text(yaml.safe_dump(record, sort_keys=False))
    plan.folder, plan.trains_into, plan.after_point = folder, store_folder.trains_into, store_folder.after_point
    return folder


__all__ = [
    "DISTRIBUTION",
    "Point",
    "SEARCHES",
    "SWEEP_FILE",
    "SweepPlan",
    "optuna_distribution",
    "overrides_of",
    "plan_sweep",
    "point_name",
    "prepare_folder",
    "probe_points",
    "short_names",
    "split_values",
    "value_text",
]
