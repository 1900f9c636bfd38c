"""The ``dlrecipes`` command line: each command calls one :mod:`dlrecipes.api` function and prints
what it returns (formatted by :mod:`dlrecipes.tools`).

User errors print one message and exit with code 2; torch and Composer are imported only by the
commands that need them.  The arguments every recipe command takes (the recipe, its ``key=value``
overrides and ``--plugin``) are declared once, by :func:`dlrecipes.cli_args.recipe_command`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from dlrecipes.cli_args import (
    CheckpointOpt,
    JsonOpt,
    OverridesArg,
    PluginOpt,
    RecipeArgs,
    RecipeOpt,
    RestartOpt,
    ResumeOpt,
    RunTargetArg,
    TrustOpt,
    TrustPluginsOpt,
    app,
    assignments,
    guarded,
    recipe_command,
    terminal_width,
    trusting,
)


@recipe_command()
def train(
    args: RecipeArgs,
    resume: bool = ResumeOpt,
    restart: bool = RestartOpt,
    trust_checkpoint: bool = TrustOpt,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="also Composer's console logging (config banner, metrics) and its warnings"
    ),
) -> None:
    """Train a recipe (validated first; nothing is built if the recipe is wrong)."""
    from dlrecipes import api
    from dlrecipes.tools.describe import trained

    result = guarded(
        lambda: api.train(
            args.recipe,
            args.overrides,
            args.plugins,
            resume=resume,
            trust_checkpoint=trust_checkpoint,
            verbose=verbose,
            restart=restart,
        )
    )
    typer.echo(trained(result, terminal_width(sys.stderr)), err=True, nl=False)


@app.command("train-request", hidden=True)
def train_request(
    request: Path = typer.Argument(..., help="a run request file, as a sweep writes one for each training"),
    nproc: int = typer.Option(1, "-n", "--nproc", help="processes (devices) on this node, as launch's"),
) -> None:
    """Train the run a request file hands over (a sweep's point): its recipe as loaded by the process that wrote it."""
    from dlrecipes import api
    from dlrecipes.tools.describe import trained

    result = guarded(lambda: api.train_request(request, nproc))
    if isinstance(result, int):  # the exit code of launch's processes
        raise typer.Exit(result)
    typer.echo(trained(result, terminal_width(sys.stderr)), err=True, nl=False)


@recipe_command()
def launch(
    args: RecipeArgs,
    nproc: int = typer.Option(1, "-n", "--nproc", help="processes (devices) on this node"),
    nodes: int = typer.Option(1, "--nodes", help="number of nodes"),
    node_rank: int = typer.Option(0, "--node-rank", help="this node's rank (0 .. nodes-1)"),
    master_addr: str | None = typer.Option(None, "--master-addr", help="node 0's address (needed with --nodes > 1)"),
    master_port: int | None = typer.Option(None, "--master-port", help="a free port on node 0"),
    resume: bool = ResumeOpt,
    restart: bool = RestartOpt,
    trust_checkpoint: bool = TrustOpt,
) -> None:
    """Train on several devices/nodes, one process each, after checking the setup."""
    from dlrecipes import api

    code = guarded(
        lambda: api.launch(
            args.recipe,
            args.overrides,
            args.plugins,
            nproc,
            nodes,
            node_rank,
            master_addr,
            master_port,
            resume,
            trust_checkpoint,
            restart,
        )
    )
    raise typer.Exit(code)


@recipe_command()
def sweep(
    args: RecipeArgs,
    seeds: int = typer.Option(0, "--seeds", help="train each grid point with N seeds (trainer.seed 1..N)"),
    parallel: int = typer.Option(1, "--parallel", help="trainings at once (CPU threads split; one GPU each)"),
    nproc: int = typer.Option(1, "-n", "--nproc", help="processes (devices) per training, through launch"),
    name: str | None = typer.Option(None, "--name", help="the sweep's folder under runs_dir (default <recipe>-sweep)"),
    trials: int | None = typer.Option(None, "--trials", help="with --search: how many points to train"),
    search: str | None = typer.Option(
        None,
        "--search",
        help="random or optuna: sample key=loguniform(a,b), "
        "uniform(a,b), randint(a,b) or choice(a,b,...); optuna: TPE sampling and "
        "median pruning on the monitored metric (the optuna extra)",
    ),
    trust_checkpoint: bool = TrustOpt,
) -> None:
    """Train a grid of overrides (key=a,b,c), resumably, and print a table of the results."""
    from dlrecipes import api
    from dlrecipes.tools.describe import format_sweep

    plan, rows, code = guarded(
        lambda: api.sweep(
            args.recipe,
            args.overrides,
            seeds,
            parallel,
            name,
            trials,
            search,
            args.plugins,
            echo=typer.echo,
            nproc=nproc,
            trust_checkpoint=trust_checkpoint,
        )
    )
    typer.echo(format_sweep(plan, rows))
    raise typer.Exit(code)


@recipe_command()
def validate(
    args: RecipeArgs,
    device_check: bool = typer.Option(
        True,
        "--device-check/--skip-device-check",
        help="check that this machine can run the device and precision, and hold a batch and in-memory data",
    ),
    data_check: bool = typer.Option(
        True, "--data-check/--no-data-check", help="check that the recipe's input paths exist (train always does)"
    ),
) -> None:
    """Check a recipe against the schema and the registries, building nothing."""
    from dlrecipes import api
    from dlrecipes.tools.describe import validated

    config = guarded(
        lambda: api.resolve(args.recipe, args.overrides, args.plugins, check_device=device_check, check_data=data_check)
    )
    typer.echo(validated(args.recipe, config))


@recipe_command()
def show(
    args: RecipeArgs,
    device_check: bool = typer.Option(
        False,
        "--device-check/--skip-device-check",
        help="also check that this machine can run the device and precision",
    ),
    explain: bool = typer.Option(False, "--explain", help="precede each key with what it means (as a YAML comment)"),
) -> None:
    """Print the resolved recipe, each value annotated with the file or override it came from.

    Showing a recipe does not depend on the machine: a GPU recipe shows on a laptop."""
    from dlrecipes import api

    typer.echo(
        guarded(lambda: api.show(args.recipe, args.overrides, args.plugins, check_device=device_check, explain=explain))
    )


@app.command("eval")
def evaluate(
    target: str = RunTargetArg,
    overrides: list[str] | None = OverridesArg,
    checkpoint: str = CheckpointOpt,
    recipe: Path | None = RecipeOpt,
    tta: str | None = typer.Option(
        None,
        "--tta",
        help="test-time augmentation (over the recipe's algorithms.tta): flip (the mean with the mirrored images) "
        "or flip_translate (airbench's level 2)",
    ),
    out: Path | None = typer.Option(None, "--out", help="where the report goes (default RUN_DIR/eval/<name>/)"),
    as_json: bool = JsonOpt,
    trust_checkpoint: bool = TrustOpt,
    plugin: list[str] = PluginOpt,
    trust_plugins: bool = TrustPluginsOpt,
) -> None:
    """Evaluate a run's checkpoint on its recipe's evaluation split (overrides change what is evaluated);
    no training step, no optimizer state."""
    from dlrecipes import api
    from dlrecipes.tools.describe import format_eval

    result = guarded(
        trusting(
            trust_plugins,
            lambda: api.evaluate(target, overrides or [], checkpoint, recipe, tta, out, plugin, trust_checkpoint),
        )
    )
    typer.echo(json.dumps(result.to_dict(), indent=2) if as_json else format_eval(result, terminal_width(sys.stdout)))


@app.command("export")
def export(
    target: str = RunTargetArg,
    overrides: list[str] | None = OverridesArg,
    formats: list[str] = typer.Option(["torchscript"], "--format", help="torchscript or onnx (repeatable)"),
    checkpoint: str = CheckpointOpt,
    recipe: Path | None = RecipeOpt,
    out: Path | None = typer.Option(None, "--out", help="the export directory (default RUN_DIR/export)"),
    trust_checkpoint: bool = TrustOpt,
    plugin: list[str] = PluginOpt,
    trust_plugins: bool = TrustPluginsOpt,
) -> None:
    """Export a run's checkpoint for inference (TorchScript, ONNX), checked against the network, with
    preprocess.json and classes.json."""
    from dlrecipes import api

    report = guarded(
        trusting(
            trust_plugins,
            lambda: api.export(target, formats, overrides or [], checkpoint, recipe, out, plugin, trust_checkpoint),
        )
    )
    typer.echo(report["out_dir"])
    if report.get("uploaded_to"):
        typer.echo(f"uploaded to {report['uploaded_to']}")


@app.command("predict")
def predict(
    target: str = typer.Argument(
        ...,
        help="a run directory, a checkpoint (with --recipe) or an export directory (or s3://BUCKET/PREFIX/RUN)",
        show_default=False,
    ),
    files: list[Path] = typer.Argument(..., help="image files and folders of them", show_default=False),
    top_k: int = typer.Option(5, "--top-k", help="how many classes to show per file"),
    out: Path | None = typer.Option(None, "--out", help="also write the predictions as CSV"),
    checkpoint: str = CheckpointOpt,
    recipe: Path | None = RecipeOpt,
    batch_size: int = typer.Option(64, "--batch-size", help="images per forward pass"),
    as_json: bool = JsonOpt,
    trust_checkpoint: bool = TrustOpt,
    plugin: list[str] = PluginOpt,
    trust_plugins: bool = TrustPluginsOpt,
) -> None:
    """The class of each image file, by a run's checkpoint or an exported model, with its evaluation
    preprocessing."""
    from dlrecipes import api
    from dlrecipes.tools.describe import format_predictions

    rows = guarded(
        trusting(
            trust_plugins,
            lambda: api.predict(
                target, files, top_k, out, checkpoint, recipe, (), plugin, batch_size, trust_checkpoint
            ),
        )
    )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        typer.echo(rows.counted(), err=True)
    else:
        typer.echo(format_predictions(rows, out, terminal_width(sys.stdout)))


@app.command("runs")
def list_runs(
    runs_dir: str = typer.Argument("runs", help="the runs folder (default: runs), or s3://BUCKET/PREFIX"),
    last: int | None = typer.Option(None, "--last", help="only the newest N runs"),
    as_json: bool = JsonOpt,
) -> None:
    """Past runs, newest first: name, recipe, status, epochs done of planned, best metric, time, device."""
    from dlrecipes import api
    from dlrecipes.tools.describe import format_runs

    rows = guarded(lambda: api.runs(runs_dir, last))
    typer.echo(json.dumps(rows, indent=2) if as_json else format_runs(rows))
    damaged = [message for row in rows for message in row["damaged"]]
    for message in damaged:
        typer.echo(f"error: {message}", err=True)
    if damaged:
        raise typer.Exit(code=2)


@app.command("list")
def list_registry(
    group: str | None = typer.Argument(
        None, help="models, datasets, optimizers, schedulers, algorithms, callbacks or loggers"
    ),
    name: str | None = typer.Argument(None, help="one entry of the group, in full", show_default=False),
    plugin: list[str] = PluginOpt,
) -> None:
    """What each registry holds, with parameters, defaults and what each parameter means."""
    from dlrecipes import api
    from dlrecipes.tools.describe import format_entry, format_registry

    for reg in guarded(lambda: api.registries(group, plugin)):
        typer.echo(guarded(lambda reg=reg: format_entry(reg, name)) if name else format_registry(reg))


@recipe_command(required=False)
def profile(
    args: RecipeArgs,
    model: str | None = typer.Option(
        None, "--model", help="registry model, timm/<arch>, torchvision/<arch> or a timm name"
    ),
    param: list[str] = typer.Option([], "--param", help="model parameter key=value (repeatable)"),
    input_size: str = typer.Option("3,224,224", "--input-size", help="C,H,W (with --model)"),
    batch: int = typer.Option(32, "--batch", help="batch size for the second latency figure"),
    device: str = typer.Option("auto", "--device", help="auto (a GPU when this machine has one), cpu or gpu"),
    warmup: int = typer.Option(3, help="untimed forward passes first"),
    repeats: int = typer.Option(10, help="timed forward passes"),
    as_json: bool = JsonOpt,
) -> None:
    """Parameters, size, MACs/FLOPs, latency (batch 1 and B) and peak GPU memory of a model."""
    from dlrecipes import api
    from dlrecipes.tools.model_cost import format_table, parse_input_size

    params = assignments(param, "--param")
    size = guarded(lambda: parse_input_size(input_size))
    result = guarded(
        lambda: api.profile(
            args.recipe, args.overrides, args.plugins, model, params, size, batch, device, warmup, repeats
        )
    )
    typer.echo(json.dumps(result, indent=2) if as_json else format_table(result, result["model"]))


@recipe_command()
def bench(
    args: RecipeArgs,
    steps: int = typer.Option(30, help="batches per timed segment"),
    rounds: int = typer.Option(5, help="alternating segments of each loop"),
    warmup: int = typer.Option(5, help="untimed batches of each loop first"),
    as_json: bool = JsonOpt,
) -> None:
    """Images/s through dlrecipes/Composer vs a plain PyTorch loop on the same model and batches."""
    from dlrecipes import api
    from dlrecipes.tools.bench import format_bench

    result = guarded(lambda: api.bench(args.recipe, args.overrides, args.plugins, steps, rounds, warmup))
    typer.echo(json.dumps(result, indent=2) if as_json else format_bench(result))


@app.command()
def plot(
    run_dir: str = typer.Argument(..., help="a run directory (runs/<run_name>, or s3://BUCKET/PREFIX/RUN)"),
) -> None:
    """Redraw a run's loss, accuracy and learning-rate plots from its history.csv."""
    from dlrecipes import api

    for path in guarded(lambda: api.plot(run_dir)):
        typer.echo(str(path))


@app.command()
def compare(
    run_dirs: list[str] | None = typer.Argument(None, help="run directories to compare (or --last N)"),
    out: Path | None = typer.Option(None, "--out", help="also write a plot of accuracy against time (a .png)"),
    last: int | None = typer.Option(None, "--last", help="the newest N runs under --runs-dir instead"),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="where --last looks (a folder, or s3://BUCKET/PREFIX)"),
    as_json: bool = typer.Option(False, "--json", help="print the summaries as JSON"),
) -> None:
    """Compare runs: recipe, precision, batch, wall time, images/s, peak memory, best accuracy."""
    from dlrecipes import api
    from dlrecipes.tools.describe import format_comparison

    summaries, plot_path = guarded(lambda: api.compare(run_dirs or [], out, last, runs_dir))
    typer.echo(json.dumps(summaries, indent=2) if as_json else format_comparison(summaries, plot_path))


data_app = typer.Typer(
    no_args_is_help=True, help="Prepare datasets: FFCV files, the tensor cache or shards; inspection."
)
app.add_typer(data_app, name="data")


@data_app.command("convert")
def data_convert(
    ctx: typer.Context,
    dataset: str = typer.Argument(..., help="a registered dataset name (dlrecipes list datasets)"),
    params: list[str] | None = typer.Argument(None, help="dataset parameters as key=value, e.g. root=data/cifar10"),
    out: str | None = typer.Option(
        None, "--out", help="ffcv: the .beton files' folder; tensor_cache: its cache_dir; shards: DEST"
    ),
    format: str = typer.Option(
        "ffcv", "--format", help="ffcv (.beton files), tensor_cache or shards (dataset: shards)"
    ),
    shard_size: str = typer.Option("64MB", help="shards: bytes per shard (64MB, 256MiB, an integer)"),
    reencode_quality: int | None = typer.Option(None, help="shards: re-encode images as JPEG of this quality"),
    cache_size: int | None = typer.Option(None, help="tensor_cache: side of the cached images, as trainer.cache_size"),
    max_resolution: int | None = typer.Option(
        None,
        help="ffcv, shards: downscale images whose longer side is larger to it (ffcv: 256 if not given; "
        "shards: kept as they are if not given, else re-encoded as JPEG; 0: keep)",
    ),
    write_mode: str = typer.Option("smart", help="ffcv: smart, jpg, raw or proportion"),
    jpeg_quality: int = typer.Option(90, help="ffcv: JPEG quality for re-encoded images"),
    compress_probability: float = typer.Option(0.5, help="ffcv: share stored as JPEG with write-mode proportion"),
    page_size: int = typer.Option(1 << 23, help="ffcv: FFCV page size in bytes"),
    workers: int = typer.Option(-1, help="writer or decoding processes (-1: all cores)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace existing files (tensor_cache: even up to date)"),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="ffcv: skip unreadable images (each is reported) instead of stopping"
    ),
    plugin: list[str] = PluginOpt,
) -> None:
    """Write a dataset's train and eval splits to FFCV .beton files (the ffcv extra), the tensor cache, or shards."""
    from dlrecipes import api
    from dlrecipes.tools.data_convert import convert_options

    given = [name for name in ctx.params if ctx.get_parameter_source(name).name == "COMMANDLINE"]
    options = guarded(lambda: convert_options(format, ctx.params, given))
    guarded(
        lambda: api.convert_dataset(
            dataset,
            assignments(params, "dataset parameter"),
            out,
            options,
            plugin,
            echo=lambda m: typer.echo(m, err=True),
            format=format,
        )
    )


@data_app.command("inspect")
def data_inspect(
    path: Path = typer.Argument(..., help="an FFCV .beton file"),
    as_json: bool = JsonOpt,
) -> None:
    """Samples, fields, resolution statistics and classes of a .beton file."""
    from dlrecipes import api
    from dlrecipes.tools.data_convert import format_beton

    info = guarded(lambda: api.inspect_beton(path))
    typer.echo(json.dumps(info, indent=2) if as_json else format_beton(info))


@app.command()
def wheelhouse(
    out: Path = typer.Argument(..., help="folder for the wheels and requirements.txt"),
    python_version: str | None = typer.Option(
        None, "--python-version", help="the target's Python, e.g. 3.12 (default: this one)"
    ),
    extra: list[str] = typer.Option(
        [], "--extra", help="also an extra's packages: ffcv, onnx, wandb, ... (repeatable)"
    ),
) -> None:
    """Collect wheels of everything dlrecipes needs except torch, for an offline machine with its own torch."""
    from dlrecipes import api
    from dlrecipes.tools.wheelhouse import format_wheelhouse

    typer.echo(format_wheelhouse(guarded(lambda: api.wheelhouse(out, python_version, extra))))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (also ``cli.py``, ``python -m dlrecipes``); ``argv``: a call from Python."""
    from dlrecipes import api

    args = argv if argv is not None else sys.argv[1:]
    with api.invoked(["dlrecipes", *args], ends_process=argv is None):  # what a run records as its command
        app(args=args, prog_name="dlrecipes")


if __name__ == "__main__":
    main()
