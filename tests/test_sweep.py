"""Sweeps: the grid and its names, resumability, failures, parallel runs, random search, the table."""

from __future__ import annotations

import csv
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dlrecipes.errors import RecipeError
from dlrecipes.tools.sweep import plan_sweep, point_name, split_values

from .conftest import REPO, run_cli


def test_commas_split_values_outside_brackets_and_quotes():
    assert split_values("a,b") == ["a", "b"]
    assert split_values("[1,2],{x: 1, y: 2},'c,d'") == ["[1,2]", "{x: 1, y: 2}", "'c,d'"]
    assert split_values("loguniform(1e-4,1e-1)") == ["loguniform(1e-4,1e-1)"]


def test_the_grid_is_the_product_times_the_seeds_with_names_from_the_values(tmp_path):
    plan = plan_sweep(
        tmp_path / "r.yaml",
        [
            "optimizer.lr=0.003,0.01",
            "trainer.precision=fp32,amp_bf16",
            "trainer.max_duration=2ep",
            "model.layers=[1,2]",
        ],
        seeds=2,
    )
    assert plan.fixed == ["trainer.max_duration=2ep", "model.layers=[1,2]"]  # a bracketed value stays one value
    assert plan.swept == {"optimizer.lr": [0.003, 0.01], "trainer.precision": ["fp32", "amp_bf16"]}
    assert len(plan.points) == 8 and plan.name == "r-sweep"
    assert plan.points[0].name == "lr=0.003,precision=fp32,seed=1"
    assert plan.points[0].overrides == ["optimizer.lr=0.003", "trainer.precision=fp32", "trainer.seed=1"]
    assert len({p.name for p in plan.points}) == 8
    assert point_name({"model.width": 4, "dataset.width": 8}) == "model.width=4,dataset.width=8"  # same last part
    odd = point_name({"loggers": {"a": "x/y"}, "name": "a b"})
    assert "/" not in odd and " " not in odd and odd.startswith("loggers=")  # filesystem-safe


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (["optimizer.lr=0.1,"], {}, "an empty value"),
        (["trainer.max_duration=2ep"], {}, "nothing to sweep"),
        (["trainer.seed=1,2"], {"seeds": 2}, "trainer.seed is swept already"),
        (["optimizer.lr=gauss(1,2)"], {"trials": 2, "search": "random"}, "loguniform(a,b)"),
        (["optimizer.lr=loguniform(0,1)"], {"trials": 2, "search": "random"}, "needs 0 < low < high"),
        (["optimizer.lr=0.1,0.2"], {"trials": 2}, "--trials: only with --search random or --search optuna"),
        (["optimizer.lr=0.1,0.2"], {"trials": 2, "search": "grid"}, "--search: expected random or optuna, got 'grid'"),
        (["optimizer.lr=loguniform(1e-3,1e-1)"], {"search": "optuna"}, "--search optuna needs --trials N"),
        (
            ["optimizer.lr=loguniform(1e-3,1e-1)"],
            {"trials": 2, "search": "optuna", "seeds": 2},
            "an Optuna search trains each trial once",
        ),
        (["model.layers=[1,2],[3]"], {"trials": 2, "search": "optuna"}, "choices are numbers, strings or booleans"),
    ],
)
def test_sweep_mistakes_name_the_key(tmp_path, args, kwargs, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_sweep(tmp_path / "r.yaml", args, **kwargs)


def test_random_search_samples_within_the_ranges_reproducibly(tmp_path):
    args = ["optimizer.lr=loguniform(1e-4,1e-1)", "model.width=randint(2,8)", "trainer.precision=choice(fp32,amp_bf16)"]
    plan = plan_sweep(tmp_path / "r.yaml", args, trials=5, search="random")
    assert len(plan.points) == 5
    for point in plan.points:
        assert 1e-4 <= point.values["optimizer.lr"] <= 1e-1 and 2 <= point.values["model.width"] <= 8
        assert point.values["trainer.precision"] in ("fp32", "amp_bf16")
    again = plan_sweep(tmp_path / "r.yaml", args, trials=5, search="random")
    assert [p.values for p in again.points] == [p.values for p in plan.points]


def _table(folder: Path) -> list[dict[str, str]]:
    with open(folder / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_2x2_grid_in_parallel_then_repeated_is_skipped(tiny_recipe):
    runs = tiny_recipe.parent / "runs"
    result = run_cli(
        "sweep", str(tiny_recipe), "optimizer.lr=0.01,0.1", "model.width=4,8", "--parallel", "2", timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = runs / "tiny-sweep"
    names = sorted(p.name for p in folder.iterdir() if (p / "recipe.yaml").is_file())
    assert names == ["lr=0.01,width=4", "lr=0.01,width=8", "lr=0.1,width=4", "lr=0.1,width=8"]
    assert all(json.loads((folder / n / "summary.json").read_text())["status"] == "finished" for n in names)
    assert len([line for line in result.stdout.splitlines() if line.startswith("[")]) == 4  # one line per run
    rows = _table(folder)
    assert [(r["optimizer.lr"], r["model.width"]) for r in rows] == [
        ("0.01", "4"),
        ("0.01", "8"),
        ("0.1", "4"),
        ("0.1", "8"),
    ]
    for row, name in zip(rows, names):
        best = json.loads((folder / name / "checkpoints" / "best.json").read_text())["value"]
        assert float(row["best"]) == pytest.approx(best) and row["status"] == "done"
    assert "| optimizer.lr | model.width | best top1 | final top1 |" in (folder / "summary.md").read_text()
    for name in names:  # each point handed its run (no overrides parsed again): it records the line its log shows
        logged = (folder / "logs" / f"{name}.log").read_text().splitlines()[0].removeprefix("$ ")
        made = json.loads((folder / name / "summary.json").read_text())["provenance"]
        assert made["command"] == logged and shlex.split(logged)[:3] == ["dlrecipes", "train", str(tiny_recipe)]
        assert f"run_name={name}" in shlex.split(logged) and made["recipe_file"] == str(tiny_recipe.resolve())
    assert (folder / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads(json.dumps(__import__("yaml").safe_load((folder / "sweep.yaml").read_text())))["swept"] == {
        "optimizer.lr": [0.01, 0.1],
        "model.width": [4, 8],
    }
    again = run_cli("sweep", str(tiny_recipe), "optimizer.lr=0.01,0.1", "model.width=4,8")
    assert again.returncode == 0 and again.stdout.count("(finished)") == 4 and "[1/" not in again.stdout
    assert _table(folder) == rows
    compared = run_cli("compare", *(str(folder / n) for n in names))
    assert "model.width" in compared.stdout and "optimizer.lr" in compared.stdout  # the settings that differ


@pytest.mark.slow
def test_a_run_request_trains_what_its_writer_loaded_and_records_its_train_line(tiny_recipe, tmp_path):
    """What a sweep hands each point: the recipe as the sweep loaded it, its overrides applied and the point's store
    and name set. ``train-request`` trains it with the recipe file gone (nothing is read or parsed again) and the
    run records the train line it stands for; the file is its owner's alone; a missing or foreign one is a line."""
    from dlrecipes.config.resolving import load_local
    from dlrecipes.records.request import RunRequest
    from dlrecipes.records.store import RunOptions

    overrides, runs = ["trainer.max_duration=1ep", "optimizer.lr=0.05"], tmp_path / "elsewhere"
    point = [*overrides, f"runs_dir={runs}", "run_name=handed", "trainer.progress_bar=false"]
    request = RunRequest.of(load_local(tiny_recipe, point), point, [], RunOptions())
    path = request.write(tmp_path, "handed")
    assert path.stat().st_mode & 0o777 == 0o600 and RunRequest.read(path) == request
    assert request.command == shlex.join(
        [
            "dlrecipes",
            "train",
            str(tiny_recipe),
            *overrides,
            f"runs_dir={runs}",
            "run_name=handed",
            "trainer.progress_bar=false",
        ]
    )
    recipe_text = tiny_recipe.read_text()
    tiny_recipe.unlink()
    result = run_cli("train-request", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((runs / "handed" / "summary.json").read_text())
    assert summary["provenance"]["command"] == request.command and summary["status"] == "finished"
    recorded = yaml.safe_load((runs / "handed" / "recipe.yaml").read_text())
    assert (recorded["optimizer"]["lr"], recorded["run_name"], recorded["runs_dir"]) == (0.05, "handed", str(runs))
    foreign = tmp_path / "tiny.yaml"
    foreign.write_text(recipe_text)
    for bad, said in ((tmp_path / "missing.yaml", "cannot read the run request"), (foreign, "not a run request")):
        refused = run_cli("train-request", str(bad))
        assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


@pytest.mark.slow
def test_a_failing_point_is_marked_while_the_others_complete(tiny_recipe):
    """The diverged point leaves no run directory (no checkpoint yet): its outcome and reason come from the
    sweep's record of how its training ended, and the sweep exits 1, counting it in its last line."""
    result = run_cli("sweep", str(tiny_recipe), "optimizer.lr=0.05,1e12", "trainer.log_interval=1", timeout=600)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    folder = tiny_recipe.parent / "runs" / "tiny-sweep"
    rows = {r["optimizer.lr"]: r for r in _table(folder)}
    assert rows["0.05"]["status"] == "done" and rows["0.05"]["reason"] == ""
    assert rows["1e+12"]["status"] == "diverged" and rows["1e+12"]["reason"].startswith("training diverged: the loss")
    assert f"| diverged | {rows['1e+12']['reason']} |" in (folder / "summary.md").read_text()
    assert "lr=1e+12: diverged: training diverged: the loss" in result.stdout
    assert result.stdout.splitlines()[-1] == f"1 of 2 points did not finish: 1 diverged; see {folder}/summary.md"


TROUBLE = """
from dlrecipes.registry import callbacks


@callbacks.register("trouble")
def trouble(refuse: bool = False):
    \"\"\"Refuse to be built (a recipe the trainer refuses, exit 2), or fail at the first batch.\"\"\"
    from composer.core import Callback

    from dlrecipes.errors import DataError

    if refuse:
        raise DataError("trouble: refused on purpose")

    class Trouble(Callback):
        def batch_end(self, state, logger):
            raise RuntimeError("boom at the first batch")

    return Trouble()
"""


@pytest.mark.slow
def test_a_failed_and_a_refused_point_each_say_why_and_the_sweep_exits_1(tiny_recipe):
    """Neither leaves a run directory: the reason is the last line of the point's log."""
    plugin = tiny_recipe.parent / "trouble.py"
    plugin.write_text(TROUBLE)
    result = run_cli(
        "sweep", str(tiny_recipe), "callbacks.trouble.refuse=false,true", f"imports=[{plugin}]", timeout=600
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    folder = tiny_recipe.parent / "runs" / "tiny-sweep"
    failed, refused = _table(folder)
    assert (failed["status"], refused["status"]) == ("failed", "refused")
    assert failed["reason"].startswith("training failed: RuntimeError: boom at the first batch (")
    assert refused["reason"] == "trouble: refused on purpose"
    markdown = (folder / "summary.md").read_text()
    assert "| failed | training failed: RuntimeError: boom" in markdown
    assert "| refused | trouble: refused on purpose |" in markdown
    table = result.stdout[result.stdout.index("sweep tiny-sweep: refuse = callbacks.trouble.refuse") :]
    assert re.search(r"│ False +│.*│ failed +│", table) and re.search(r"│ True +│.*│ refused +│", table), table
    assert "refuse=True: refused: trouble: refused on purpose" in table
    assert table.splitlines()[-1].startswith("2 of 2 points did not finish: 1 failed, 1 refused; see ")


@pytest.mark.slow
def test_a_point_refused_for_an_untrusted_checkpoint_trains_with_the_sweeps_own_trust_checkpoint(
    trained_tiny, tiny_recipe
):
    """Issue 63: the refusal says "pass --trust-checkpoint", and the sweep, which had no such option, now takes it
    and passes it on to each point's training."""
    import torch

    start = tiny_recipe.parent / "start.pt"
    state = torch.load(trained_tiny / "checkpoints" / "best.pt", map_location="cpu", weights_only=False)
    torch.save({**state, "where": Path("x")}, start)  # a harmless object beyond tensors
    args = (
        "sweep",
        str(tiny_recipe),
        "optimizer.lr=0.01,0.05",
        f"checkpoint.load_path={start}",
        "trainer.max_duration=1ba",
        "trainer.eval_subset_num_batches=1",
    )
    refused = run_cli(*args, timeout=600)
    assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
    reasons = {r["reason"] for r in _table(tiny_recipe.parent / "runs" / "tiny-sweep")}
    assert len(reasons) == 1 and reasons.pop().endswith("If you trust the file, pass --trust-checkpoint")
    trusted = run_cli(*args, "--trust-checkpoint", timeout=600)
    assert trusted.returncode == 0, trusted.stdout[-3000:] + trusted.stderr[-3000:]
    assert [r["status"] for r in _table(tiny_recipe.parent / "runs" / "tiny-sweep")] == ["done", "done"]


@pytest.mark.slow
def test_a_failed_trial_keeps_its_outcome_when_the_search_goes_on(tiny_recipe):
    """An Optuna search does not train a failed trial again: the next run of the sweep still shows how it ended
    (it left no run directory), recorded in the sweep's folder."""
    search = ["optimizer.lr=choice(1e12)", "trainer.log_interval=1", "--trials", "1", "--search", "optuna"]
    first = run_cli("sweep", str(tiny_recipe), *search, timeout=600)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    again = run_cli("sweep", str(tiny_recipe), *search, timeout=600)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    rows = _table(tiny_recipe.parent / "runs" / "tiny-sweep")
    assert [(r["trial"], r["status"]) for r in rows] == [("0", "diverged"), ("1", "diverged")]
    assert rows[0]["reason"].startswith("training diverged: ")
    assert again.stdout.splitlines()[-1].startswith("2 of 2 trials did not finish: 2 diverged; see ")


@pytest.mark.slow
def test_random_search_of_three_trials(tiny_recipe):
    result = run_cli(
        "sweep",
        str(tiny_recipe),
        "optimizer.lr=loguniform(1e-3,1e-1)",
        "--trials",
        "3",
        "--search",
        "random",
        "--name",
        "search",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _table(tiny_recipe.parent / "runs" / "search")
    assert len(rows) == 3 and all(1e-3 <= float(r["optimizer.lr"]) <= 1e-1 and r["status"] == "done" for r in rows)


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_to_the_same_table(tiny_recipe):
    grid = ["optimizer.lr=0.02,0.05", "trainer.max_duration=6ep", "trainer.deterministic=true"]
    whole = run_cli("sweep", str(tiny_recipe), *grid, "--name", "whole", timeout=600)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    # the interrupted sweep's batches take at least 0.3 s, so that the signal lands inside its second point
    grid += [f"imports=[{REPO / 'tests' / 'fault_injection.py'}]", "callbacks.slow_batches={seconds: 0.3}"]
    folder = tiny_recipe.parent / "runs" / "cut"
    from . import forked  # a process of its own, to signal

    output = tiny_recipe.parent / "cut.txt"
    sweep = forked.start(["sweep", str(tiny_recipe), *grid, "--name", "cut"], REPO, output)
    log = folder / "logs" / "lr=0.05.log"
    deadline = time.time() + 300
    while not (log.is_file() and "\n2/6" in log.read_text()) and time.time() < deadline:
        time.sleep(0.1)  # the second point has trained two epochs
    sweep.send_signal(signal.SIGINT)
    sweep.wait(300)
    out = output.read_text()
    assert sweep.returncode == 75, out[-3000:]
    assert "sweep stopped by SIGINT" in out and "stopped (resumable)" in out
    resumed = run_cli("sweep", str(tiny_recipe), *grid, "--name", "cut", timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "skip   lr=0.02 (finished)" in resumed.stdout
    columns = ("optimizer.lr", "best", "final", "status")
    assert [{c: r[c] for c in columns} for r in _table(folder)] == [
        {c: r[c] for c in columns} for r in _table(tiny_recipe.parent / "runs" / "whole")
    ]


def test_an_optuna_search_without_optuna_says_how_to_install_it(tmp_path, monkeypatch):
    from dlrecipes.errors import UserError

    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'dlrecipes\[optuna\]'"):
        plan_sweep(tmp_path / "r.yaml", ["optimizer.lr=loguniform(1e-3,1e-1)"], trials=2, search="optuna")


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_an_optuna_trial_below_the_median_of_finished_ones_is_pruned(tiny_recipe, tmp_path, nproc):
    """A finished trial reported 1.0 at every evaluation; one training at a learning rate too small to learn
    reports its top1 (about 0.1), is spared at its first evaluation (warm-up) and pruned at its second (with two
    processes, rank 0 reports and both stop)."""
    import optuna

    from dlrecipes.callbacks.optuna_trial import journal_storage

    journal = tmp_path / "study.journal"
    study = optuna.create_study(study_name="s", storage=journal_storage(str(journal)), direction="maximize")
    lr = {"optimizer.lr": optuna.distributions.FloatDistribution(1e-6, 1.0, log=True)}
    study.add_trial(
        optuna.trial.create_trial(
            params={"optimizer.lr": 0.05},
            distributions=lr,
            value=1.0,
            intermediate_values={0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0},
        )
    )
    trial = study.ask(lr)
    callback = json.dumps({"storage": str(journal), "study": "s", "trial": trial.number, "startup_trials": 1})
    how = ["train"] if nproc == 1 else ["launch", "-n", str(nproc)]
    result = run_cli(
        *how,
        str(tiny_recipe),
        "run_name=low",
        "trainer.max_duration=4ep",
        "optimizer.lr=1e-6",
        f"callbacks.optuna_trial={callback}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pruned: 2 epochs" in result.stderr and "pruned by the Optuna study 's' after evaluation 2" in result.stderr
    run = tmp_path / "runs" / "low"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "pruned" and summary["epochs"] == 2 and summary["world_size"] == nproc
    with open(run / "history.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    reported = optuna.load_study(study_name="s", storage=journal_storage(str(journal))).trials[trial.number]
    assert sorted(reported.intermediate_values) == [0, 1] and [r["epoch"] for r in rows] == ["1", "2"]
    assert reported.intermediate_values[1] == pytest.approx(float(rows[1]["eval_top1"]))
    assert "pruned" in run_cli("runs", str(tmp_path / "runs")).stdout


@pytest.mark.slow
def test_an_optuna_search_of_three_trials_then_repeated_is_skipped(tiny_recipe):
    import optuna

    from dlrecipes.callbacks.optuna_trial import journal_storage

    search = [
        "optimizer.lr=loguniform(1e-3,0.3)",
        "model.width=choice(4,8)",
        "--trials",
        "3",
        "--search",
        "optuna",
        "--name",
        "tpe",
    ]
    result = run_cli("sweep", str(tiny_recipe), *search, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = tiny_recipe.parent / "runs" / "tpe"
    rows = _table(folder)
    assert [r["trial"] for r in rows] == ["0", "1", "2"] and all(r["status"] in ("done", "pruned") for r in rows)
    study = optuna.load_study(study_name="tpe", storage=journal_storage(str(folder / "optuna.journal")))
    for row, trial in zip(rows, study.trials):
        run = folder / f"trial={trial.number},lr={trial.params['optimizer.lr']:.4g},width={trial.params['model.width']}"
        recipe = __import__("yaml").safe_load((run / "recipe.yaml").read_text())
        assert recipe["optimizer"]["lr"] == trial.params["optimizer.lr"] and 1e-3 <= trial.params["optimizer.lr"] <= 0.3
        assert recipe["model"]["width"] == trial.params["model.width"] == int(row["model.width"])
        assert trial.state.name == {"done": "COMPLETE", "pruned": "PRUNED"}[row["status"]]
        if row["status"] == "done":  # the trial's value: the run's best monitored top1
            assert trial.value == pytest.approx(float(row["best"]))
    assert "| trial | optimizer.lr | model.width | best top1 |" in (folder / "summary.md").read_text()
    again = run_cli("sweep", str(tiny_recipe), *search)
    assert again.returncode == 0 and again.stdout.count("skip   trial=") == 3 and "[1/" not in again.stdout
    assert _table(folder) == rows


@pytest.mark.slow
def test_each_point_on_two_processes_through_launch(tiny_recipe):
    """One point (a seed) is enough: each point is started the same way (two points were two launches of
    about 35 s each)."""
    result = run_cli("sweep", str(tiny_recipe), "--seeds", "1", "--nproc", "2", "--name", "ddp", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = tiny_recipe.parent / "runs" / "ddp"
    assert [r["status"] for r in _table(folder)] == ["done"]
    assert json.loads((folder / "seed=1" / "summary.json").read_text())["world_size"] == 2
    assert "launch -n 2" in (folder / "logs" / "seed=1.log").read_text().splitlines()[0]


def test_processes_per_point_are_checked_up_front(tiny_recipe):
    none = run_cli("sweep", str(tiny_recipe), "optimizer.lr=0.02,0.05", "--nproc", "0")
    assert none.returncode == 2 and "--nproc: at least 1 process per training, got 0" in none.stderr
    uneven = run_cli("sweep", str(tiny_recipe), "optimizer.lr=0.02,0.05", "--nproc", "3")
    assert uneven.returncode == 2 and "sweep point lr=0.02: trainer.batch_size" in uneven.stderr, uneven.stderr
    assert not (tiny_recipe.parent / "runs").exists()


def test_parallel_launched_points_get_groups_of_gpus(monkeypatch):
    from dlrecipes.tools.sweep.run import _child_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")
    assert [_child_env(3, i, 2)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["0,1", "2,3", "0,1"]
    assert [_child_env(2, i, 1)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["0", "1"]
    assert _child_env(2, 0, 2)["OMP_NUM_THREADS"] == str(max(1, (__import__("os").cpu_count() or 1) // 4))


def test_an_optuna_study_drawn_from_other_ranges_is_one_line(tmp_path):
    from dlrecipes.errors import UserError
    from dlrecipes.records.store import store_for
    from dlrecipes.tools.sweep import prepare_folder
    from dlrecipes.tools.sweep.run import _Search

    plan = plan_sweep(tmp_path / "r.yaml", ["model.width=choice(4,8)"], trials=2, search="optuna", name="s")
    prepare_folder(plan, store_for(tmp_path / "runs").sweep(plan.name))
    assert _Search(plan, print).next()[0].values["model.width"] in (4, 8)  # trial 0 asked, not trained
    other = plan_sweep(tmp_path / "r.yaml", ["model.width=choice(4,16)"], trials=2, search="optuna", name="s")
    prepare_folder(other, store_for(tmp_path / "runs").sweep(other.name))
    search = _Search(other, print)
    assert search.next()[0].name.startswith("trial=0,")  # the trial left running comes first
    with pytest.raises(UserError, match="drew its trials from other ranges"):
        search.next()


@pytest.mark.slow
def test_at_80_columns_the_table_keeps_key_names_whole_and_values_on_one_line(tiny_recipe):
    """In a terminal 80 columns wide: the swept key is headed by its last part, named in full above the table;
    mean ± std stays on one line; the diverged points' reasons and the closing line follow."""
    from .test_terminal import _in_pty, _on_screen

    out = _in_pty(
        [
            "sweep",
            str(tiny_recipe),
            "optimizer.lr=0.05,1e12",
            "--seeds",
            "2",
            "--parallel",
            "2",
            "trainer.max_duration=1ep",
            "trainer.log_interval=1",
        ],
        80,
        expect=1,
    )
    lines = _on_screen(out)
    table = lines[lines.index("sweep tiny-sweep: lr = optimizer.lr") :]  # the report, after a line per training
    runs_dir = str(tiny_recipe.parent / "runs")  # the test's own long path: a line holding it may wrap
    assert all(len(line.replace(runs_dir, "runs")) <= 80 for line in table), max(table, key=len)
    assert re.match(r"┃ lr +┃ best top1 +┃", table[2]) and "…" not in out, "\n".join(table)
    done = next(line for line in table if line.startswith("│ 0.05 "))
    assert re.match(r"│ 0\.05 +│ 0\.\d{4} ± 0\.\d{4} │", done) and "│ 2/2  │ done " in done, done
    assert any(line.startswith("│ 1e+12 ") and "│ 0/2  │ diverged " in line for line in table), "\n".join(table)
    assert any(line.startswith("lr=1e+12,seed=2: diverged: training diverged: the loss is") for line in table)
    assert out.rstrip().splitlines()[-1].startswith("2 of 4 points did not finish: 2 diverged; see ")


@pytest.mark.slow
def test_a_closed_terminal_stops_the_sweep_like_sigterm_and_a_rerun_resumes(tiny_recipe):
    """The sweep's terminal closes (its pseudo-terminal's other end), as when an ssh session drops: the kernel
    sends SIGHUP; the training gets SIGTERM passed on and stops with a checkpoint, the sweep writes its summary
    to its folder (not to the dead terminal) and exits 75; running it again resumes the point."""
    import fcntl
    import os
    import pty
    import select
    import termios

    grid = [
        "--seeds",
        "1",
        "trainer.max_duration=3ep",
        f"imports=[{REPO / 'tests' / 'fault_injection.py'}]",
        "callbacks.slow_batches={seconds: 0.3}",
    ]
    master, slave = pty.openpty()
    sweep = subprocess.Popen(
        [sys.executable, "-m", "dlrecipes", "sweep", str(tiny_recipe), *grid],
        cwd=REPO,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )  # its controlling terminal
    os.close(slave)
    folder = tiny_recipe.parent / "runs" / "tiny-sweep"
    log = folder / "logs" / "seed=1.log"
    deadline = time.time() + 300
    while not (log.is_file() and "\n1/3" in log.read_text()) and time.time() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            os.read(master, 65536)  # the terminal reads what the sweep prints
    os.close(master)  # the terminal goes away
    assert sweep.wait(timeout=300) == 75
    assert [r["status"] for r in _table(folder)] == ["stopped (resumable)"]
    summary = json.loads((folder / "seed=1" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "SIGTERM" in summary["reason"], summary
    resumed = run_cli("sweep", str(tiny_recipe), *grid, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    commands = [line.split() for line in log.read_text().splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and "--resume" not in commands[0] and "--resume" in commands[1]
    assert json.loads((folder / "seed=1" / "summary.json").read_text())["status"] == "finished"


def test_a_training_ended_by_the_sweeps_own_stop_is_stopped_not_failed(tmp_path):
    """Exit 75 before a run directory existed, or death by the signal the sweep passed on, is a stop (resumed on
    the next run of the sweep), not a failure counted against it; a signal nobody sent is a failure."""
    from dlrecipes.tools.sweep.report import LOG_DIR, record_outcome

    (tmp_path / LOG_DIR).mkdir()
    assert record_outcome(tmp_path, "lr=0.1", 75)["status"] == "stopped"
    assert record_outcome(tmp_path, "lr=0.1", -signal.SIGTERM, signalled=True)["status"] == "stopped"
    killed = record_outcome(tmp_path, "lr=0.1", -signal.SIGKILL)
    assert killed == {"status": "failed", "reason": "killed by SIGKILL", "exit_code": -signal.SIGKILL}


def test_a_forked_training_is_a_process_of_its_own(tmp_path):
    """What a sweep's trainings get on a CPU (dlrecipes/runtime/fork_server.py): the sweep's working directory (a
    relative recipe path), its output appended to the log, the command's exit code and one-line error, a session
    of its own, and a kill of its own."""
    import os

    from dlrecipes.api import FORKED
    from dlrecipes.runtime import fork_server

    log = tmp_path / "point.log"
    log.write_text("$ the command\n")
    (tmp_path / "r.yaml").write_text("model: {name: cnn_simple}\ndataset: {name: digits}\noptimizer: {name: nope}\n")
    refused = fork_server.start(FORKED, ["validate", "r.yaml"], cwd=tmp_path, out=log, append=True, new_session=True)
    assert refused.wait(120) == 2
    lines = log.read_text().splitlines()
    assert lines[0] == "$ the command" and len(lines) == 2 and lines[1].startswith("error: optimizer.name"), lines
    (tmp_path / "cwd_plugin.py").write_text(
        "from dlrecipes.registry import losses\n\n\n"
        "@losses.register('from_the_cwd')\ndef from_the_cwd():\n    return None\n"
    )
    listed = fork_server.start(
        FORKED, ["list", "losses", "--plugin", "cwd_plugin"], cwd=tmp_path, out=tmp_path / "list.log"
    )
    assert listed.wait(120) == 0 and "from_the_cwd" in (tmp_path / "list.log").read_text()  # as python -m: cwd first
    training = fork_server.start(
        FORKED,
        ["train", str(REPO / "recipes" / "quickstart.yaml"), f"runs_dir={tmp_path}/runs"],
        cwd=tmp_path,
        out=tmp_path / "train.log",
        new_session=True,
    )
    deadline = time.monotonic() + 60
    while os.getsid(training.pid) != training.pid and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.getsid(training.pid) == training.pid != os.getsid(0) and training.poll() is None
    training.kill()
    assert training.wait(60) == -signal.SIGKILL and training.returncode == -signal.SIGKILL


def test_a_forked_process_leaves_what_the_server_imported_out_of_its_full_collections(tmp_path):
    """The server freezes what it has imported (about 500,000 objects) once its imports are done, so that a forked
    training's full collections (one in a quickstart training with its plots: 0.35 s) walk only what the training
    made; what the fork makes is still collected."""
    from .forked import run_forked

    script = tmp_path / "probe.py"
    script.write_text(
        "import gc, json, weakref\n"
        "class Cycle:\n    pass\n"
        "made = Cycle(); made.me = made; gone = weakref.ref(made); del made\n"
        "frozen, walked = gc.get_freeze_count(), len(gc.get_objects(generation=2))\n"
        "gc.collect()\n"
        "print(json.dumps({'frozen': frozen, 'walked': walked, 'collected': gone() is None}))\n"
    )
    done = run_forked([], cwd=tmp_path, timeout=120, module=str(script))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["frozen"] > 100_000 and seen["walked"] < seen["frozen"] / 20 and seen["collected"], seen


def test_a_sweep_forked_from_the_server_forks_its_trainings_itself_with_fresh_signal_handling(tmp_path):
    """A sweep that is itself a fork of the server (as the tests start commands) has the server's imports: it forks
    its trainings itself instead of starting a second server to pay them again, and each starts with the signal
    handling a new Python has, not the sweep's; with a second thread running it would not fork itself. (Forked
    from the server even where DLRECIPES_TEST_FORK=0 makes the other tests' processes new Pythons: the server is
    the point here.)"""
    from .forked import run_forked

    done = run_forked(["driver", str(tmp_path)], cwd=REPO, timeout=120, module="tests.fork_probe")
    assert done.returncode == 0, done.stderr[-2000:]
    driver, child = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("driver", "child"))
    assert driver["code"] == 0 and child["ppid"] == driver["pid"]  # forked by the driver, not by a server
    assert driver["children_left"] == [] and driver["forks_itself_with_a_thread"] is False
    assert (
        child["handlers"] == {"SIGTERM": "SIG_DFL", "SIGINT": "default_int_handler", "SIGPIPE": "SIG_IGN"}
        and child["blocked"] == []
    )


def test_trainings_are_forked_only_on_a_cpu_one_process_each(monkeypatch):
    from dlrecipes.tools.sweep import run as sweep

    monkeypatch.delenv("DLRECIPES_SWEEP_FRESH_PYTHON", raising=False)
    monkeypatch.setattr(sweep, "visible_gpus", lambda: [])
    assert sweep.forks_trainings(1) and not sweep.forks_trainings(2)  # launch starts its own processes
    monkeypatch.setenv("DLRECIPES_SWEEP_FRESH_PYTHON", "1")
    assert not sweep.forks_trainings(1)
    monkeypatch.delenv("DLRECIPES_SWEEP_FRESH_PYTHON")
    monkeypatch.setattr(sweep, "visible_gpus", lambda: ["0"])
    assert not sweep.forks_trainings(1)  # CUDA does not survive a fork


def test_a_sweep_whose_own_files_did_not_all_upload_says_which_and_exits_1(tmp_path):
    """The end of a sweep in a bucket: the files its store could not upload are named in one line (the first five),
    and the sweep's exit code is 1; nothing missing: 0 and nothing said."""
    from dlrecipes.records.store import SweepFolder
    from dlrecipes.tools.sweep import finish_folder

    said: list[str] = []
    missing = [f"points/p{k}/summary.json" for k in range(7)]
    folder = SweepFolder(tmp_path, "s3://runs/sweeps/lr", "s3://runs", finish=lambda: missing)
    assert finish_folder(folder, said.append) == 1
    assert said == [
        "error: 7 file(s) of the sweep are not in s3://runs/sweeps/lr: points/p0/summary.json, points/p1/summary.json, "
        "points/p2/summary.json, points/p3/summary.json, points/p4/summary.json ... (the same command uploads them)"
    ]
    assert finish_folder(SweepFolder(tmp_path, str(tmp_path), str(tmp_path)), said.append) == 0 and len(said) == 1
