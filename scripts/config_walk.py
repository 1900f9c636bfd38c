"""Follow a resolved recipe through the code that builds a run (the architecture issue's measure).

    python scripts/config_walk.py [RECIPE] [key=value ...]

Runs ``dlrecipes.fit.fit`` on the recipe (default: recipes/quickstart.yaml) with the Trainer's
``fit`` left out, and records every call of a dlrecipes function that receives the config or one
of its sections as an argument.  Prints the modules in the order the config enters them, how many
times it enters each, how many times it climbs back into a module it had left for another, and
the same for the stages (load/validate, build, fit, ...: tests/test_architecture.py's parts).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _config_parts(config) -> set[int]:
    """The config and each of its sections (dataclasses, dicts and lists of the recipe's sections)."""
    parts = {id(config)}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) or isinstance(value, (dict, list)):
            parts.add(id(value))
    return parts


def walk(recipe: Path, overrides: list[str]) -> list[str]:
    from dlrecipes import api

    config = api.resolve(recipe, overrides)
    parts = _config_parts(config)
    entered: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("dlrecipes"):
            return
        values = [frame.f_locals.get(name) for name in frame.f_code.co_varnames[: frame.f_code.co_argcount]]
        if any(id(v) in parts for v in values):
            entered.append(module)

    import composer

    with tempfile.TemporaryDirectory() as tmp:
        config.runs_dir, config.checkpoint.save = tmp, False
        from dlrecipes.fit import fit as fit_stage
        from dlrecipes.fit import open_run

        fit, composer.Trainer.fit = composer.Trainer.fit, lambda self, *a, **k: None
        sys.setprofile(profile)
        try:
            fit_stage(open_run(config))
        finally:
            sys.setprofile(None)
            composer.Trainer.fit = fit
    return entered


def _visits(entered: list[str]) -> tuple[list[str], int]:
    """Consecutive calls in one place are one visit; a climb is a visit to a place left before."""
    runs = [m for i, m in enumerate(entered) if i == 0 or entered[i - 1] != m]
    left: set[str] = set()
    climbs = 0
    for previous, module in zip(runs, runs[1:]):
        left.add(previous)
        climbs += module in left
    return runs, climbs


def _stage(module: str) -> str:
    sys.path.insert(0, str(ROOT))
    from tests.test_architecture import PARTS

    best = max(
        ((p, part) for part, prefixes in PARTS.items() for p in prefixes if module == p or module.startswith(p + ".")),
        key=lambda pp: len(pp[0]),
        default=("", "?"),
    )
    return best[1]


def summary(entered: list[str]) -> str:
    runs, climbs = _visits(entered)
    stages, stage_climbs = _visits([_stage(m) for m in entered])
    lines = [" -> ".join(runs), "", "visits per module:"]
    lines += [f"  {module}: {count}" for module, count in Counter(runs).most_common()]
    lines.append(
        f"modules entered: {len(set(runs))}; visits: {len(runs)}; climbs back into a module left before: {climbs}"
    )
    lines.append(f"stages: {' -> '.join(stages)}; climbs back into a stage left before: {stage_climbs}")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    recipe = Path(args.pop(0)) if args and "=" not in args[0] else ROOT / "recipes" / "quickstart.yaml"
    print(summary(walk(recipe, ["trainer.device=cpu", "checkpoint.save=false", *args])))
