#!/usr/bin/env bash
# What a lent GPU machine (Python 3.12, its own torch, no internet) lacks to run benchmarks/gpu_suite.py and
# benchmarks/upload_stall.py, packed into .devcarry/ (ignored; about 61 MB, under a call's 64 MiB with the
# checkout):
#   .devcarry/site.tar.xz  site/: Composer and the packages the machine's image lacks (wheels for Python 3.12,
#                          unpacked), FFCV built here (its module renamed for 3.12); lib/: FFCV's shared libraries
#   .devcarry/weed.xz      SeaweedFS's server (upload_stall.py)
# Run here, from the checkout, in the dev venv (pip install -e ".[dev,ffcv]"); then on the machine, carrying
# .devcarry:  source scripts/gpu_machine_setup.sh && python3 benchmarks/gpu_suite.py --check --only engine
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# dlrecipes' needs (with [s3]) that the machine's image does not hold (its package list: the device tool's KINDS.md)
MISSING="annotated-types argcomplete arrow backoff boto3 botocore coolname gql graphql-core importlib-metadata jmespath
mosaicml-cli mosaicml prompt_toolkit pydantic-core pydantic pytorch-ranger questionary ruamel.yaml s3transfer termcolor
torch_optimizer truststore tzdata validators wcwidth websockets"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# their wheels for Python 3.12, at the versions dlrecipes' wheelhouse pins (dlrecipes/tools/wheelhouse.py)
"$PY" - "$work/wheels" $MISSING <<'PYTHON'
import sys
from pathlib import Path

from dlrecipes.tools.wheelhouse import _download, _key, requirements

out, missing = Path(sys.argv[1]), {_key(name) for name in sys.argv[2:]}
pins = {name: pin for name, pin in requirements(("s3",), "3.12").items() if name in missing}
if missing - set(pins):
    sys.exit(f"gpu_machine_carry: not among dlrecipes' needs: {sorted(missing - set(pins))}")
without = _download(sorted(pins.values()), out, "3.12")
if without:
    sys.exit(f"gpu_machine_carry: no wheel for Python 3.12: {without}")
PYTHON
mkdir -p "$work/site" "$work/lib" .devcarry
for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
site=$("$PY" -c 'import ffcv, os; print(os.path.dirname(os.path.dirname(ffcv.__file__)))')
# FFCV and what it imports that the image lacks (cupy is there; pytorch_pfn_extras: its GPU NormalizeImage)
for package in ffcv ffcv-1.0.2.dist-info pytorch_pfn_extras; do cp -r "$site/$package" "$work/site/"; done
module=$(ls "$work"/site/ffcv/_libffcv.cpython-*.so)
mv "$module" "$work/site/ffcv/_libffcv.cpython-312-x86_64-linux-gnu.so"
ldd "$work/site/ffcv/_libffcv.cpython-312-x86_64-linux-gnu.so" | awk '/=> \// {print $3}' \
  | grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libz)\.so' | xargs -I{} cp -L {} "$work/lib/"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
tar -cJf .devcarry/site.tar.xz -C "$work" site lib
xz -T0 -6 -c "$(dirname "$PY")/weed" > .devcarry/weed.xz
du -sh .devcarry/*
