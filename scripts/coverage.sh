#!/usr/bin/env bash
# Line coverage of dlrecipes/ by the main suite, the CLI subprocesses the tests start included
# ([tool.coverage] in pyproject.toml: `patch = subprocess` follows every child Python, `fork` and `_exit` the
# processes forked from them, which end with os._exit).
# Usage: scripts/coverage.sh [pytest args]   (needs `pip install coverage>=7.10`; prints the total)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .coverage-data && mkdir -p .coverage-data
"$PY" -m coverage run -m pytest -p no:cacheprovider "$@" || status=$?
"$PY" -m coverage combine -q
"$PY" -m coverage report | grep -E "^TOTAL"
exit "${status:-0}"
