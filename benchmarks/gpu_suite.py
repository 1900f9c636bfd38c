"""Everything the GPU-speed issue asks for, in one command and one table.

    python benchmarks/gpu_suite.py --check               # first: the correctness matrix (gpu_check.py, ~400 s)
    python benchmarks/gpu_suite.py --check --only engine # one of its sections (engine, sync, compile, ranks): <= 5 min
    python benchmarks/gpu_suite.py                       # on a GPU machine, no internet needed (~8-11 min on an H100)
    python benchmarks/gpu_suite.py --only flagship       # one section (each fits 5 minutes on an H100)
    python benchmarks/gpu_suite.py --tiny --device cpu   # smoke run at tiny sizes (the test suite runs this)

Its sections, each of which fits a machine lent for 5 minutes (estimates for one H100 from BENCHMARKS.md's
step times, about 65 ms for ResNet-50 at batch 256 and 10 ms for CIFAR ResNet-18 at batch 512, and FFCV's
20-25 s first compilation; not yet run there):

1. ``overhead`` (under a minute: 160 steps of each loop for each model) and ``overhead_compiled`` (2-4 minutes,
   mostly compiling both loops' models): ``dlrecipes bench`` (dlrecipes/Composer against a plain PyTorch loop
   on the same model, weights and batches on the device; both timed with one device wait per segment)
   for ResNet-50 at 224 px and CIFAR ResNet-18 at batch 512, bf16, channels-last, eager and
   with ``trainer.compile`` (the plain loop is compiled too).
2. ``flagship`` (about 2.5 minutes: the images made in parallel, two FFCV compilations, 6 epochs of 6,000
   images): the flagship recipe (recipes/imagenet100_fast.yaml) on a generated ImageNet-like JPEG folder
   converted to FFCV: the FFCV train loader alone (its device pipeline, final crop size), the
   model alone (its algorithms, batches already on the device, final crop size), and
   ``dlrecipes train`` end to end (first epoch and steady epochs from history.csv), then one more
   epoch in a new process: the first run on a machine compiles FFCV's pipelines into an empty
   numba cache, the next loads them.
3. ``precision`` (about 2.5 minutes: 10 processes of 40 steps): the precision experiment: fp32 / amp_fp16 /
   amp_bf16 / amp + gradient accumulation, ResNet-50 and CIFAR ResNet-18, each in its own process
   (benchmarks/precision.py): time, peak memory and the loss after a fixed number of steps.
4. ``augment`` (under a minute): strong augmentation on the device: images/s of each batch algorithm
   (``batch_randaugment`` with timm's rand-m9-mstd0.5-inc1, ``batch_trivialaugment``, ``batch_augmix`` with
   augmix-m5-w4-d2, ``batch_color_jitter``, ``batch_random_erasing``) on the flagship's batch at its crop size,
   under ``torch.cuda.set_sync_debug_mode("error")``: a host sync inside a batch fails the run.

5. ``decode`` (about 3 minutes; benchmarks/gpu_decode.py): JPEGs decoded on the device (``dataset.decode: device``):
   nvJPEG's batched decode alone, the device-decode loader alone, and ResNet-50 at 160 px (the flagship recipe)
   fed by it against FFCV at 160 px (goal: the loader never the bottleneck, at least 6,000 img/s on one H100).

6. ``speedrun`` (about 2 minutes: two cold processes, one compiling; benchmarks/speedrun.py): airbench94's own
   training code against recipes/cifar10_speedrun.yaml on the same synthetic CIFAR-10-sized data: the whole run's
   wall time including compilation and the steady step time (goals: steps at least 0.95 of airbench's speed, the
   whole run within 1.1x), and the same with the recipe uncompiled, as airbench's package trains.

They run in this order except that ``precision`` runs before ``flagship``; the table keeps this order.
Sections can be chosen (``--only overhead,augment``) or skipped (``--skip flagship,precision``); ``--json``
keeps every number.  With ``--check``, ``--only`` selects the check's sections (or cases by name) and ``--budget``
bounds each section.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from flagship_data import Scale, flagship_data, flagship_overrides  # noqa: E402
from gpu_throughput import overrides as throughput_overrides  # noqa: E402
from precision import own_process  # noqa: E402

from dlrecipes.api import resolve  # noqa: E402
from dlrecipes.core.devices import gpu_available, torch_device  # noqa: E402
from dlrecipes.tools.bench import measure_throughput, run_bench  # noqa: E402

# (name, gpu_throughput model key, batch, compile); --tiny shrinks batches and leaves ResNet-50 out
OVERHEAD_CASES = [
    ("ResNet-50 224 px", "resnet50", 256, False),
    ("ResNet-50 224 px", "resnet50", 256, True),
    ("CIFAR ResNet-18", "resnet18_cifar", 512, False),
    ("CIFAR ResNet-18", "resnet18_cifar", 512, True),
]
SECTIONS = ("overhead", "overhead_compiled", "flagship", "precision", "augment", "decode", "speedrun")


def overhead_cases(scale: Scale, compiled: bool):
    for name, model, batch, compile_ in OVERHEAD_CASES:
        if compile_ != compiled or (scale.tiny and (model == "resnet50" or compile_)):
            continue  # ResNet-50 and compilation take minutes on a CPU
        batch = 4 if scale.tiny else batch
        label = f"{name}, batch {batch}, {scale.precision}, channels-last, {'compiled' if compile_ else 'eager'}"
        yield label, model, batch, compile_


def overhead(scale: Scale, compiled: bool) -> list[dict]:
    rows = []
    for label, model, batch, compile_ in overhead_cases(scale, compiled):
        config = resolve(
            ROOT / "recipes" / "quickstart.yaml",
            throughput_overrides(model, scale.precision, True, compile_, batch, scale.device),
        )
        result = run_bench(config, steps=scale.steps, rounds=scale.rounds, warmup=scale.warmup)
        rows.append({"case": label, **result})
        print(
            f"overhead  {label:<60} plain {result['plain_img_s']:9.0f} img/s  dlrecipes "
            f"{result['dlrecipes_img_s']:9.0f} img/s  ratio {result['ratio']:.3f}",
            flush=True,
        )
    return rows


def _sync() -> None:
    if gpu_available():
        torch.cuda.synchronize()


def loader_alone(beton: Path, scale: Scale) -> list[float]:
    """Images/s of the flagship's FFCV train pipeline, epoch by epoch (no model)."""
    from dlrecipes.data.ffcv.loader import FFCVLoader, FFCVSource
    from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD

    device = torch_device(scale.device)
    source = FFCVSource(str(beton), True, scale.crop, 0.875, 0.25, True, IMAGENET_MEAN, IMAGENET_STD)
    loader = FFCVLoader(source, scale.flagship_batch, scale.workers, device, seed=0, channels_last=True)
    rates = []
    for _ in range(scale.epochs):
        _sync()
        start, seen = time.perf_counter(), 0
        for images, _ in loader:
            seen += images.shape[0]
        _sync()
        rates.append(seen / (time.perf_counter() - start))
    return rates


def model_alone(data: Path, scale: Scale) -> dict:
    """The flagship's model and algorithms at its final crop size on batches already on the device."""
    shape = [3, scale.crop, scale.crop]
    config = resolve(
        ROOT / "recipes" / "imagenet100_fast.yaml",
        flagship_overrides(data, scale)
        + [
            f"dataset={{name: synthetic, input_shape: {shape}, num_classes: {scale.classes}, "
            f"train_samples: {4 * scale.flagship_batch}, eval_samples: {scale.flagship_batch}}}",
            "trainer.loader=device",
            "trainer.num_workers=0",
            "~algorithms.progressive_resizing",
        ],
    )
    return measure_throughput(config, steps=scale.steps * 2, warmup=scale.warmup)


def end_to_end(data: Path, runs: Path, scale: Scale, numba_cache: Path | None, epochs: int, name: str) -> dict:
    """``dlrecipes train`` of the flagship in its own process, numba's cache in ``numba_cache`` (None: where this
    process has it)."""
    cmd = [
        sys.executable,
        "-m",
        "dlrecipes",
        "train",
        str(ROOT / "recipes" / "imagenet100_fast.yaml"),
        *flagship_overrides(data, scale),
        f"trainer.max_duration={epochs}ep",
        "trainer.progress_bar=false",
        "checkpoint.save=false",
        "checkpoint.monitor=null",
        f"runs_dir={runs}",
        f"run_name={name}",
    ]
    start = time.perf_counter()
    # a new Python on the CPU too: what numba prints as the interpreter exits is on stderr only then (not forked)
    env = {**os.environ, **({"NUMBA_CACHE_DIR": str(numba_cache)} if numba_cache else {})}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"flagship run failed:\n{done.stderr[-3000:]}")
    with open(runs / name / "history.csv") as f:
        rates = [float(row["images_per_sec"]) for row in csv.DictReader(f)]
    return {
        "epochs": rates,
        "first": rates[0],
        "steady": statistics.median(rates[1:]) if len(rates) > 1 else rates[0],
        "process_s": time.perf_counter() - start,
        "numba_tracebacks": done.stderr.count("Exception ignored"),
    }


def flagship(scale: Scale, data_dir: Path | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ffcv = flagship_data(scale, data_dir or Path(tmp) / "images")
        loader = loader_alone(ffcv / "train.beton", scale)
        print(f"flagship  loader alone: {', '.join(f'{r:.0f}' for r in loader)} img/s per epoch", flush=True)
        model = model_alone(ffcv, scale)
        print(f"flagship  model alone: {model['img_s']:.0f} img/s", flush=True)
        # a machine's first run compiles FFCV's pipelines into an empty numba cache; the next loads them
        # (the smoke run measures nothing: its run shares this process's cache, and the loader alone's pipeline)
        cache = None if scale.tiny else Path(tmp) / "numba-cache"
        e2e = end_to_end(ffcv, Path(tmp) / "runs", scale, cache, scale.epochs, "flagship")
        print(f"flagship  end to end: {', '.join(f'{r:.0f}' for r in e2e['epochs'])} img/s per epoch", flush=True)
        # the next run (pipelines from numba's cache): measured at full size; the smoke run leaves it to
        # tests/test_ffcv.py, which proves the cache (a third numba process here would add half a minute)
        again = None if scale.tiny else end_to_end(ffcv, Path(tmp) / "runs", scale, cache, 1, "flagship_again")
        if again is not None:
            print(f"flagship  next run, first epoch: {again['first']:.0f} img/s", flush=True)
    steady_loader = statistics.median(loader[1:]) if len(loader) > 1 else loader[0]
    bound = min(steady_loader, model["img_s"])
    return {
        "loader_epochs": loader,
        "loader_steady": steady_loader,
        "model_img_s": model["img_s"],
        "end_to_end": e2e,
        "next_run_first": again and again["first"],
        "steady_vs_bound": e2e["steady"] / bound,
        "first_vs_steady": e2e["first"] / e2e["steady"],
        "next_run_first_vs_steady": again and again["first"] / e2e["steady"],
        "numba_tracebacks": e2e["numba_tracebacks"] + (again["numba_tracebacks"] if again else 0),
    }


def precision(scale: Scale) -> list[dict]:
    models = "resnet18_cifar" if scale.tiny else "resnet50,resnet18_cifar"
    batch, steps = (8, 2) if scale.tiny else (128, 40)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "precision.json"
        done = own_process(
            [
                "--device",
                scale.device,
                "--models",
                models,
                "--batch",
                str(batch),
                "--steps",
                str(steps),
                "--json",
                str(out),
            ],
            scale.device,
            script=HERE / "precision.py",
        )
        if done.returncode != 0:
            raise RuntimeError(f"precision runs failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


AUGMENT_CASES = [
    ("batch_randaugment", {"policy": "rand-m9-mstd0.5-inc1"}),
    ("batch_trivialaugment", {}),
    ("batch_augmix", {"policy": "augmix-m5-w4-d2"}),
    ("batch_color_jitter", {"hue": 0.1}),
    ("batch_random_erasing", {"value": "random"}),
]


def augmentation(scale: Scale) -> list[dict]:
    """Images/s of each batch augmentation on a normalised channels-last batch on the device, timed with one
    device wait, its batches run under the sync-debug gate (an error at any host sync)."""
    from torchvision.transforms import v2

    from dlrecipes import registry
    from dlrecipes.algorithms.augment_policy import batch_rng
    from dlrecipes.data.transforms import IMAGENET_MEAN, IMAGENET_STD

    device = torch_device(scale.device)
    normalise = v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)  # what the algorithms read the normalisation from
    images = torch.randn(scale.flagship_batch, 3, scale.crop, scale.crop, device=device)
    images = images.contiguous(memory_format=torch.channels_last)
    rows = []
    for name, params in AUGMENT_CASES:
        algorithm = registry.algorithms.get(name).factory(**params)
        for i in range(scale.warmup):
            algorithm.augment(images, batch_rng(0, 0, i, name), lambda: normalise)
        _sync()
        start = time.perf_counter()
        try:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")
            for i in range(scale.steps):
                algorithm.augment(images, batch_rng(0, 0, scale.warmup + i, name), lambda: normalise)
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        _sync()
        img_s = scale.steps * scale.flagship_batch / (time.perf_counter() - start)
        rows.append(
            {
                "algorithm": name,
                "params": params,
                "batch": scale.flagship_batch,
                "crop": scale.crop,
                "img_s": img_s,
                "sync_gate": device.type == "cuda",
            }
        )
        print(f"augment   {name:<22} {params!s:<40} {img_s:9.0f} img/s", flush=True)
    return rows


def speedrun(scale: Scale) -> list[dict]:
    """benchmarks/speedrun.py: airbench94's train() and the speedrun recipe, compiled and eager (tiny: eager)."""
    rows = []
    for eager in (False, True) if not scale.tiny else (True,):
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "speedrun.json"
            size = ["--tiny"] if scale.tiny else []
            cmd = [sys.executable, str(HERE / "speedrun.py"), "--device", scale.device, *size, "--json", str(out)]
            subprocess.run(cmd + (["--eager"] if eager else []), check=True, cwd=ROOT)
            rows.append(json.loads(out.read_text()))
    return rows


def table(results: dict) -> str:
    lines = [
        f"device: {results['meta']['device']}; torch {results['meta']['torch']}, "
        f"Composer {results['meta']['composer']}, Python {results['meta']['python']}",
        "",
    ]
    if "overhead" in results:
        lines += [
            "| trainer overhead | plain loop img/s | dlrecipes img/s | ratio | overhead ms/step |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['case']} | {r['plain_img_s']:,.0f} | {r['dlrecipes_img_s']:,.0f} | {r['ratio']:.3f} | "
            f"{r['overhead_ms_per_step']:.2f} |"
            for r in results["overhead"]
        ]
        lines.append("")
    if "flagship" in results:
        f = results["flagship"]
        e = f["end_to_end"]
        lines += [
            "| flagship (imagenet100_fast) | img/s |",
            "|---|---|",
            f"| FFCV loader alone, steady | {f['loader_steady']:,.0f} |",
            f"| model alone (final crop, its algorithms) | {f['model_img_s']:,.0f} |",
            f"| end to end, first epoch (the machine's first run: compiles FFCV's pipelines) | {e['first']:,.0f} |",
            f"| end to end, first epoch (the next run: pipelines from numba's cache) | "
            f"{'-' if f['next_run_first'] is None else format(f['next_run_first'], ',.0f')} |",
            f"| end to end, steady epochs (median) | {e['steady']:,.0f} |",
            f"| steady / min(loader, model) | {f['steady_vs_bound']:.2f} |",
            f"| first epoch / steady: first run, next run | {f['first_vs_steady']:.2f}, "
            f"{'-' if f['next_run_first_vs_steady'] is None else format(f['next_run_first_vs_steady'], '.2f')} |",
            f"| numba tracebacks on stderr (both runs) | {f['numba_tracebacks']} |",
            "",
        ]
    if "augment" in results:
        lines += ["| augmentation on the device (batch, crop) | img/s | under the sync gate |", "|---|---|---|"]
        lines += [
            f"| {r['algorithm']} {r['params'] or ''} ({r['batch']}, {r['crop']} px) | {r['img_s']:,.0f} | "
            f"{'yes' if r['sync_gate'] else 'no (CPU)'} |"
            for r in results["augment"]
        ]
        lines.append("")
    if "decode" in results:
        d = results["decode"]
        nv = "-" if d["nvjpeg_img_s"] is None else format(d["nvjpeg_img_s"], ",.0f")
        ffcv = "-" if d.get("ffcv") is None else format(d["ffcv"]["steady"], ",.0f")
        lines += [
            f"| JPEGs decoded on the device ({d['crop']} px) | img/s |",
            "|---|---|",
            f"| nvJPEG batched decode alone | {nv} |",
            f"| device-decode loader alone, steady | {statistics.median(d['loader_epochs']):,.0f} |",
            f"| ResNet-50 fed by device decoding, steady epochs | {d['device_decode']['steady']:,.0f} |",
            f"| ResNet-50 fed by FFCV, steady epochs | {ffcv} |",
            "",
        ]
    if "speedrun" in results:
        lines += [
            "| speedrun (airbench94 vs recipes/cifar10_speedrun.yaml) | imports s | whole run s | steady step ms | "
            "step speed ratio | whole-run ratio (with imports) |",
            "|---|---|---|---|---|---|",
        ]
        for r in results["speedrun"]:
            how = "compiled" if r["compiled"] else "eager"
            lines += [
                f"| airbench's train() | {r['import_s_airbench']:.2f} | {r['wall_s_airbench']:.2f} | "
                f"{r['steady_step_ms_airbench']:.2f} | | |",
                f"| the recipe, {how} | {r['import_s_dlrecipes']:.2f} | {r['wall_s_dlrecipes']:.2f} | "
                f"{r['steady_step_ms_dlrecipes']:.2f} | {r['step_speed_ratio']:.3f} | {r['wall_ratio']:.3f}x "
                f"({r['wall_with_imports_ratio']:.3f}x) |",
            ]
        lines.append("")
    if "precision" in results:
        lines += [
            "| precision | model | train s | img/s | peak MiB | loss after the steps |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['config']} | {r['model']} | {r['train_s']:.1f} | {r['img_s']:,.0f} | {r['peak_memory_mb']:,.0f} | "
            f"{r['train_loss']:.4f} |"
            for r in results["precision"]
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke run, not a measurement")
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated sections to run: {','.join(SECTIONS)} "
        "(with --check: a section of the check, engine, sync, compile or ranks, or "
        "text in its cases' names)",
    )
    parser.add_argument("--skip", default="", help=f"comma-separated sections to leave out: {','.join(SECTIONS)}")
    parser.add_argument("--data-dir", type=Path, help="keep (and reuse) the generated flagship images here")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--check",
        action="store_true",
        help="run the engine's correctness matrix instead (benchmarks/gpu_check.py), not the speed suite",
    )
    parser.add_argument("--budget", type=float, help="with --check: seconds for each section (default 300)")
    args = parser.parse_args()
    if args.check:
        import gpu_check

        forwarded = {
            "--device": args.device,
            "--json": args.json,
            "--only": args.only or None,
            "--budget": args.budget,
            "--data-dir": args.data_dir,
        }
        sys.exit(
            gpu_check.main([str(x) for key, value in forwarded.items() if value is not None for x in (key, value)])
        )
    only, skip = (set(filter(None, text.split(","))) for text in (args.only, args.skip))
    unknown = sorted((only | skip) - set(SECTIONS))
    if unknown:
        sys.exit(f"gpu_suite: no section {', '.join(unknown)} (the sections: {', '.join(SECTIONS)})")
    if args.device == "gpu" and not gpu_available():
        sys.exit("gpu_suite: no CUDA device here; run with --device cpu --tiny for a smoke run")
    import composer

    scale = Scale(args.tiny, args.device)
    run = [section for section in SECTIONS if (not only or section in only) and section not in skip]
    results: dict = {
        "meta": {
            "device": torch.cuda.get_device_name(0)
            if args.device == "gpu"
            else f"CPU ({platform.processor() or 'cpu'})",
            "torch": torch.__version__,
            "composer": composer.__version__,
            "python": platform.python_version(),
            "tiny": args.tiny,
            "date": time.strftime("%Y-%m-%d"),
            "sections": run,
        }
    }
    start = time.perf_counter()
    for compiled, section in ((False, "overhead"), (True, "overhead_compiled")):
        if section in run:  # one table: eager rows, then compiled ones
            results.setdefault("overhead", []).extend(overhead(scale, compiled))
    # precision before flagship: on a CPU its processes are forked, from this process while it has one thread
    # (forked from the tests' server, it has the imports) instead of from a server that imports them again, and
    # writing the FFCV files leaves numba's TBB worker thread running
    if "precision" in run:
        results["precision"] = precision(scale)
    if "flagship" in run:
        results["flagship"] = flagship(scale, args.data_dir)
    if "augment" in run:
        results["augment"] = augmentation(scale)
    if "decode" in run:
        from decode import nvjpeg_rate
        from gpu_decode import decode_section

        results["decode"] = decode_section(scale, args.data_dir, flagship_data, nvjpeg_rate)
    if "speedrun" in run:
        results["speedrun"] = speedrun(scale)
    results["meta"]["seconds"] = time.perf_counter() - start
    print("\n" + table(results) + f"\n\n({results['meta']['seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
