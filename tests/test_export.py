"""Export for inference (TorchScript, ONNX) with its check, and the model cards of `list models`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from dlrecipes import registry
from dlrecipes.api import resolve, train
from dlrecipes.callbacks.export_for_inference import (
    ExportMismatchError,
    export_and_verify,
    export_model,
    require_onnx,
    run_exported,
    verify_export,
)
from dlrecipes.errors import RecipeError, UserError

from .conftest import RECIPES, REPO, TINY_RECIPE, run_cli, write

needs_onnx = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")), reason="pip install 'dlrecipes[onnx]'"
)

# the tiny recipe with a model ONNX can export at 8x8 (cnn_simple's 7x7 adaptive pool cannot)
EXPORT_RECIPE = (
    TINY_RECIPE.replace("{name: cnn_simple, width: 4, hidden: 16}", "{name: mnist_cnn, width: 4}")
    + """
    callbacks:
      export: {formats: [torchscript, onnx], batch_size: 1, verify_batch_size: 12}
"""
)


def _tiny_network():
    torch.manual_seed(0)
    return registry.models.build("mnist_cnn", num_classes=10, in_chans=1, width=4).eval()


def _eval_images(config, n: int) -> torch.Tensor:
    from dlrecipes.builders import build_datasets

    data = build_datasets(config.dataset)
    return torch.stack([data.eval[i][0] for i in range(n)])


def _trained_network(config, run_dir):
    """The network as training left it, from the final checkpoint (independently of the export code)."""
    from dlrecipes.builders import build_datasets, model_params

    state = torch.load(run_dir / "checkpoints" / "latest-rank0.pt", map_location="cpu", weights_only=False)
    weights = {k.removeprefix("module."): v for k, v in state["state"]["model"].items()}
    network = registry.models.build(config.model.name, **model_params(config.model, build_datasets(config.dataset)))
    network.load_state_dict(weights)
    return network.eval()


@needs_onnx
@pytest.mark.slow
def test_a_run_writes_both_files_and_they_compute_what_the_trained_model_computes(tmp_path, capsys):
    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE)
    config = resolve(recipe, [f"runs_dir={tmp_path / 'runs'}"])
    result = train(recipe, config=config)
    export_dir = result.run_dir / "export"
    report = json.loads((export_dir / "verify.json").read_text())
    assert report["passed"] and report["inputs"] == {"source": "eval", "shape": [12, 1, 8, 8]}
    assert [(r["format"], r["file"], r["passed"]) for r in report["results"]] == [
        ("torchscript", "model.torchscript.pt", True),
        ("onnx", "model.onnx", True),
    ]
    assert all(0 <= r["max_abs_diff"] <= 1e-4 for r in report["results"])
    assert "export: model.torchscript.pt max |diff|" in capsys.readouterr().err

    # checked here again, not trusting the report: real eval images, a batch size the export did not trace
    network = _trained_network(config, result.run_dir)
    images = _eval_images(config, 20)
    with torch.no_grad():
        expected = network(images)
        scripted = torch.jit.load(str(export_dir / "model.torchscript.pt")).eval()(images)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(export_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    (from_onnx,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    torch.testing.assert_close(scripted, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(from_onnx), expected, atol=1e-4, rtol=1e-4)
    assert session.get_inputs()[0].shape[0] == "batch"  # the dynamic batch axis


@pytest.mark.slow
def test_with_ema_the_averaged_weights_are_exported(tmp_path):
    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE + "\n    algorithms: {ema: {half_life: 1ba}}\n")
    config = resolve(recipe, [f"runs_dir={tmp_path / 'runs'}", "callbacks.export.formats=[torchscript]"])
    result = train(recipe, config=config)
    # checkpoints hold the EMA weights as the model, the training weights in the algorithm's state
    state = torch.load(result.run_dir / "checkpoints" / "latest-rank0.pt", map_location="cpu", weights_only=False)
    (ema,) = [s for name, s in state["state"]["algorithms"] if name == "EMA"]
    assert ema["ema_weights_active"]
    averaged = _trained_network(config, result.run_dir)
    training = _trained_network(config, result.run_dir)
    training_weights = ema["ema_model"]["named_parameters_dict"]
    training.load_state_dict({k.removeprefix("module."): v for k, v in training_weights.items()}, strict=False)
    images = _eval_images(config, 8)
    with torch.no_grad():
        exported = torch.jit.load(str(result.run_dir / "export" / "model.torchscript.pt"))(images)
        torch.testing.assert_close(exported, averaged(images), atol=1e-5, rtol=1e-5)
        assert (exported - training(images)).abs().max() > 1e-3


@needs_onnx
@pytest.mark.slow
def test_a_run_that_never_evaluates_checks_on_training_images(tmp_path):
    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE)
    result = train(recipe, [f"runs_dir={tmp_path / 'runs'}", "trainer.eval_interval=100ep", "checkpoint.monitor=null"])
    report = json.loads((result.run_dir / "export" / "verify.json").read_text())
    assert report["passed"] and report["inputs"] == {"source": "train", "shape": [12, 1, 8, 8]}


@needs_onnx
@pytest.mark.slow
def test_the_digits_export_recipe_trains_and_exports(tmp_path):
    result = train(
        RECIPES / "digits_export.yaml",
        [
            f"runs_dir={tmp_path}/runs",
            "trainer.max_duration=1ep",
            "trainer.train_subset_num_batches=2",
            "trainer.eval_subset_num_batches=1",
            "trainer.progress_bar=false",
            "model.width=4",
        ],
    )
    report = json.loads((result.run_dir / "export" / "verify.json").read_text())
    assert report["passed"] and {r["format"] for r in report["results"]} == {"torchscript", "onnx"}
    assert report["inputs"]["shape"] == [32, 1, 28, 28]
    export = result.run_dir / "export"  # what an image file needs to become an input, and the class names
    spec = json.loads((export / "preprocess.json").read_text())
    assert spec["channels"] == "L" and spec["resize"] == {"size": [28, 28]} and spec["input_shape"] == [1, 28, 28]
    assert json.loads((export / "classes.json").read_text()) == [str(d) for d in range(10)]


@needs_onnx
def test_verify_detects_a_model_that_differs_from_the_file(tmp_path):
    network = _tiny_network()
    images = torch.randn(6, 1, 12, 12)
    for fmt, name in (("torchscript", "m.pt"), ("onnx", "m.onnx")):
        path = export_model(network, fmt, tmp_path / name, images[:1])
        assert verify_export(network, path, fmt, images)["passed"]
        perturbed = _tiny_network()
        with torch.no_grad():
            perturbed.classifier[-1].bias.add_(0.01)
        result = verify_export(perturbed, path, fmt, images, atol=1e-4, rtol=1e-4)
        assert not result["passed"] and result["max_abs_diff"] == pytest.approx(0.01, rel=1e-3)


@needs_onnx
def test_a_mismatch_is_an_error_and_is_recorded(tmp_path, monkeypatch):
    import dlrecipes.callbacks.export_for_inference as export

    def off_by_a_little(path, fmt, inputs):
        return run_exported(path, fmt, inputs) + (1e-2 if fmt == "onnx" else 0.0)

    monkeypatch.setattr(export, "run_exported", off_by_a_little)
    with pytest.raises(
        ExportMismatchError,
        match=r"callbacks.export: the onnx export .*model.onnx disagrees with the "
        r"trained model: max \|diff\| 0.01 on 4 eval images exceeds atol=0.0001",
    ):
        export_and_verify(_tiny_network(), tmp_path, ["torchscript", "onnx"], torch.randn(4, 1, 12, 12))
    report = json.loads((tmp_path / "verify.json").read_text())
    assert not report["passed"] and [r["passed"] for r in report["results"]] == [True, False]
    assert (tmp_path / "model.onnx").exists()  # kept for inspection


@needs_onnx
@pytest.mark.slow
def test_a_mismatch_at_the_end_of_a_run_exits_2_without_traceback(tmp_path, monkeypatch):
    import dlrecipes.callbacks.export_for_inference as exporter

    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE)
    run = exporter.run_exported
    monkeypatch.setattr(
        exporter, "run_exported", lambda path, fmt, inputs: run(path, fmt, inputs) + (0.5 if fmt == "onnx" else 0)
    )
    out = run_cli("train", str(recipe), f"runs_dir={tmp_path}/runs")  # main's exit code and stderr, in this process
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "error: callbacks.export: the onnx export" in out.stderr and "max |diff| 0.5" in out.stderr
    (report,) = (tmp_path / "runs").glob("*/export/verify.json")
    assert json.loads(report.read_text())["passed"] is False


@needs_onnx
def test_export_leaves_the_trained_module_unchanged(tmp_path):
    network = _tiny_network().train()
    before = {k: v.clone() for k, v in network.state_dict().items()}
    export_model(network, "onnx", tmp_path / "m.onnx", torch.randn(1, 1, 12, 12))
    assert network.training
    assert all(torch.equal(before[k], v) for k, v in network.state_dict().items())


def test_missing_onnxruntime_is_named_with_the_install_hint(tmp_path, monkeypatch):
    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now fails
    hint = r"callbacks.export.formats: 'onnx' needs the onnxruntime package: pip install 'dlrecipes\[onnx\]'"
    with pytest.raises(RecipeError, match=hint):
        resolve(recipe)
    with pytest.raises(UserError, match=hint):
        require_onnx()
    resolve(recipe, ["callbacks.export.formats=[torchscript]"])  # TorchScript needs neither package


def test_missing_onnxruntime_exits_2_without_traceback(tmp_path):
    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE)
    probe = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        f"from dlrecipes.cli import main; main(['validate', {str(recipe)!r}])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "pip install 'dlrecipes[onnx]'" in out.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "callbacks.export.formats=[]",
            "callbacks.export.formats: give each of torchscript, onnx at most once, at least",
        ),
        (
            "callbacks.export.formats=[onnx, onnx]",
            "callbacks.export.formats: give each of torchscript, onnx at most once",
        ),
        ("callbacks.export.formats=[tflite]", r"callbacks.export.formats\[0\]: expected one of 'torchscript', 'onnx'"),
        ("callbacks.export.verify_batch_size=0", "callbacks.export.verify_batch_size: must be at least 1, got 0"),
        ("callbacks.export.atol=-1", "callbacks.export.atol: must be 0 or more, got -1"),
    ],
)
def test_export_settings_are_validated(tmp_path, override, message):
    recipe = write(tmp_path / "tiny.yaml", EXPORT_RECIPE)
    with pytest.raises(RecipeError, match=message):
        resolve(recipe, [override])


# --- model cards -------------------------------------------------------------------------------


def _built_parameter_count(name: str) -> int:
    return sum(p.numel() for p in registry.models.build(name).parameters())


@pytest.mark.parametrize("entry", [e for e in registry.models if "param_count" in e.metadata], ids=lambda e: e.name)
def test_declared_parameter_counts_match_the_built_models(entry):
    assert entry.metadata["param_count"] == _built_parameter_count(entry.name)


def test_list_models_shows_input_size_parameter_count_and_pretrained():
    listing = run_cli("list", "models")
    assert listing.returncode == 0, listing.stderr
    header_lines = [line.split("┃")[1:-1] for line in listing.stdout.splitlines() if "┃" in line]
    columns = [" ".join(" ".join(cells).split()) for cells in zip(*header_lines)]  # a header may wrap
    assert columns[:5] == ["name", "description", "input", "param count", "pretrained"]
    rows = _table_rows(listing.stdout)
    assert rows["mnist_cnn"][2:5] == ["1x28x28", f"{_built_parameter_count('mnist_cnn'):,}", "no"]
    assert rows["timm"][2:5] == ["depends on arch (resnet18: 3x224x224)", "depends on arch", "yes: hub or local file"]


def _table_rows(text: str) -> dict[str, list[str]]:
    """A rich table's body rows by first cell, wrapped lines joined."""
    rows: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0]:
            current = rows[cells[0]] = cells
        elif cells and current is not None:  # the row goes on
            current[:] = [f"{a} {b}".strip() for a, b in zip(current, cells)]
    return rows


@needs_onnx
def test_a_model_a_format_cannot_take_fails_at_the_first_batch_not_after_training(tmp_path):
    recipe = write(
        tmp_path / "tiny.yaml",
        TINY_RECIPE
        + """
    callbacks:
      export: {formats: [torchscript, onnx]}
""",
    )
    result = run_cli("train", str(recipe), f"runs_dir={tmp_path}/runs", "run_name=untranslatable")
    assert result.returncode == 2 and "Traceback" not in result.stderr.split("error:")[-1]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: callbacks.export: could not export this model to onnx")
    assert "remove 'onnx' from callbacks.export.formats" in last
    checkpoints = tmp_path / "runs" / "untranslatable" / "checkpoints"
    assert not list(checkpoints.glob("ep*"))  # stopped within the first batch: nothing was trained to lose
