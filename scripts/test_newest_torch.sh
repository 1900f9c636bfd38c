#!/usr/bin/env bash
# The test suite (without the slow end-to-end runs, but with the quickstart notebook) against the newest torch and torchvision pip
# offers, with Composer 0.32.1 installed beside them despite its torch<2.7.1 declaration: the
# "bring your own torch" install of README, in a second venv. CI runs it after the main suite, so
# the day a torch release breaks Composer or dlrecipes, CI says so.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-newest-torch}
python3 -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip torch torchvision uv
"$VENV/bin/uv" pip install --python "$VENV/bin/python" -e ".[dev,ffcv]" ./examples/plugin_package \
    --override requirements/torch-override.txt
"$VENV/bin/python" -c "import torch, torchvision, composer, numpy; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}, composer {composer.__version__}, numpy {numpy.__version__}')"
"$VENV/bin/python" -m pytest -m "not slow" -p no:cacheprovider "$@"
# and the quickstart notebook in a Jupyter kernel of that venv (a notebook user's torch is often the newest), and
# recipes/imagenet100_shards.yaml's whole pipeline (shards, progressive resizing; no compiler) trained from shards
"$VENV/bin/python" -m pytest -p no:cacheprovider -n 0 tests/test_notebooks.py tests/test_recipes.py \
    -k "quickstart_notebook or imagenet100_shards_trains_two_batches" "$@"
