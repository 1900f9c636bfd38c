#!/usr/bin/env bash
# Composer 0.32.1's own tests of every module that builds a Trainer, on CPU, twice: against Composer's Trainer, then with
# `composer.Trainer` replaced by dlrecipes' engine (scripts/conformance/ours.py). Prints both
# counts and every test that passes with Composer's Trainer but not with ours; fails when such a
# test is not listed, with its reason, in tests/composer_conformance_expected.txt.
#
#   scripts/composer_conformance.sh COMPOSER_SRC [extra pytest arguments]
#
# COMPOSER_SRC: a checkout of mosaicml/composer at tag v0.32.1 (the PyPI sdist lacks the tests),
# e.g. `git clone --branch v0.32.1 --depth 1 https://github.com/mosaicml/composer`.
# A developer tool: CI has no copy of Composer's repository. About 9 minutes on 2 CPU cores (5 min 10 s with
# Composer's Trainer, 3 min 30 s with ours, 2026-11-29).
# Composer's test files also import boto3 and scipy: `.venv/bin/pip install boto3 scipy`.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1/tests/trainer" ]; then
  echo "usage: $0 COMPOSER_SRC [pytest args]  (COMPOSER_SRC: a mosaicml/composer checkout at v0.32.1)" >&2
  exit 2
fi
src=$(cd "$1" && pwd); shift
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
out=${CONFORMANCE_OUT:-$repo/.conformance}
mkdir -p "$out"
version=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$src/composer/_version.py")
installed=$("$python" -c 'import composer; print(composer.__version__)')
if [ "$version" != "0.32.1" ] || [ "$installed" != "0.32.1" ]; then
  echo "$0: needs Composer 0.32.1 both in $src (found $version) and installed (found $installed)" >&2
  exit 2
fi
if ! "$python" -c "import boto3, scipy" 2>/dev/null; then
  echo "$0: Composer's test files import boto3 and scipy; install them: $python -m pip install boto3 scipy" >&2
  exit 2
fi
# Every test module of Composer's that builds a Trainer (its source says `Trainer(`), with the callback and logger
# modules whole and tests/test_events.py. Modules whose tests all need a GPU stay in: `-m 'not gpu'` deselects
# those tests (test_fsdp.py, test_tp.py, ...), and their CPU tests run. Left out, each with its reason:
excluded=(
  tests/test_full_nlp.py        # imports transformers at module level (not installed with dlrecipes): cannot be collected
  tests/trainer/test_fsdp2.py   # imports transformers at module level (cannot be collected), and FSDP2 needs GPUs
  # the object stores' clients: their Trainer tests are `remote` (deselected); the others wait on the network
  # (Databricks, Azure, GCS clients retrying for minutes on a machine offline) and build no Trainer
  tests/utils/object_store/test_azure_object_store.py
  tests/utils/object_store/test_gs_object_store.py
  tests/utils/object_store/test_uc_object_store.py
)
mapfile -t files < <(cd "$src" && {
  grep -rl --include='test_*.py' 'Trainer(' tests
  find tests/callbacks tests/loggers -name 'test_*.py'
  echo tests/test_events.py
} | sort -u | grep -vxF -f <(printf '%s\n' "${excluded[@]}"))
echo "$0: ${#files[@]} of Composer's test modules (${#excluded[@]} left out: see the script)" >&2
run() {  # run NAME [pytest args]: junit XML to $out/NAME.xml, pytest's summary line to the terminal
  local name=$1; shift
  echo "== Composer's tests with the $name Trainer" >&2
  # MLflow 3.x refuses the file store Composer's MLflow tests use unless allowed (both runs alike)
  (cd "$src" && PYTHONPATH="$repo/scripts/conformance${PYTHONPATH:+:$PYTHONPATH}" CUDA_VISIBLE_DEVICES= \
     MLFLOW_ALLOW_FILE_STORE=true \
     "$python" -m pytest -o addopts= -m 'not gpu and not doctest and not daily and not remote' \
     -p no:cacheprovider -q --junitxml="$out/$name.xml" "$@" "${files[@]}" > "$out/$name.log" 2>&1) || true
  grep -E '(passed|failed|errors?) in [0-9.]+s' "$out/$name.log" | tail -n 1 >&2 || true
}
run composer "$@"
run dlrecipes -p ours "$@"
if ! grep -q "composer.Trainer is dlrecipes.engine.Trainer" "$out/dlrecipes.log"; then
  echo "$0: the second run did not load scripts/conformance/ours.py (see $out/dlrecipes.log)" >&2
  exit 1
fi
"$python" "$repo/scripts/conformance/compare.py" "$out/composer.xml" "$out/dlrecipes.xml" \
  "$repo/tests/composer_conformance_expected.txt"
