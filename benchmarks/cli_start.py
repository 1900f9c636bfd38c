"""How long the CLI takes to start, at two revisions of this repository side by side: ``dlrecipes --help`` and
``dlrecipes validate recipes/quickstart.yaml`` (what a user waits for before anything trains).

    python benchmarks/cli_start.py [--before REV] [--after REV] [--repeats 15] [--json out.json]

Each revision is checked out (``git worktree add --detach``) in a temporary folder and run with this Python
(``PYTHONPATH`` set to it), the two revisions interleaved command by command so that the machine's load falls on
both alike; the table gives each command's median and the ratio after/before. Defaults: ``--after`` the working
tree as it is, ``--before`` HEAD.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"--help": ["--help"], "validate": ["validate", "recipes/quickstart.yaml"]}


def checkout(rev: str, into: Path) -> Path:
    """``rev`` checked out in ``into`` (detached, removed at the end); the working tree itself for ``WORKTREE``."""
    if rev == "WORKTREE":
        return ROOT
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(into), rev],
        check=True,
        capture_output=True,
    )
    return into


def once(tree: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dlrecipes", *args], cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(
            f"cli_start: dlrecipes {' '.join(args)} failed in {tree} (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD")
    parser.add_argument("--after", default="WORKTREE", help="a revision, or WORKTREE (default): the files as they are")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats: at least 3 (the median of each)")
    with tempfile.TemporaryDirectory(prefix="cli-start-") as tmp:
        trees = {
            label: checkout(rev, Path(tmp) / label) for label, rev in (("before", args.before), ("after", args.after))
        }
        try:
            times: dict[tuple[str, str], list[float]] = {(c, label): [] for c in COMMANDS for label in trees}
            for label in trees:  # one run each first: bytecode compiled, files in the page cache
                for command in COMMANDS.values():
                    once(trees[label], command)
            for _ in range(args.repeats):
                for name, command in COMMANDS.items():
                    for label, tree in trees.items():
                        times[(name, label)].append(once(tree, command))
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True
                    )
    rows = []
    for name in COMMANDS:
        before, after = (statistics.median(times[(name, label)]) for label in ("before", "after"))
        rows.append(
            {
                "command": f"dlrecipes {' '.join(COMMANDS[name])}",
                "before_s": round(before, 3),
                "after_s": round(after, 3),
                "after/before": round(after / before, 3),
            }
        )
    print(f"before: {args.before}   after: {args.after}   median of {args.repeats}, interleaved")
    print(f"{'command':45} {'before':>8} {'after':>8} {'after/before':>13}")
    for row in rows:
        print(f"{row['command']:45} {row['before_s']:8.3f} {row['after_s']:8.3f} {row['after/before']:13.3f}")
    if args.json:
        args.json.write_text(json.dumps({"before": args.before, "after": args.after, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
