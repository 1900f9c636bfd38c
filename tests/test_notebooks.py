"""dlrecipes in a notebook: the shipped notebooks executed in a real Jupyter kernel (nbclient + ipykernel), their
outputs checked, and what a kernel needs from dlrecipes (the top-level API, errors as one line, its state kept)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from .conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# What the tests add around a shipped notebook, in its kernel: the process's state before anything ran ...
BEFORE = """import signal, logging, torch
_state = lambda: ({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)},
                  list(logging.getLogger().handlers), list(logging.getLogger("composer").handlers),
                  torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(), torch.is_grad_enabled())
_before = _state()"""
# ... and after it: the same (printed as JSON for the test to read)
AFTER = """import json
print(json.dumps({"state_kept": _state() == _before, "sigint": str(signal.getsignal(signal.SIGINT))}))"""


def _outputs_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def _tagged(nb, tag: str):
    return next(c for c in nb.cells if tag in c.metadata.get("tags", []))


def _execute(name: str, folder: Path, before: str = BEFORE, after: tuple[str, ...] = (AFTER,)):
    """Run notebooks/<name>.ipynb in a fresh kernel in ``folder`` (the repository's recipes linked there), with
    ``before`` as a first cell and ``after`` as last cells; returns the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    (folder / "recipes").symlink_to(REPO / "recipes")
    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    added = [nbformat.v4.new_code_cell(before)] + [nbformat.v4.new_code_cell(code) for code in after]
    for cell, tag in zip(added, ["test-before", *(f"test-after-{i}" for i in range(len(after)))]):
        cell.metadata["tags"] = [tag]
    nb.cells = [added[0], *nb.cells, *added[1:]]
    nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}, store_widget_state=True
    ).execute()
    return nb


def _no_escape_codes(nb) -> None:
    for cell in nb.cells:
        text = _outputs_text(cell)
        assert "\r" not in text and "\x1b" not in text, (cell.metadata.get("tags"), text[:300])


def _history_rows(html: str) -> int:
    return len(re.findall(r"<tr>\s*<th>\d+</th>", html))  # a DataFrame's rows, each led by its index


def test_shipped_notebooks_carry_no_outputs():
    """Committed notebooks are clean: no outputs, no execution counts (the suite executes them)."""
    assert {p.stem for p in NOTEBOOKS} >= {"quickstart", "own_model"}
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name}: outputs committed"
        assert "widgets" not in nb["metadata"], f"{path.name}: widget state committed"


@pytest.mark.slow
def test_quickstart_notebook_trains_shows_and_reads_back(tmp_path):
    """The quickstart notebook in a real kernel: a progress widget that ends full, an epoch table that grew to 3
    rows, the result's HTML summary, history, figure, evaluation equal to the best epoch, a prediction, an export;
    the kernel's state is as before."""
    check = (
        "import json\n"
        'print(json.dumps({"best_epoch_top1": float(result.history["eval_top1"].max()), '
        '"evaluated": evaluation.metrics["top1"]}))'
    )
    nb = _execute("quickstart", tmp_path, after=(AFTER, check))
    _no_escape_codes(nb)
    train = _tagged(nb, "train")
    kinds = [o.output_type for o in train.outputs]
    assert train.outputs[0].output_type == "stream" and train.outputs[0].text.startswith("run runs/nb-quickstart |")
    widget = next(o for o in train.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bar = next(s["state"] for s in states.values() if s["model_name"] == "FloatProgressModel")
    label = next(s["state"] for s in states.values() if s["model_name"] == "LabelModel")
    assert widget and bar["value"] == 1.0 and bar["bar_style"] == "success" and label["value"].startswith("done: 3")
    table = next(
        o.data["text/html"] for o in train.outputs if "dlrecipes-epochs" in o.get("data", {}).get("text/html", "")
    )
    assert table.count("<tr>") == 4 and ">3/3<" in table  # header + one row per epoch, updated in place
    assert kinds.count("display_data") == 2, kinds  # the widget and the table: no new output per refresh
    summary = train.outputs[-1].data["text/html"]
    assert "TrainResult" in summary and "3 epochs, 66 batches" in summary and "best.pt" in summary
    history = _tagged(nb, "history").outputs[0].data["text/html"]
    assert _history_rows(history) == 3 and "eval_top1" in history and "train_loss" in history
    assert "image/png" in _tagged(nb, "plot").outputs[0].data
    assert re.search(r"true class (\d) \| predicted \d \(0\.\d+\)", _outputs_text(_tagged(nb, "predict")))
    assert "model.torchscript.pt" in _outputs_text(_tagged(nb, "export")) and "passed" in _outputs_text(
        _tagged(nb, "export")
    )
    assert "nb-quickstart" in _outputs_text(_tagged(nb, "runs"))
    kept = json.loads(_outputs_text(_tagged(nb, "test-after-0")))
    assert kept["state_kept"], kept
    checked = json.loads(_outputs_text(_tagged(nb, "test-after-1")))
    assert checked["evaluated"] == checked["best_epoch_top1"] > 0.5, checked  # best.pt is the best epoch's


INTERRUPT = """import os
from dlrecipes.errors import UserError

class Interrupting(SmallNet):
    calls = 0
    def forward(self, x):
        Interrupting.calls += 1
        if Interrupting.calls == 3 and self.training:  # what the kernel's stop button does: SIGINT to the kernel
            os.kill(os.getpid(), signal.SIGINT)
        return super().forward(x)

try:
    dlrecipes.train(recipes / "quickstart.yaml", {"trainer.max_duration": "1ep", "run_name": "own-stop"},
                    model=Interrupting(), train_data=train_set, eval_data=eval_set, quiet=True)
except KeyboardInterrupt as exc:
    print("interrupted:", exc)
resumed = dlrecipes.train(recipes / "quickstart.yaml", {"trainer.max_duration": "1ep", "run_name": "own-stop"},
                          model=Interrupting(), train_data=train_set, eval_data=eval_set, resume=True, quiet=True)
print("resumed batches", resumed.batches, "epochs", list(resumed.history["epoch"]))
try:
    dlrecipes.train(recipes / "quickstart.yaml", "optimizer.lr=0.1")
except UserError as exc:
    print("error:", exc._render_traceback_())"""
# The same recipe trained twice in one kernel: the same numbers (dlrecipes seeds before it builds), shown nowhere.
TWICE = """import json
short = {"trainer.max_duration": "1ep", "trainer.train_subset_num_batches": 3, "trainer.eval_subset_num_batches": 2}
once = dlrecipes.train(recipes / "quickstart.yaml", {**short, "run_name": "twice-1"}, quiet=True)
again = dlrecipes.train(recipes / "quickstart.yaml", {**short, "run_name": "twice-2"}, quiet=True)
timing = ["images_per_sec", "elapsed_sec"]
print(json.dumps({"same": once.history.drop(columns=timing).equals(again.history.drop(columns=timing)),
                  "loss": float(once.history["train_loss"][0])}))"""


@pytest.mark.slow
def test_own_model_notebook_trains_resumes_compares_and_stops_on_interrupt(tmp_path):
    """The your-own-model notebook in a real kernel: a notebook's nn.Module and Dataset trained with a recipe,
    resumed to 4 epochs (each epoch once), a second run compared; then, in the same kernel, SIGINT (the stop
    button) during training stops it with a checkpoint and a KeyboardInterrupt naming it, resume=True finishes it,
    a mistake is one line, the same recipe trained twice gives the same numbers (quiet: no output), and the
    kernel's signal handlers are as before."""
    nb = _execute("own_model", tmp_path, after=(INTERRUPT, TWICE, AFTER))
    _no_escape_codes(nb)
    assert _tagged(nb, "data").outputs[0].data["text/plain"] == "(1437, 360)"
    train = _tagged(nb, "train")
    assert "note: model= replaces the recipe's model: mnist_cnn" in _outputs_text(train)
    assert "object:data" in _outputs_text(train) and "2 epochs" in train.outputs[-1].data["text/html"]
    resumed = _tagged(nb, "resume").outputs[-1].data["text/html"]
    assert _history_rows(resumed) == 4 and "resuming" in _outputs_text(_tagged(nb, "resume"))
    predicted = re.search(
        r"best checkpoint: (\d+) of 360 evaluation digits right \((0\.\d+); best eval top-1 in the "
        r"history: (0\.\d+)\)",
        _outputs_text(_tagged(nb, "predict")),
    )
    assert predicted and predicted.group(2) == predicted.group(3), _outputs_text(_tagged(nb, "predict"))
    compare = _tagged(nb, "compare")
    assert not [o for o in compare.outputs if o.output_type in ("stream", "display_data")]  # quiet=True
    table = compare.outputs[-1].data["text/html"]
    assert "own-a" in table and "own-b" in table and "optimizer.lr" in table
    assert "image/png" in _tagged(nb, "figure").outputs[0].data
    stopped = _outputs_text(_tagged(nb, "test-after-0"))
    assert re.search(r"interrupted: stopped by SIGINT after batch 3 .*checkpoint .*continue with resume=True", stopped)
    assert "resumed batches 22 epochs [1]" in stopped  # 1,437 training images, 64 a batch: 22 batches, once each
    assert 'error: ["RecipeError: overrides: expected a list of key=value strings or a dict, got the string' in stopped
    twice = _tagged(nb, "test-after-1")
    assert json.loads(_outputs_text(twice))["same"] and not [o for o in twice.outputs if o.output_type != "stream"]
    kept = json.loads(_outputs_text(_tagged(nb, "test-after-2")))
    assert kept["state_kept"], kept


def test_objects_of_another_process_are_asked_for_again():
    """A run trained on objects names them in recipe.yaml; a process without them says to pass them again."""
    from dlrecipes.errors import RecipeError
    from dlrecipes.registry import models

    with pytest.raises(
        RecipeError,
        match=r"model\.name: 'object:Net' is a model that was passed to dlrecipes\.train "
        r"as a Python object.*pass it again \(model= of dlrecipes\.train",
    ):
        models.get("object:Net", "model.name")
    assert not any(name.startswith("object:") for name in models.names())


def test_the_progress_display_without_ipywidgets_is_text_replaced_in_place(monkeypatch, capsys):
    """Where ipywidgets is missing, the progress display is a text display updated in place (outside a kernel
    IPython prints each update; in a kernel they replace one output), with no carriage return."""
    pytest.importorskip("IPython")
    import sys

    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    from dlrecipes.loggers.notebook import Progress

    InteractiveShell.instance()  # IPython's display machinery, without a kernel: it prints what it shows
    try:
        progress = Progress()
        progress.show("train epoch 1/2 ━━━━╺      3/10  loss 0.5000", 0.3)
        progress.finish("done: 2 epochs, 20 batches")
    finally:
        InteractiveShell.clear_instance()
    out = capsys.readouterr().out
    assert progress.widget is None and "loss 0.5000" in out and out.rstrip().endswith("done: 2 epochs, 20 batches")
    assert "\r" not in out and "\x1b" not in out


def test_training_restores_the_signal_handlers_it_found():
    """After dlrecipes.train returns (or raises), SIGINT is the handler it was: Composer's Trainer installs its
    own, which would turn a later Ctrl-C into SystemExit."""
    import dlrecipes
    from dlrecipes.errors import UserError

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(UserError, match="overrides: expected a list of key=value strings or a dict, got the string"):
        dlrecipes.train(REPO / "recipes" / "quickstart.yaml", "trainer.max_duration=1ep")
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
def test_a_script_prints_what_the_piped_cli_prints(tiny_recipe, tmp_path):
    """``dlrecipes.train`` in a plain script, piped, prints the report `dlrecipes train` prints into a pipe: the
    same start line and epoch table (the run's name, and the measured speed and time, aside)."""
    from .forked import run

    script = tmp_path / "train_script.py"
    script.write_text(f"import dlrecipes\ndlrecipes.train({str(tiny_recipe)!r}, ['run_name=by-script'])\n")
    by_script = _report_of(run([], tmp_path, env=None, module="train_script"))
    by_cli = _report_of(run(["train", str(tiny_recipe), "run_name=by-cli"], tmp_path))
    assert len(by_cli) == 4 and by_cli[1].startswith("epoch  loss")  # start line, header, two epochs
    assert [line.replace("by-cli", "RUN") for line in by_cli] == [
        line.replace("by-script", "RUN") for line in by_script
    ]


def _report_of(completed) -> list[str]:
    """The report's lines in a process's output (start line and epoch table), speed and time columns blanked."""
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = [line for line in completed.stdout.splitlines() if line.startswith(("run ", "epoch", " ", "1/", "2/"))]
    return [re.sub(r"\s+[\d,]+\s+[\d.]+s$", "  SPEED TIME", line) for line in lines]


@pytest.mark.slow
def test_a_dataloader_and_a_composer_model_are_used_as_they_are(capsys, tmp_path):
    """A DataLoader passed as train_data keeps its batch size (the recipe's is not used), a ComposerModel keeps
    its own loss and metrics, quiet=True prints nothing, and no process group is left behind."""
    import torch
    from composer.models import ComposerClassifier
    from torch.utils.data import DataLoader, TensorDataset

    import dlrecipes

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(96, 1, 4, 4, generator=generator)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long()
    data = TensorDataset(images, labels)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    model = ComposerClassifier(net, num_classes=2)
    result = dlrecipes.train(
        None,
        {
            "trainer.max_duration": "2ep",
            "trainer.batch_size": 64,
            "trainer.num_workers": 0,
            "runs_dir": str(tmp_path / "runs"),
            "run_name": "loader",
        },
        model=model,
        train_data=DataLoader(data, batch_size=12, shuffle=True),
        eval_data=data,
        quiet=True,
    )
    assert result.batches == 2 * 96 // 12 and result.epochs == 2  # the loader's 8 batches an epoch, not 96 // 64
    assert set(result.metrics) >= {"MulticlassAccuracy"}  # the ComposerClassifier's own metric, not top1/top5
    assert list(result.history["epoch"]) == [1, 2] and capsys.readouterr() == ("", "")
    assert not torch.distributed.is_initialized()
    with pytest.raises(Exception, match=r"model=: expected a torch.nn.Module"):
        dlrecipes.train(None, model="resnet18", train_data=data, eval_data=data)
