"""The ``dlrecipes`` command line: thin wrappers over :mod:`dlrecipes.api`.

User errors print one message and exit with code 2; torch and Composer are imported only
by the commands that train.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from dlrecipes.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train image classifiers from YAML recipes on MosaicML Composer.",
)

RecipeArg = typer.Argument(..., help="recipe YAML file", show_default=False)
OverridesArg = typer.Argument(
    None, help="key.path=value overrides (YAML values), key.path=null, or ~key.path to delete", show_default=False
)
PluginOpt = typer.Option([], "--plugin", help="import this module or .py file first (repeatable)")
TrustOpt = typer.Option(
    False, "--trust-checkpoint", help="allow a full unpickle of checkpoint.load_path outside the run directory"
)
DeviceCheckOpt = typer.Option(
    True, "--device-check/--skip-device-check", help="check that this machine can run the device and precision"
)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}" if code == 2 else message, err=True)
    raise typer.Exit(code=code)


def _guarded(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except UserError as exc:
        message = str(exc)
        if message.startswith("Caught ") and "Original Traceback" in message:  # raised in a DataLoader worker
            message = message.strip().splitlines()[-1].split(": ", 1)[-1]
        _fail(message, exc.exit_code)


@app.command()
def train(
    recipe: Path = RecipeArg,
    overrides: Optional[List[str]] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="continue the latest checkpoint of the same run"),
    trust_checkpoint: bool = TrustOpt,
    plugin: List[str] = PluginOpt,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="also Composer's console logging (config banner, metrics) and its warnings"
    ),
) -> None:
    """Train a recipe (validated first; nothing is built if the recipe is wrong)."""
    from dlrecipes import api

    config = _guarded(lambda: api.resolve(recipe, overrides or [], plugin))
    result = _guarded(lambda: api.train(recipe, resume=resume, config=config, trust_checkpoint=trust_checkpoint,
                                        verbose=verbose))
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.eval_metrics.items()))
    typer.echo(
        f"done: {result.epochs} epochs, {result.batches} batches in {result.seconds:.1f}s; "
        f"eval {metrics}; run directory {result.run_dir}",
        err=True,
    )


@app.command()
def launch(
    recipe: Path = RecipeArg,
    overrides: Optional[List[str]] = OverridesArg,
    nproc: int = typer.Option(1, "-n", "--nproc", help="processes (devices) on this node"),
    nodes: int = typer.Option(1, "--nodes", help="number of nodes"),
    node_rank: int = typer.Option(0, "--node-rank", help="this node's rank (0 .. nodes-1)"),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", help="node 0's address (needed with --nodes > 1)"),
    master_port: Optional[int] = typer.Option(None, "--master-port", help="a free port on node 0"),
    resume: bool = typer.Option(False, "--resume", help="continue the latest checkpoint of the same run"),
    trust_checkpoint: bool = TrustOpt,
    plugin: List[str] = PluginOpt,
) -> None:
    """Train on several devices/nodes through Composer's launcher, after checking the setup."""
    from dlrecipes import api
    from dlrecipes.config.devices import check_launch
    from dlrecipes.tools.launch import launcher_command, run_forwarding_signals

    extra = tuple(["--resume"] if resume else []) + tuple(["--trust-checkpoint"] if trust_checkpoint else []) + tuple(a for p in plugin for a in ("--plugin", p))
    cmd = _guarded(lambda: launcher_command(str(recipe), overrides or [], nproc, nodes, node_rank, master_addr,
                                            master_port, extra))
    config = _guarded(lambda: api.resolve(recipe, overrides or [], plugin))
    _guarded(lambda: check_launch(config, nproc, nproc * nodes))
    raise typer.Exit(run_forwarding_signals(cmd))


@app.command()
def validate(
    recipe: Path = RecipeArg,
    overrides: Optional[List[str]] = OverridesArg,
    plugin: List[str] = PluginOpt,
    device_check: bool = DeviceCheckOpt,
) -> None:
    """Check a recipe against the schema and the registries, building nothing."""
    from dlrecipes import api

    config = _guarded(lambda: api.resolve(recipe, overrides or [], plugin, check_device=device_check))
    typer.echo(f"ok: {recipe} ({config.model.name} on {config.dataset.name}, {config.trainer.max_duration})")


@app.command()
def show(
    recipe: Path = RecipeArg,
    overrides: Optional[List[str]] = OverridesArg,
    plugin: List[str] = PluginOpt,
    device_check: bool = typer.Option(
        False, "--device-check/--skip-device-check", help="also check that this machine can run the device and precision"
    ),
) -> None:
    """Print the resolved recipe, each value annotated with the file or override it came from.

    Showing a recipe does not depend on the machine: a GPU recipe shows on a laptop."""
    from dlrecipes import api
    from dlrecipes.config import validate as validate_recipe
    from dlrecipes.tools.describe import render_with_sources

    loaded = _guarded(lambda: api.load(recipe, overrides or [], plugin))
    config = _guarded(lambda: validate_recipe(loaded, check_device=device_check))
    sources = {"name": "the recipe's file name", **loaded.sources}
    typer.echo(render_with_sources(config.to_dict(), sources))


@app.command("list")
def list_registry(
    group: Optional[str] = typer.Argument(None, help="models, datasets, optimizers, schedulers, algorithms, callbacks or loggers"),
    plugin: List[str] = PluginOpt,
) -> None:
    """What each registry holds, with parameters and defaults."""
    from dlrecipes.plugins import load_all
    from dlrecipes.registry import REGISTRIES
    from dlrecipes.tools.describe import print_registry

    _guarded(lambda: load_all(plugins=plugin))
    if group is not None and group not in REGISTRIES:
        from dlrecipes.errors import did_you_mean

        _fail(f"unknown group '{group}'{did_you_mean(group, REGISTRIES)}; groups: {', '.join(REGISTRIES)}")
    for reg in REGISTRIES.values():
        if group is None or reg.group == group:
            print_registry(reg)


@app.command()
def profile(
    recipe: Optional[Path] = typer.Argument(None, help="a recipe (its model and input size), or use --model"),
    overrides: Optional[List[str]] = OverridesArg,
    model: Optional[str] = typer.Option(None, "--model", help="registry model, timm/<arch>, torchvision/<arch> or a timm name"),
    param: List[str] = typer.Option([], "--param", help="model parameter key=value (repeatable)"),
    input_size: str = typer.Option("3,224,224", "--input-size", help="C,H,W (with --model)"),
    batch: int = typer.Option(32, "--batch", help="batch size for the second latency figure"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    warmup: int = typer.Option(3, help="untimed forward passes first"),
    repeats: int = typer.Option(10, help="timed forward passes"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    plugin: List[str] = PluginOpt,
) -> None:
    """Parameters, size, MACs/FLOPs, latency (batch 1 and B) and peak CUDA memory of a model."""
    import json

    from dlrecipes.tools import model_cost as prof
    from dlrecipes.recipe import parse_yaml

    if device not in ("cpu", "cuda"):
        _fail(f"--device: expected cpu or cuda, got {device!r}")
    if (recipe is None) == (model is None):
        _fail("give either a RECIPE or --model NAME (with --input-size C,H,W)")

    def build():
        if model is not None:
            params = {}
            for item in param:
                key, _, value = item.partition("=")
                params[key] = parse_yaml(value, f"--param {item}")
            size = prof.parse_input_size(input_size)
            return prof.resolve_model(model, params, size), size, model
        from dlrecipes import api
        from dlrecipes.builders import build_datasets

        config = api.resolve(recipe, overrides or [], plugin, check_device=False)
        net, size = prof.model_from_recipe(config.model, build_datasets(config.dataset))
        return net, size, f"{config.name}: {config.model.name}"

    net, size, title = _guarded(build)
    result = _guarded(lambda: prof.profile_model(net, size, batch, device, warmup, repeats))
    result["model"] = title
    typer.echo(json.dumps(result, indent=2) if as_json else prof.format_table(result, title))


@app.command()
def bench(
    recipe: Path = RecipeArg,
    overrides: Optional[List[str]] = OverridesArg,
    steps: int = typer.Option(30, help="batches per timed segment"),
    rounds: int = typer.Option(5, help="alternating segments of each loop"),
    warmup: int = typer.Option(5, help="untimed batches of each loop first"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    plugin: List[str] = PluginOpt,
) -> None:
    """Images/s through dlrecipes/Composer vs a plain PyTorch loop on the same model and batches."""
    import json

    from dlrecipes import api
    from dlrecipes.tools.bench import format_bench, run_bench

    config = _guarded(lambda: api.resolve(recipe, overrides or [], plugin))
    result = _guarded(lambda: run_bench(config, steps=steps, rounds=rounds, warmup=warmup))
    typer.echo(json.dumps(result, indent=2) if as_json else format_bench(result))


@app.command()
def plot(run_dir: Path = typer.Argument(..., help="a run directory (runs/<run_name>)")) -> None:
    """Redraw a run's loss, accuracy and learning-rate plots from its history.csv."""
    from dlrecipes.records.plots import plot_history

    for path in _guarded(lambda: plot_history(run_dir)):
        typer.echo(str(path))


@app.command()
def compare(
    run_dirs: List[Path] = typer.Argument(..., help="run directories to compare"),
    out: Path = typer.Option(Path("compare.png"), "--out", help="where to write the accuracy-vs-time plot"),
    as_json: bool = typer.Option(False, "--json", help="print the summaries as JSON"),
) -> None:
    """Compare runs: recipe, precision, batch, wall time, images/s, peak memory, best accuracy."""
    from dlrecipes.records.plots import COMPARE_COLUMNS, compare_runs, format_cell

    summaries, plot_path = _guarded(lambda: compare_runs(run_dirs, out))
    if as_json:
        import json

        typer.echo(json.dumps(summaries, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="runs", title_justify="left")
    for _, header in COMPARE_COLUMNS:
        table.add_column(header)
    for summary in summaries:
        table.add_row(*(format_cell(summary.get(key)) for key, _ in COMPARE_COLUMNS))
    Console(width=max(140, Console().width)).print(table)
    typer.echo(f"accuracy vs wall-clock time: {plot_path}")


data_app = typer.Typer(no_args_is_help=True, help="Prepare datasets: FFCV conversion and inspection.")
app.add_typer(data_app, name="data")


@data_app.command("convert")
def data_convert(
    dataset: str = typer.Argument(..., help="a registered dataset name (dlrecipes list datasets)"),
    params: Optional[List[str]] = typer.Argument(None, help="dataset parameters as key=value, e.g. root=data/cifar10"),
    out: Path = typer.Option(..., "--out", help="folder for train.beton and val.beton"),
    max_resolution: Optional[int] = typer.Option(256, help="downscale images whose longer side is larger (0: keep)"),
    write_mode: str = typer.Option("smart", help="smart, jpg, raw or proportion"),
    jpeg_quality: int = typer.Option(90, help="JPEG quality for re-encoded images"),
    compress_probability: float = typer.Option(0.5, help="share stored as JPEG with write-mode proportion"),
    page_size: int = typer.Option(1 << 23, help="FFCV page size in bytes"),
    workers: int = typer.Option(-1, help="writer processes (-1: all cores)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace existing files"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="skip unreadable images (each is reported) instead of stopping"),
    plugin: List[str] = PluginOpt,
) -> None:
    """Write a dataset's train and eval splits to FFCV .beton files (needs the ffcv extra)."""
    from dlrecipes.data.ffcv_files import ConvertOptions
    from dlrecipes.tools.data_convert import convert_dataset
    from dlrecipes.plugins import load_all
    from dlrecipes.recipe import parse_yaml

    if write_mode not in ("smart", "jpg", "raw", "proportion"):
        _fail(f"--write-mode: expected smart, jpg, raw or proportion, got {write_mode!r}")
    parsed = {}
    for item in params or []:
        if "=" not in item:
            _fail(f"dataset parameter '{item}': expected key=value")
        key, _, value = item.partition("=")
        parsed[key] = _guarded(lambda: parse_yaml(value, f"parameter {item}"))
    options = ConvertOptions(
        max_resolution=max_resolution or None, write_mode=write_mode, jpeg_quality=jpeg_quality,
        compress_probability=compress_probability, page_size=page_size, num_workers=workers,
        overwrite=overwrite, skip_bad=skip_bad,
    )
    _guarded(lambda: load_all(plugins=plugin))
    _guarded(lambda: convert_dataset(dataset, parsed, out, options, echo=lambda m: typer.echo(m, err=True)))


@data_app.command("inspect")
def data_inspect(
    path: Path = typer.Argument(..., help="an FFCV .beton file"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Samples, fields, resolution statistics and classes of a .beton file."""
    import json

    from dlrecipes.data.ffcv_files import inspect_beton

    info = _guarded(lambda: inspect_beton(path))
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    res = info["resolution"]
    typer.echo(f"{info['path']}: {info['samples']} samples")
    typer.echo(f"fields: {', '.join(f'{k} ({v})' for k, v in info['fields'].items())}")
    for side in ("height", "width"):
        r = res[side]
        typer.echo(f"{side}: min {r['min']}, median {r['median']:g}, max {r['max']}")
    typer.echo(f"stored as: {info['stored_as']['jpg']} JPEG, {info['stored_as']['raw']} raw")
    names = info.get("class_names")
    counts = ", ".join(f"{names[k] if names else k}: {v}" for k, v in info["classes"].items())
    typer.echo(f"classes ({len(info['classes'])}): {counts}")


@app.command()
def wheelhouse(
    out: Path = typer.Argument(..., help="folder for the wheels and requirements.txt"),
    python_version: Optional[str] = typer.Option(
        None, "--python-version", help="the target's Python, e.g. 3.12 (default: this one)"
    ),
    extra: List[str] = typer.Option([], "--extra", help="also an extra's packages: ffcv, onnx, wandb, ... (repeatable)"),
) -> None:
    """Collect wheels of everything dlrecipes needs except torch, for an offline machine with its own torch."""
    from dlrecipes.tools.wheelhouse import INSTALL_COMMAND, build_wheelhouse

    requirements_file = _guarded(lambda: build_wheelhouse(out, python_version, extra))
    wheels = len(list(out.glob("*.whl")))
    typer.echo(f"{wheels} wheels in {out} ({requirements_file.name} lists them). On the target machine, beside its torch:")
    typer.echo("  " + INSTALL_COMMAND.format(out=out))


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point (also used by the root ``cli.py`` and ``python -m dlrecipes``)."""
    app(args=argv if argv is not None else sys.argv[1:], prog_name="dlrecipes")


if __name__ == "__main__":
    main()
