# On a lent GPU machine, in the checkout, with .devcarry carried (made by scripts/gpu_machine_carry.sh):
#   source scripts/gpu_machine_setup.sh && python3 benchmarks/gpu_suite.py --check --only engine
# Unpacks once into /tmp/dlrecipes-carry (kept while the machine stays warm) and puts it on the paths.
carry=/tmp/dlrecipes-carry
if [ ! -d "$carry/site" ]; then
  mkdir -p "$carry" && tar -xJf .devcarry/site.tar.xz -C "$carry" && xz -dc .devcarry/weed.xz > "$carry/weed" \
    && chmod +x "$carry/weed" || { echo "gpu_machine_setup: .devcarry is missing or damaged" >&2; return 1; }
fi
export PYTHONPATH="$carry/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$carry:$PATH" PYTHONUNBUFFERED=1
python3 -c "import torch, composer, ffcv; print('torch', torch.__version__, '| Composer', composer.__version__, '|',
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
