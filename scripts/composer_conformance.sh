#!/usr/bin/env bash
# Composer 0.32.1's own Trainer tests, on CPU, twice: against Composer's Trainer, then with
# `composer.Trainer` replaced by dlrecipes' engine (scripts/conformance/ours.py). Prints both
# counts and every test that passes with Composer's Trainer but not with ours; fails when such a
# test is not listed, with its reason, in tests/composer_conformance_expected.txt.
#
#   scripts/composer_conformance.sh COMPOSER_SRC [extra pytest arguments]
#
# COMPOSER_SRC: a checkout of mosaicml/composer at tag v0.32.1 (the PyPI sdist lacks the tests),
# e.g. `git clone --branch v0.32.1 --depth 1 https://github.com/mosaicml/composer`.
# A developer tool: CI has no copy of Composer's repository. About 4 minutes on 2 CPU cores.
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
files=(tests/trainer/test_trainer.py tests/trainer/test_trainer_eval.py tests/trainer/test_checkpoint.py
       tests/trainer/test_dataspec.py tests/trainer/test_predict.py tests/callbacks
       tests/algorithms/test_algorithms_train.py tests/test_events.py tests/loggers)
run() {  # run NAME [pytest args]: junit XML to $out/NAME.xml, pytest's summary line to the terminal
  local name=$1; shift
  echo "== Composer's tests with the $name Trainer" >&2
  # MLflow 3.x refuses the file store Composer's MLflow tests use unless allowed (both runs alike)
  (cd "$src" && PYTHONPATH="$repo/scripts/conformance${PYTHONPATH:+:$PYTHONPATH}" CUDA_VISIBLE_DEVICES= \
     MLFLOW_ALLOW_FILE_STORE=true \
     "$python" -m pytest -o addopts= -m 'not gpu and not doctest and not daily and not remote' \
     -p no:cacheprovider -q --junitxml="$out/$name.xml" "$@" "${files[@]}" > "$out/$name.log" 2>&1) || true
  grep -E '(passed|failed|errors?) in [0-9.]+s' "$out/$name.log" | tail -n 1 >&2
}
run composer "$@"
run dlrecipes -p ours "$@"
if ! grep -q "composer.Trainer is dlrecipes.engine.Trainer" "$out/dlrecipes.log"; then
  echo "$0: the second run did not load scripts/conformance/ours.py (see $out/dlrecipes.log)" >&2
  exit 1
fi
"$python" "$repo/scripts/conformance/compare.py" "$out/composer.xml" "$out/dlrecipes.xml" \
  "$repo/tests/composer_conformance_expected.txt"
