"""80 columns for `list`, `compare`, `runs` and the lines of `eval`, `predict` and `export` (issue 34): in a
pseudo-terminal 80 columns wide nothing runs past the edge and nothing is cut (no "…", every value still shown), the
recipe keys that differ first in `compare`; piped, the lines stay whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import TINY_RECIPE, run_cli, write
from .test_terminal import _in_pty, _on_screen

COLUMNS = 80
LONG_RUN = "quickstart-20261125-074646-2"  # a default run name: the recipe, the date, a suffix


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two tiny runs, one batch an epoch, whose recipes differ in trainer.max_duration and optimizer.lr."""
    root = tmp_path_factory.mktemp("narrow")
    recipe = write(root / "tiny.yaml", TINY_RECIPE)
    common = ["trainer.train_subset_num_batches=1", "trainer.eval_subset_num_batches=1", f"runs_dir={root / 'runs'}"]
    for name, duration, lr in (("a", "1ep", "0.05"), (LONG_RUN, "2ep", "0.1")):
        result = run_cli(
            "train", str(recipe), *common, f"run_name={name}", f"trainer.max_duration={duration}", f"optimizer.lr={lr}"
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return root / "runs"


def _screen(args: list[str], base: Path, expect: int = 0) -> list[str]:
    """The lines ``dlrecipes ARGS`` leaves on an 80-column terminal, checked to fit, counting the tests' own
    temporary folder ``base`` (which a path on a line may start with, longer than most real ones) as empty."""
    lines = _on_screen(_in_pty(args, COLUMNS, expect=expect))
    for line in lines:
        assert len(line.replace(f"{base}/", "")) <= COLUMNS, line
    assert not any("…" in line for line in lines), "\n".join(lines)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _words(text: str) -> set[str]:
    """The values in a table's text: what is between its borders and spaces."""
    return set(re.split(r"[\s│┃┏┓┗┛┡┩└┘┳┻╇┴━─]+", text)) - {""}


@pytest.mark.slow
def test_compare_keeps_the_differing_keys_first_and_every_column(runs, tmp_path_factory):
    """At 80 columns compare dropped trainer.max_duration; now the table goes on below instead, the run
    repeated, and every value the piped (250-column) table holds is on the screen."""
    dirs = [str(runs / "a"), str(runs / LONG_RUN)]
    lines = _screen(["compare", *dirs], tmp_path_factory.getbasetemp())
    header = next(line for line in lines if line.startswith("┃ run "))
    cells = [cell.strip() for cell in header.split("┃")[1:-1]]
    assert cells[0] == "run" and set(cells[1:3]) == {"trainer.max_duration", "optimizer.lr"}, cells
    piped = run_cli("compare", *dirs)
    assert piped.returncode == 0 and len(piped.stdout.splitlines()[1]) > COLUMNS  # too wide for one table
    assert _words(piped.stdout) <= _words("\n".join(lines)), _words(piped.stdout) - _words("\n".join(lines))
    assert sum(line.startswith("┏") for line in lines) >= 2  # a second table, not a cut one


@pytest.mark.slow
def test_runs_shows_every_column_of_a_long_run_name(runs, tmp_path_factory):
    lines = _screen(["runs", str(runs)], tmp_path_factory.getbasetemp())
    piped = run_cli("runs", str(runs))
    assert piped.returncode == 0 and max(len(line.rstrip()) for line in piped.stdout.splitlines()) > COLUMNS
    assert _words(piped.stdout) <= _words("\n".join(lines))
    assert sum(line.startswith("run ") for line in lines) == 2  # two tables, each headed by the run


@pytest.mark.slow
def test_eval_predict_and_export_lines_fit(runs, tmp_path, tmp_path_factory):
    from PIL import Image

    base = tmp_path_factory.getbasetemp()
    evaluated = _screen(["eval", str(runs / LONG_RUN), "--out", str(tmp_path / "report")], base)
    assert evaluated[0] == f"eval {runs / LONG_RUN / 'checkpoints' / 'best.pt'}:"
    assert re.fullmatch(r"  loss=\S+, top1=\S+, top5=\S+", evaluated[1]) and "img/s" in evaluated[2]
    report = f"  report {tmp_path / 'report'}"
    if len(report) > COLUMNS:  # the tests' temporary path is too long for the line: it goes on the next
        assert evaluated[3] == "  report" and evaluated[4].strip() == str(tmp_path / "report"), evaluated
    else:
        assert evaluated[3] == report, evaluated
    piped = run_cli("eval", str(runs / LONG_RUN), "--out", str(tmp_path / "report"))
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1 and "top1=" in piped.stdout

    photo = tmp_path / "a_photo_with_a_long_descriptive_name.png"
    Image.new("L", (8, 8), 200).save(photo)
    predicted = _screen(["predict", str(runs / LONG_RUN), str(photo), "--top-k", "10"], base)
    start = predicted.index(str(photo))  # the path alone, the classes below it
    classes = " ".join(predicted[start + 1 : -1]).split()
    assert sorted(classes[::2]) == [str(d) for d in range(10)] and all(
        re.fullmatch(r"0\.\d{3}", p) for p in classes[1::2]
    )
    assert predicted[-1] == "1 predicted, 0 skipped"

    exported = _screen(["export", str(runs / LONG_RUN), "--out", str(tmp_path / "export")], base)
    assert exported[0] == "export: passed vs the trained model on 8 eval images"
    assert exported[1] == "  (atol 0.0001, rtol 0.0001)" and re.fullmatch(
        r"  model.torchscript.pt max \|diff\| \S+", exported[2]
    )
    assert exported[3:] == [f"  {tmp_path / 'export'}", str(tmp_path / "export")]


@pytest.mark.parametrize("columns", [COLUMNS, 200])
def test_list_models_shows_every_card_and_parameter(columns):
    """At 80 columns the model table cut the pretrained and parameter columns; now each model is a block of
    lines there, and a table where it fits (200 columns)."""
    from dlrecipes.api import registries
    from dlrecipes.tools.describe import describe_parameters, model_card

    lines = _on_screen(_in_pty(["list", "models"], columns))
    assert all(len(line) <= columns for line in lines) and not any("…" in line for line in lines)
    text = " ".join(" ".join(lines).split())
    (models,) = registries("models")
    for entry in models:
        for value in [
            *model_card(entry).values(),
            *(f"{p}: {t} = {d}" for p, t, d in describe_parameters(models, entry.name)),
        ]:
            if columns == COLUMNS:  # in a table, a value may wrap inside its cell
                assert " ".join(value.split()) in text, (entry.name, value)
    assert ("┏" in "".join(lines)) == (columns == 200)


def test_column_groups_fill_each_table_and_leave_none_out():
    from dlrecipes.tools.describe import column_groups

    columns = [("run", "run"), ("a", "a"), ("b", "b"), ("c", "c"), ("d", "d")]
    rows = [["r" * 10, "x" * 20, "y" * 20, "z" * 20, "w" * 5]]
    groups = column_groups(columns, rows, [0, 3, 1, 2, 4], width=60)
    assert groups == [[0, 3, 1], [0, 2, 4]]  # 1 + (13 + 23 + 23) = 60 fits; then b and d
    assert column_groups(columns, rows, [0, 1, 2, 3, 4], width=250) == [[0, 1, 2, 3, 4]]
    assert column_groups(columns, rows, [0, 1, 2, 3, 4], width=10) == [[0, 1], [0, 2], [0, 3], [0, 4]]


def test_format_comparison_at_80_columns_keeps_every_setting():
    """Many differing keys: each is shown, the first right after the run, each table fitting 80 columns."""
    from dlrecipes.tools.describe import format_comparison

    settings = {f"optimizer.setting_number_{i}": [0.1 * i, 0.2 * i] for i in range(5)}
    summaries = [
        {
            "run": f"run-{n}",
            "status": "finished",
            "recipe": "recipes/quickstart.yaml",
            "precision": "fp32",
            "batch_size": 64,
            "wall_time_sec": 12.5,
            "images_per_sec": 1234.5,
            "best_top1": 0.9876,
            "epochs": 12,
            "settings": {k: v[n] for k, v in settings.items()},
        }
        for n in range(2)
    ]
    lines = format_comparison(summaries, None, width=COLUMNS).splitlines()
    assert all(len(line) <= COLUMNS for line in lines) and not any("…" in line for line in lines)
    headers = [cell.strip() for line in lines if line.startswith("┃") for cell in line.split("┃")[1:-1]]
    assert headers[1] == "optimizer.setting_number_0"
    assert set(settings) | {"best top-1", "img/s", "wall s", "recipe", "epochs"} <= set(headers)
