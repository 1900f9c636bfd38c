#!/usr/bin/env bash
# Line coverage of dlrecipes/ by the main suite, the CLI subprocesses the tests start included
# ([tool.coverage] in pyproject.toml: `patch = subprocess` follows every child Python). The processes that tests and
# sweeps otherwise fork from a preloaded server are new Pythons here (DLRECIPES_TEST_FORK=0,
# DLRECIPES_SWEEP_FRESH_PYTHON=1): a run with coverage.py's fork and _exit patches instead lost whole modules'
# coverage (0% for one whose test had passed in a worker), so it follows new Pythons only.
# Usage: scripts/coverage.sh [pytest args]   (needs `pip install coverage>=7.10`; prints the total)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .coverage-data && mkdir -p .coverage-data
export DLRECIPES_TEST_FORK=0 DLRECIPES_SWEEP_FRESH_PYTHON=1
"$PY" -m coverage run -m pytest -p no:cacheprovider "$@" || status=$?
"$PY" -m coverage combine -q
"$PY" -m coverage report | grep -E "^TOTAL"
exit "${status:-0}"
