"""Training throughput on one GPU: ResNet-50 at 224 px and ResNet-18 at 32 px (CIFAR), over
precision (fp32, amp_fp16, amp_bf16), channels-last and torch.compile; synthetic data already
on the device, so the numbers are the model and the training loop alone.

    python benchmarks/gpu_throughput.py [--steps 50] [--warmup 20] [--json out.json]
    python benchmarks/gpu_throughput.py --models resnet50 --precisions amp_bf16 --channels-last on --compile on

Uses the same Trainer as `dlrecipes train` (recipes/quickstart.yaml as the base, with the
model, data, precision and algorithms overridden); batch sizes default to 256 (ResNet-50) and
1024 (ResNet-18), which fill an 80 GB GPU without reaching its memory limit.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
from pathlib import Path

import torch

from dlrecipes.api import resolve
from dlrecipes.tools.bench import measure_throughput

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "resnet50": ("{name: torchvision, arch: resnet50}", (3, 224, 224), 1000, 256),
    "resnet18_cifar": ("{name: cifar_resnet18}", (3, 32, 32), 10, 1024),
}


def overrides(model: str, precision: str, channels_last: bool, compile_: bool, batch: int, device: str) -> list[str]:
    spec, shape, classes, _ = MODELS[model]
    out = [
        f"model={spec}",
        f"dataset={{name: synthetic, input_shape: {list(shape)}, num_classes: {classes}, "
        f"train_samples: {4 * batch}, eval_samples: {batch}}}",
        f"trainer.batch_size={batch}",
        f"trainer.precision={precision}",
        f"trainer.device={device}",
        "trainer.loader=device",
        "trainer.num_workers=0",
        f"trainer.compile={'true' if compile_ else 'false'}",
        "optimizer={name: decoupled_sgdw, lr: 0.1, momentum: 0.9, weight_decay: 5.0e-5}",
        "scheduler=constant",
        "algorithms={channels_last: {}}" if channels_last else "algorithms={}",
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,resnet18_cifar")
    parser.add_argument("--precisions", default="fp32,amp_fp16,amp_bf16")
    parser.add_argument("--channels-last", default="off,on")
    parser.add_argument("--compile", default="off,on")
    parser.add_argument("--batch", type=int, help="override the per-model batch size")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--device", default="gpu", help="gpu (the point), or cpu for a smoke run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import composer

    meta = {
        "torch": torch.__version__,
        "composer": composer.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    print(json.dumps(meta), flush=True)
    rows = []
    grid = itertools.product(
        args.models.split(","), args.precisions.split(","), args.channels_last.split(","), args.compile.split(",")
    )
    for model, precision, cl, comp in grid:
        batch = args.batch or MODELS[model][3]
        config = resolve(
            ROOT / "recipes" / "quickstart.yaml",
            overrides(model, precision, cl == "on", comp == "on", batch, args.device),
        )
        result = measure_throughput(config, steps=args.steps, warmup=args.warmup)
        row = {"model": model, "precision": precision, "channels_last": cl, "compile": comp, **result}
        rows.append(row)
        print(
            f"{model:<15} {precision:<9} channels_last={cl:<3} compile={comp:<3} batch {batch:5d}: "
            f"{result['img_s']:9.0f} img/s  {result['step_ms']:8.1f} ms/step"
            + (f"  peak {result['peak_memory_mb']:.0f} MiB" if result["peak_memory_mb"] else ""),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
