"""The Python entry points a notebook user calls; each CLI command calls exactly one of these and
prints what it returns (formatted by :mod:`dlrecipes.tools`).

>>> from dlrecipes.api import resolve
>>> config = resolve("recipes/quickstart.yaml", ["trainer.max_duration=1ep"])
>>> config.trainer.max_duration
'1ep'
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.config import RecipeConfig, validate
from dlrecipes.config.resolving import load_local
from dlrecipes.core.addresses import RUNS_DIR
from dlrecipes.core.distributed import adopt_torchrun
from dlrecipes.errors import RecipeError
from dlrecipes.plugins import load_all
from dlrecipes.recipe import LoadedRecipe, override_strings
from dlrecipes.runtime import process_state
from dlrecipes.runtime.fork_server import Program

if TYPE_CHECKING:
    from dlrecipes.records.store import RunOptions, RunStore
    from dlrecipes.tools.launch import RankPlan


def trusting_plugins(trust: bool = True) -> contextlib.AbstractContextManager[None]:
    """A context in which a run's recorded plugins are imported unchecked (``--trust-plugins``:
    :func:`dlrecipes.records.recorded_code.trusting_plugins`, imported only when a command asks)."""
    from dlrecipes.records import recorded_code

    return recorded_code.trusting_plugins(trust)


def in_fork(args: list[str]) -> None:
    """In a process forked from the server (:data:`FORKED`): what ``python -m dlrecipes ARGS`` does."""
    import runpy

    sys.argv = ["dlrecipes", *args]
    runpy.run_module("dlrecipes", run_name="__main__", alter_sys=True)


# the CLI as a forked process runs it (a sweep's trainings on a CPU, the tests' processes): from a server that imported
# dlrecipes/preload.py once (named: it is imported only in the server's own process)
FORKED = Program(main=in_fork, preload=("dlrecipes.preload",))


def load(
    recipe: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    root: str | Path | None = None,
) -> LoadedRecipe:
    """Read the recipe (a file, a run's recorded recipe in a bucket, or a dict of sections standing for a file in
    ``root``, default the working directory: see :func:`dlrecipes.recipe.load_recipe`; bases and overrides applied)
    and import every plugin it needs."""
    local = recipe
    if isinstance(recipe, str) and "://" in recipe:  # an address: the run store brings it here (imported only then)
        from dlrecipes.records.store import pulled_recipe

        local = pulled_recipe(recipe)
    loaded = load_local(local, overrides, plugins, root)
    if local is not recipe:  # `show` says where each value came from: the address, not its local copy
        copy = Path(local).resolve()
        loaded.sources = {
            key: recipe if Path(origin).resolve() == copy else origin for key, origin in loaded.sources.items()
        }
    return loaded


def resolve(
    recipe: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    check_device: bool = True,
    check_data: bool = True,
    root: str | Path | None = None,
) -> RecipeConfig:
    """Load and validate: the recipe (a file, or a dict standing for one in ``root``) as the trainer will see it
    (nothing is built).  ``check_device``: whether this machine can run it; ``check_data``: whether its input
    paths exist."""
    from dlrecipes.records.store import store_for

    config = validate(load(recipe, overrides, plugins, root), check_device=check_device, check_data=check_data)
    store_for(config.runs_dir).check_room(config)  # a bucket's keys and staging paths fit (no network asked)
    return config


def _opened_store(config: RecipeConfig) -> RunStore:
    """The run store of ``config`` (its ``runs_dir``), made once for the command: the run's keys and staging paths
    checked to fit, then the store asked (a bucket: once), one line when it cannot be used."""
    from dlrecipes.records.store import store_for

    store = store_for(config.runs_dir)
    store.check_room(config)
    store.check()
    return store


def show(
    recipe: str | Path | Mapping[str, Any],
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    check_device: bool = False,
    explain: bool = False,
) -> str:
    """The resolved recipe as YAML, each value annotated with the file or override it came from; with ``explain``,
    each key preceded by what it means (a comment: the output is still a recipe).

    Showing a recipe does not depend on the machine unless ``check_device``: a GPU recipe shows on a laptop.
    """
    from dlrecipes.config.meanings import key_meaning
    from dlrecipes.core.secrets import redact
    from dlrecipes.tools.describe import render_with_sources

    loaded = load(recipe, overrides, plugins)
    config = validate(loaded, check_device=check_device, check_data=False)
    sources = redact({"name": "the recipe's file name", **loaded.sources})  # an override, quoted as a value's source
    data = redact(config.to_dict())
    return render_with_sources(data, sources, (lambda path: key_meaning(path, data)) if explain else None)


def registries(group: str | None = None, plugins: Sequence[str] = ()) -> list:
    """The registries (``group``: only that one), with the built-ins and plugins loaded."""
    from dlrecipes.errors import did_you_mean
    from dlrecipes.registry import REGISTRIES

    load_all(plugins=plugins)
    if group is not None and group not in REGISTRIES:
        raise RecipeError(f"unknown group '{group}'{did_you_mean(group, REGISTRIES)}; groups: {', '.join(REGISTRIES)}")
    return [reg for reg in REGISTRIES.values() if group is None or reg.group == group]


def train(
    recipe: str | Path | Mapping[str, Any] | None,
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    resume: bool = False,
    config: RecipeConfig | None = None,
    trust_checkpoint: bool = False,
    verbose: bool = False,
    restart: bool = False,
):
    """Resolve and train; returns a :class:`dlrecipes.fit.TrainResult`: the one train path of every front end (the
    CLI's train, launch's ranks and a sweep's points through it, the notebook's with ``config`` resolved with its
    objects).  ``resume``: continue the run; ``restart``: train ``run_name`` again from the beginning, keeping the
    old run under another name."""
    if adopt_torchrun() and not resume:  # torchrun restarted the job: it goes on from its last checkpoint
        from dlrecipes.records.run_dir import continued_after_torchrun_restart

        resume, restart = continued_after_torchrun_restart(restart)
    config = config or validate(load(recipe, overrides, plugins))
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:  # the run's name under torchrun, before room is checked
        process_state.import_training_stack()
        from dlrecipes.fit import joined_torchrun_job

        config = joined_torchrun_job(config)
    store = _opened_store(config)  # a bucket that cannot be used: one line before training is even imported
    process_state.import_training_stack()
    from dlrecipes.fit import RunOptions, fit, open_run

    options = RunOptions(resume=resume, restart=restart, trust=trust_checkpoint, verbose=verbose)
    return fit(open_run(config, options, store))  # the run opened once, in the store checked above


@contextlib.contextmanager
def invoked(argv: Sequence[str], ends_process: bool = False):
    """A context in which runs record ``argv`` as the command that started them (the CLI's ``main`` says its
    arguments, in a process of its own or not). ``ends_process``: the command is the process's own, which ends
    with it (its exit skips the sweep of torch's and Composer's objects: :func:`dlrecipes.runtime.process_state.
    skip_the_exit_sweep`)."""
    import shlex

    from dlrecipes.records.provenance import recording as recorded

    if ends_process:
        process_state.command_owns_process()
    try:
        with recorded(shlex.join(argv)):
            yield
    finally:
        if ends_process:
            process_state.skip_the_exit_sweep()


def evaluate(
    target: str | Path,
    overrides: Iterable[str] = (),
    checkpoint: str = "best",
    recipe: str | Path | None = None,
    tta: str | None = None,
    out: str | Path | None = None,
    plugins: Sequence[str] = (),
    trust_checkpoint: bool = False,
):
    """Evaluate a run's checkpoint (``checkpoint``: best, latest or a path) on its recipe's evaluation split with
    ``overrides``, no training step; ``target`` is a run directory or a checkpoint file (then with ``recipe``).
    Returns a :class:`dlrecipes.after_training.evaluate.EvalResult`; the report goes to ``out`` or
    ``RUN_DIR/eval/<name>/`` (a run in a bucket, ``s3://...``: read through a local copy, the report uploaded beside
    it)."""
    from dlrecipes.after_training.evaluate import evaluate_run
    from dlrecipes.after_training.opened import open_trained

    with open_trained(target, checkpoint, recipe, overrides, plugins, trust_checkpoint) as trained:
        result = evaluate_run(trained, tta, out)
    trained.read.outputs_written("the evaluation report")
    return result


def export(
    target: str | Path,
    formats: Sequence[str] = ("torchscript",),
    overrides: Iterable[str] = (),
    checkpoint: str = "best",
    recipe: str | Path | None = None,
    out: str | Path | None = None,
    plugins: Sequence[str] = (),
    trust_checkpoint: bool = False,
) -> dict[str, Any]:
    """Export a run's checkpoint as TorchScript and/or ONNX, checked against the network on evaluation images,
    with ``preprocess.json`` and ``classes.json``, to ``out`` (default ``RUN_DIR/export``; a run in a bucket: its
    local copy's, uploaded beside the run, ``uploaded_to`` in the report)."""
    from dlrecipes.after_training.export import export_run
    from dlrecipes.after_training.opened import open_trained
    from dlrecipes.records.layout import EXPORT_DIR

    with open_trained(target, checkpoint, recipe, overrides, plugins, trust_checkpoint) as trained:
        report = export_run(trained, formats, out)
    uploaded = trained.read.put_beside("the export", EXPORT_DIR) if out is None else None
    if uploaded:  # a run in a bucket: the export beside it there
        report["uploaded_to"] = uploaded
    return report


def predict(
    target: str | Path,
    files: Sequence[str | Path],
    top_k: int = 5,
    out: str | Path | None = None,
    checkpoint: str = "best",
    recipe: str | Path | None = None,
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    batch_size: int = 64,
    trust_checkpoint: bool = False,
) -> list[dict[str, Any]]:
    """The classes of image files (and folders of them) by a run's checkpoint or an export directory: one row
    per readable file (path, class, probability, the top ``top_k``); written as CSV to ``out`` when given."""
    from dlrecipes.after_training import predict as tool
    from dlrecipes.after_training.opened import open_trained

    tool.check_options(top_k, batch_size)  # before a network is built
    with open_trained(target, checkpoint, recipe, overrides, plugins, trust_checkpoint, exports=True) as trained:
        folder = trained.export_folder
        predictor = tool.export_predictor(folder) if folder is not None else tool.run_predictor(trained)
    return tool.predict_files(predictor, files, top_k, out, batch_size)


def sweep(
    recipe: str | Path,
    assignments: Sequence[str] = (),
    seeds: int = 0,
    parallel: int = 1,
    name: str | None = None,
    trials: int | None = None,
    search: str | None = None,
    plugins: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    nproc: int = 1,
    trust_checkpoint: bool = False,
):
    """Run a sweep (see :mod:`dlrecipes.tools.sweep`): every point validated first, then trained, ``parallel``
    at a time (each on ``nproc`` processes through ``launch``), skipping finished points and resuming stopped
    ones; ``trust_checkpoint``: each training as ``train --trust-checkpoint`` (the checkpoints it resumes or
    loads by ``checkpoint.load_path``, unpickled in full). Returns (plan, summary rows, exit code)."""
    from dlrecipes.tools import sweep as tool

    if parallel < 1:
        raise RecipeError(f"--parallel: must be at least 1, got {parallel}")
    if nproc < 1:
        raise RecipeError(f"--nproc: at least 1 process per training, got {nproc}")
    tool.get_ready(nproc, FORKED)  # the trainings' server imports torch and Composer while the points are validated
    plan = tool.plan_sweep(recipe, list(assignments), seeds, name, trials, search)
    plan.plugins, plan.nproc, plan.trust_checkpoint = list(plugins), nproc, trust_checkpoint
    store = tool.check_points(plan)  # every point (an Optuna search: each range's ends), before the first trains
    folder = store.sweep(plan.name)  # in a bucket: its copy of the sweep downloaded first
    tool.prepare_folder(plan, folder)
    rows, code = tool.run_sweep(plan, FORKED, parallel, echo)
    unfinished = tool.finish_folder(folder, echo)  # in a bucket: the sweep's own files uploaded
    return plan, rows, code or unfinished


def launch(
    recipe: str | Path,
    overrides: Sequence[str] = (),
    plugins: Sequence[str] = (),
    nproc: int = 1,
    nodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    resume: bool = False,
    trust_checkpoint: bool = False,
    restart: bool = False,
) -> int:
    """Check the setup, then train on ``nproc`` devices of this node (of ``nodes``), one process each with the
    environment Composer's launcher gives its ranks (:mod:`dlrecipes.tools.launch`); returns the job's exit code."""
    from dlrecipes.records.store import RunOptions
    from dlrecipes.tools.launch import plan_ranks

    extra = (
        *(["--resume"] if resume else []),
        *(["--restart"] if restart else []),
        *(["--trust-checkpoint"] if trust_checkpoint else []),
        *(a for p in plugins for a in ("--plugin", p)),
    )
    overrides = override_strings(overrides)
    ranks = plan_ranks(("train", str(recipe), *overrides, *extra), nproc, nodes, node_rank, master_addr, master_port)
    config = validate(load(recipe, overrides, plugins))
    return _launched(config, RunOptions(resume=resume, restart=restart, trust=trust_checkpoint), ranks)


def _launched(config: RecipeConfig, options: RunOptions, ranks: RankPlan) -> int:
    """Start ``ranks`` (each trains ``config``) once what each rank's fit would refuse has been checked here, before
    any process starts; returns the job's exit code."""
    from dlrecipes.config.device_checks import check_launch
    from dlrecipes.tools.launch import gloo_environment, run_ranks

    options.check(config)  # before any process starts (each rank checks again)
    check_launch(config, ranks.nproc, ranks.world_size)
    store = _opened_store(config)  # a bucket, asked once here: one line before any process starts
    if options.resume and config.run_name:  # a typo starts no new run
        store.check_resumable(config.run_name, first_node=ranks.node_rank == 0)
    return run_ranks(ranks, gloo_environment(ranks.master_addr, ranks.master_port, ranks.world_size))


def train_request(request: str | Path, nproc: int = 1):
    """Train the run a request file hands this process (:class:`dlrecipes.records.request.RunRequest`; a sweep
    writes one for each training it starts): its recipe as the requesting process loaded it, validated here, not
    read or overridden again, trained with the request's options; the run records the train line the request
    stands for. ``nproc`` 1: in this process, returning a :class:`dlrecipes.fit.TrainResult`; more: on ``nproc``
    devices of this node, one process each opening the same request (as :func:`launch`), returning the job's exit
    code."""
    from dlrecipes.records.provenance import recording as recorded
    from dlrecipes.records.request import RunRequest
    from dlrecipes.tools.launch import plan_ranks

    given = RunRequest.read(request)
    options = given.options
    if nproc > 1:
        ranks = plan_ranks(("train-request", str(Path(request).resolve())), nproc)
        return _launched(given.config(), options, ranks)
    with recorded(given.command):
        return train(
            None,
            (),
            given.plugins,
            resume=options.resume,
            config=given.config(),
            trust_checkpoint=options.trust,
            verbose=options.verbose,
            restart=options.restart,
        )


def profile(
    recipe: str | Path | None = None,
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    model: str | None = None,
    params: dict[str, Any] | None = None,
    input_size: tuple[int, int, int] = (3, 224, 224),
    batch: int = 32,
    device: str = "auto",
    warmup: int = 3,
    repeats: int = 10,
) -> dict[str, Any]:
    """Parameters, size, MACs/FLOPs, latency and peak memory of a recipe's model, or of ``model`` by name, on
    ``device`` (auto: a GPU when this machine has one; cpu; gpu)."""
    from dlrecipes.core.devices import check_device_name, check_runs_here
    from dlrecipes.tools import model_cost

    check_runs_here(check_device_name(device, "--device"), "--device")  # before any model is built
    if (recipe is None) == (model is None):
        raise RecipeError("give either a RECIPE or --model NAME (with --input-size C,H,W)")
    if model is not None:
        net, size, title = model_cost.resolve_model(model, dict(params or {}), input_size), input_size, model
    else:
        from dlrecipes.builders import build_datasets

        config = resolve(recipe, overrides, plugins, check_device=False)
        net, size = model_cost.model_from_recipe(config.model, build_datasets(config.dataset))
        title = f"{config.name}: {config.model.name}"
    return {**model_cost.profile_model(net, size, batch, device, warmup, repeats), "model": title}


def bench(
    recipe: str | Path,
    overrides: Iterable[str] = (),
    plugins: Sequence[str] = (),
    steps: int = 30,
    rounds: int = 5,
    warmup: int = 5,
) -> dict[str, Any]:
    """Images/s through dlrecipes/Composer and through a plain PyTorch loop on the same model and batches."""
    config = resolve(recipe, overrides, plugins)
    process_state.import_training_stack()
    from dlrecipes.tools.bench import run_bench

    return run_bench(config, steps=steps, rounds=rounds, warmup=warmup)


def plot(run_dir: str | Path) -> list[Path]:
    """Redraw a run's plots from its history.csv; returns their paths (a run in a bucket: its local copy's, the
    plots uploaded beside the run)."""
    from dlrecipes.records.plots import plot_history
    from dlrecipes.records.store import open_for_reading

    read = open_for_reading(run_dir, None)  # a run in a bucket: its records, here
    with read.named():
        paths = plot_history(Path(read.target))
    read.outputs_written("the plots")
    return paths


def compare(
    run_dirs: Sequence[str | Path] = (),
    out: str | Path | None = None,
    last: int | None = None,
    runs_dir: str | Path = RUNS_DIR,
) -> tuple[list[dict[str, Any]], Path | None]:
    """The runs' summaries and, with ``out``, a plot of accuracy against wall-clock time written there.
    ``last``: instead of ``run_dirs``, the newest ``last`` runs under ``runs_dir``. Any of them may be in a bucket
    (``s3://...``)."""
    from dlrecipes.records.plots import compare_runs
    from dlrecipes.records.store import addressed_row, named_by_address, select_runs

    chosen, urls = select_runs(run_dirs, last, runs_dir)
    with named_by_address(urls):  # errors name a bucket's files by address
        summaries, plot = compare_runs(chosen, out)
    for path, summary in zip(chosen, summaries):
        if Path(path) in urls:  # a run in a bucket: named by its address (s3://b/u1 and s3://b/exp/u1 differ)
            addressed_row(summary, Path(path), urls)
            summary["run"] = urls[Path(path)]
    return summaries, plot


def runs(runs_dir: str | Path = RUNS_DIR, last: int | None = None) -> list[dict[str, Any]]:
    """The runs under ``runs_dir``, newest first: name, recipe, status, epochs done of planned, best monitored
    metric, wall time, device, precision and start time. ``runs_dir`` may be a bucket's ``s3://BUCKET/PREFIX``."""
    from dlrecipes.records.runs import describe_run
    from dlrecipes.records.store import named_by_address, store_for

    store = store_for(runs_dir)
    found = store.runs(last)  # a bucket's: local copies of their records, with their addresses
    addresses = {path: address for path, address in found if address is not None}
    with named_by_address(addresses):  # errors name a bucket's files by address
        return store.rows_shown([describe_run(path) for path, _ in found], addresses)


def convert_dataset(
    dataset: str,
    params: dict[str, Any],
    out: str | Path | None,
    options: Any = None,
    plugins: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    format: str = "ffcv",
) -> list:
    """Write a registered dataset's train and eval splits as FFCV ``.beton`` files in ``out`` (``options``: a
    ``ConvertOptions``), or with ``format="tensor_cache"`` as the tensor cache that ``trainer.loader: tensor_cache``
    reads, in ``out`` (its ``trainer.cache_dir``; None: where training looks by default; ``options``: a
    ``tools.data_convert.CacheOptions``)."""
    from dlrecipes.tools.data_convert import convert_dataset as convert

    load_all(plugins=plugins)
    return convert(dataset, params, out, options, echo=echo, format=format)


def inspect_beton(path: str | Path) -> dict[str, Any]:
    """Samples, fields, resolution statistics and classes of an FFCV ``.beton`` file."""
    from dlrecipes.data.ffcv.files import inspect_beton as inspect

    return inspect(Path(path))


def wheelhouse(out: str | Path, python_version: str | None = None, extras: Sequence[str] = ()) -> Path:
    """Wheels of everything dlrecipes needs except torch, for an offline machine; returns the requirements file."""
    from dlrecipes.tools.wheelhouse import build_wheelhouse

    return build_wheelhouse(Path(out), python_version, extras)
