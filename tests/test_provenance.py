"""Every run records what made it (issue 52, items 4 and 5): versions, machine, command, the recipe's commit, the
plugin files; ``runs`` and ``compare`` show it, trackers receive it, and a run's own recipe.yaml trains the same
run again, warning about each item that is not as it was."""

from __future__ import annotations

import json
import subprocess
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from .conftest import TINY_RECIPE, run_cli, write

PLUGIN = '''
from dlrecipes.registry import callbacks


@callbacks.register("provenance_probe")
def provenance_probe():
    """Does nothing (a plugin whose file the run records)."""
    from composer.core import Callback

    return Callback()
'''


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A recipe committed in a git repository of its own (with a plugin), trained deterministically as ``first``;
    then its recipe.yaml trained again as ``again``."""
    repo = tmp_path_factory.mktemp("project")
    write(repo / "probe_plugin.py", PLUGIN)
    recipe = write(
        repo / "tiny.yaml",
        textwrap.dedent(TINY_RECIPE).lstrip()
        + textwrap.dedent(f"""
        imports: [probe_plugin.py]
        callbacks: {{provenance_probe: {{}}}}
        runs_dir: {repo / "runs"}
        """),
    )
    (repo / ".gitignore").write_text("runs/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "recipe")
    from dlrecipes.runtime.process_state import kept

    with kept():  # deterministic mode is torch's global flag: the test process's other tests run without it
        first = run_cli(
            "train", str(recipe), "run_name=first", "trainer.deterministic=true", "trainer.max_duration=1ep", cwd=repo
        )
        again = run_cli("train", str(repo / "runs" / "first" / "recipe.yaml"), "run_name=again", cwd=repo)
    assert first.returncode == 0, first.stderr[-2000:]
    assert again.returncode == 0, again.stderr[-2000:]
    return repo, recipe, again


def _provenance(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["provenance"]


@pytest.mark.slow  # the module's three tiny trainings
def test_the_summary_records_versions_machine_command_commit_plugins_and_seed(runs):
    import socket
    import sys

    repo, recipe, _ = runs
    made = _provenance(repo / "runs" / "first")
    assert made["versions"] == {
        "dlrecipes": metadata.version("dlrecipes"),
        "torch": metadata.version("torch"),
        "torchvision": metadata.version("torchvision"),
        "composer": metadata.version("mosaicml"),
        "timm": metadata.version("timm"),
        "numpy": metadata.version("numpy"),
        "python": ".".join(map(str, sys.version_info[:3])),
    }
    assert "cuda" not in made and "gpu" not in made  # a CPU run
    assert (made["host"], made["world_size"], made["nodes"], made["seed"]) == (socket.gethostname(), 1, 1, 17)
    assert made["command"].endswith(
        f"train {recipe} run_name=first trainer.deterministic=true trainer.max_duration=1ep"
    )
    assert made["recipe_file"] == str(recipe.resolve())
    assert (made["git_repo"], made["git_commit"], made["git_dirty"]) == (
        str(repo.resolve()),
        _git(repo, "rev-parse", "HEAD"),
        False,
    )
    assert made["git_uncommitted"] == []
    checkout = Path(__file__).resolve().parents[1]  # the suite runs dlrecipes from its git checkout
    assert made["dlrecipes_commit"] == _git(checkout, "rev-parse", "HEAD") != made["git_commit"]
    plugin = str((repo / "probe_plugin.py").resolve())
    import hashlib

    assert made["plugins"][plugin] == hashlib.sha256((repo / "probe_plugin.py").read_bytes()).hexdigest()


@pytest.mark.slow  # the module's three tiny trainings
def test_a_runs_recipe_trains_the_same_run_again(runs):
    """trainer.deterministic on the CPU: the second run's history is the first's, value for value; nothing
    differed, so nothing was said."""
    repo, _, again = runs
    columns = ("epoch", "step", "lr", "train_loss", "eval_loss", "eval_top1", "eval_top5")

    def history(run: str) -> list[tuple]:
        import csv

        with open(repo / "runs" / run / "history.csv", newline="") as f:
            return [tuple(row[c] for c in columns) for row in csv.DictReader(f)]

    assert history("again") == history("first") and len(history("first")) == 1
    assert "warning" not in again.stderr
    assert _provenance(repo / "runs" / "again")["recipe_file"] == str(
        (repo / "runs" / "first" / "recipe.yaml").resolve()
    )


@pytest.mark.slow  # the module's three tiny trainings
def test_a_rerun_names_each_item_that_differs_and_runs_and_compare_show_them(runs):
    repo, _, _ = runs
    summary = repo / "runs" / "first" / "summary.json"
    data = json.loads(summary.read_text())
    data["provenance"]["versions"]["torch"] = "0.0.1"
    data["provenance"]["git_commit"] = "0" * 40
    summary.write_text(json.dumps(data))
    from dlrecipes.runtime.process_state import kept

    with kept():  # the run's recipe is deterministic: torch's global flag, put back for the process's other tests
        rerun = run_cli(
            "train",
            str(repo / "runs" / "first" / "recipe.yaml"),
            "run_name=third",
            "trainer.max_duration=1ba",
            cwd=repo,
        )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    commit = _git(repo, "rev-parse", "HEAD")
    warnings = [line for line in rerun.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: first was trained differently: torch {metadata.version('torch')} (the run had 0.0.1)",
        f"warning: first was trained differently: git commit {commit} (the run had {'0' * 40})",
    ]
    listed = json.loads(run_cli("runs", str(repo / "runs"), "--json").stdout)
    rows = {row["run"]: row for row in listed}
    assert rows["first"]["torch"] == "0.0.1" and rows["third"]["torch"] == metadata.version("torch")
    assert rows["third"]["commit"] == commit[:8] and rows["third"]["provenance"]["seed"] == 17
    compared = json.loads(
        run_cli("compare", str(repo / "runs" / "first"), str(repo / "runs" / "third"), "--json").stdout
    )
    assert [r["environment"] for r in compared] == [
        {"torch": "0.0.1", "git_commit": "0" * 40},
        {"torch": metadata.version("torch"), "git_commit": commit},
    ]
    shown = run_cli("compare", str(repo / "runs" / "first"), str(repo / "runs" / "third"))
    assert shown.returncode == 0 and "torch" in shown.stdout and "0.0.1" in shown.stdout


def _committed(repo: Path, *files: str) -> Path:
    """A git repository at ``repo`` whose one commit holds ``files`` (each with a line of text)."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in files:
        write(repo / name, f"# {name}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", *files)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "files")
    return repo


def test_a_recipe_in_no_repository_records_none_not_the_working_directorys(tmp_path, monkeypatch):
    """Issue 63: the working directory's repository was recorded as the recipe's; it made nothing of the run."""
    from types import SimpleNamespace

    from dlrecipes.records.provenance import recipe_origin

    monkeypatch.chdir(_committed(tmp_path / "elsewhere", "a.py"))
    recipe = write(tmp_path / "loose" / "r.yaml", "name: r\n")
    made = recipe_origin(SimpleNamespace(origin=str(recipe)), [])
    assert made == {
        "recipe_file": str(recipe.resolve()),
        "git_repo": None,
        "git_commit": None,
        "git_dirty": None,
        "git_uncommitted": [],
    }
    assert recipe_origin(SimpleNamespace(origin=None), [])["git_repo"] is None  # a recipe given as a dict


def test_a_plugin_the_recipes_commit_does_not_hold_makes_it_dirty_and_is_named(tmp_path):
    """Issue 63: ``git_dirty: false`` while an imported plugin was untracked (the commit cannot make the run)."""
    from types import SimpleNamespace

    from dlrecipes.records.provenance import recipe_origin

    repo = _committed(tmp_path / "project", "r.yaml", "kept.py", "changed.py")
    config = SimpleNamespace(origin=str(repo / "r.yaml"))
    files = [str(repo / name) for name in ("kept.py", "changed.py", "new.py")]
    assert recipe_origin(config, files[:2])["git_dirty"] is False
    write(repo / "new.py", "# not committed\n")
    write(repo / "changed.py", "# changed since\n")
    outside = str(write(tmp_path / "other" / "o.py", "# in no repository: its sha256 is all there is\n"))
    made = recipe_origin(config, [*files, outside])
    assert (made["git_dirty"], made["git_uncommitted"]) == (True, files[1:])
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == "M changed.py"  # git_state's part


def test_dlrecipes_own_checkout_is_recorded_apart_from_the_recipes(tmp_path, monkeypatch):
    import dlrecipes
    from dlrecipes.records import provenance

    checkout = Path(dlrecipes.__file__).resolve().parents[1]
    made = provenance.dlrecipes_checkout()
    assert made["dlrecipes_commit"] == _git(checkout, "rev-parse", "HEAD")
    assert made["dlrecipes_dirty"] == bool(_git(checkout, "status", "--porcelain", "--", "dlrecipes"))
    # an installed copy (a site-packages inside some repository, its files untracked there) has no checkout
    installed = tmp_path / "repo" / "site-packages" / "dlrecipes" / "records"
    _committed(tmp_path / "repo", "setup.py")
    write(installed.parent / "__init__.py", "")
    monkeypatch.setattr(provenance, "__file__", str(installed / "provenance.py"))
    assert provenance.dlrecipes_checkout() == {}
    said = provenance.differences(
        {"dlrecipes_commit": "a" * 40, "dlrecipes_dirty": False},
        {"dlrecipes_commit": "b" * 40, "dlrecipes_dirty": True},
    )
    assert said == [f"dlrecipes commit {'b' * 40} (the run had {'a' * 40})", "dlrecipes dirty True (the run had False)"]


def test_trackers_get_the_provenance_as_tags():
    from dlrecipes.loggers.run_record import run_tags

    tags = run_tags(
        {"name": "r"},
        "cpu",
        1,
        {"versions": {"torch": "2.7.0"}, "git_commit": "abc", "git_dirty": True, "plugins": {}, "cuda": None},
    )
    assert tags == {
        "dlrecipes.recipe": "r",
        "dlrecipes.device": "cpu",
        "dlrecipes.world_size": "1",
        "dlrecipes.versions.torch": "2.7.0",
        "dlrecipes.git_commit": "abc",
        "dlrecipes.git_dirty": "true",
    }
