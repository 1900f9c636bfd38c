"""Plugins: entry points, `imports:` in a recipe, `--plugin`, clashes and failing imports."""

from __future__ import annotations

import sys

import pytest

from dlrecipes import plugins, registry
from dlrecipes.errors import PluginError, RecipeError

from .conftest import TINY_RECIPE, run_cli, write

PLUGIN_MODEL = '''
from dlrecipes.registry import models

@models.register("plugin_mlp", input_size=(1, 8, 8))
def plugin_mlp(num_classes: int = 10, in_chans: int = 1, hidden: int = 16):
    """A two-layer perceptron from a plugin file."""
    import torch
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.LazyLinear(hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes)
    )
'''


@pytest.fixture
def isolated_registries(monkeypatch):
    """Let a test register freely; the registries are restored afterwards."""
    for reg in registry.REGISTRIES.values():
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    monkeypatch.setattr(plugins, "_loaded_entry_points", False)


@pytest.mark.slow
def test_recipe_imports_a_local_file_relative_to_the_recipe_and_trains_with_it(tmp_path):
    write(tmp_path / "plugins" / "my_models.py", PLUGIN_MODEL)
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    result = run_cli(
        "train",
        str(recipe),
        "imports=[plugins/my_models.py]",
        "model={name: plugin_mlp, hidden: 8}",
        f"runs_dir={tmp_path}/runs",
        "trainer.max_duration=1ep",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 1 epochs, 3 batches" in result.stderr


def test_cli_plugin_option_imports_a_module(tmp_path):
    write(tmp_path / "my_plugin_pkg" / "__init__.py", PLUGIN_MODEL)
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    # `python -m` puts the working directory on sys.path, as an installed package would be
    result = run_cli(
        "validate",
        str(recipe),
        "model.name=plugin_mlp",
        "~model.width",
        "~model.hidden",
        "--plugin",
        "my_plugin_pkg",
        cwd=tmp_path,
        subprocess_=True,
    )
    assert result.returncode == 0, result.stderr
    listing = run_cli("list", "models", "--plugin", "my_plugin_pkg", cwd=tmp_path, subprocess_=True).stdout
    assert "plugin_mlp" in listing and "A two-layer perceptron" in listing
    without = run_cli("validate", str(recipe), "model.name=plugin_mlp", cwd=tmp_path)
    assert without.returncode == 2 and "unknown model 'plugin_mlp'" in without.stderr


def test_a_failing_plugin_names_itself_and_its_error(tmp_path):
    write(tmp_path / "broken.py", "import not_a_real_module_xyz\n")
    recipe = write(tmp_path / "r.yaml", TINY_RECIPE)
    result = run_cli("validate", str(recipe), "imports=[./broken.py]")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "imports: plugin './broken.py' failed to import: ModuleNotFoundError: No module named 'not_a_real_module_xyz'"
        in result.stderr
    )
    missing = run_cli("validate", str(recipe), "--plugin", "no_such_plugin_module")
    assert missing.returncode == 2 and "--plugin: plugin 'no_such_plugin_module' failed to import" in missing.stderr


def test_two_plugins_claiming_one_name_are_both_named(tmp_path, isolated_registries):
    write(tmp_path / "one.py", PLUGIN_MODEL)
    write(tmp_path / "two.py", PLUGIN_MODEL)
    plugins.import_plugin("one.py", tmp_path, "imports")
    with pytest.raises(
        PluginError, match=r"two models are registered as 'plugin_mlp': one from .*one\.py.*, one from .*two\.py"
    ):
        plugins.import_plugin("two.py", tmp_path, "imports")
    with pytest.raises(PluginError, match="two models are registered as 'cnn_simple'"):
        registry.models.add("cnn_simple", lambda: None, source="a plugin")


def test_entry_points_register_factories_and_modules(tmp_path, monkeypatch, isolated_registries):
    from importlib.metadata import entry_points

    write(
        tmp_path / "ep_plugin" / "__init__.py",
        PLUGIN_MODEL
        + '''

def shout():
    """An optimizer-less callback factory registered by entry point name."""
    from composer.callbacks import LRMonitor
    return LRMonitor()
''',
    )
    dist = tmp_path / "ep_plugin-1.0.dist-info"
    write(dist / "METADATA", "Metadata-Version: 2.1\nName: ep-plugin\nVersion: 1.0\n")
    write(
        dist / "entry_points.txt",
        """
        [dlrecipes.callbacks]
        loud_lr = ep_plugin:shout

        [dlrecipes.models]
        whatever = ep_plugin
    """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    scans = []
    monkeypatch.setattr(plugins, "entry_points", lambda **kw: scans.append(kw) or entry_points(**kw))
    plugins.load_entry_points()
    assert scans == [{}]  # the installed packages read once for all nine groups (each a pass: 0.2 s a command)
    assert "loud_lr" in registry.callbacks and "plugin_mlp" in registry.models
    assert "entry point 'loud_lr' = ep_plugin:shout" in registry.callbacks.get("loud_lr").source
    assert "package ep-plugin" in registry.callbacks.get("loud_lr").source
    sys.modules.pop("ep_plugin", None)


PLUGIN_NETWORK_ALGORITHM = '''
import torch
from composer.core import Algorithm, Event

from dlrecipes.registry import algorithms


class WrapHead(Algorithm):
    """Puts the network's last Linear layer inside a Sequential: its weights' names change
    (fc.weight -> fc.0.weight)."""

    def match(self, event, state):
        return event == Event.INIT

    def apply(self, event, state, logger):
        net = state.model.module
        name = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Linear)][-1]
        parent, _, leaf = name.rpartition(".")
        owner = net.get_submodule(parent) if parent else net
        setattr(owner, leaf, torch.nn.Sequential(getattr(owner, leaf)))


@algorithms.register("wrap_head", changes_network=True)
def wrap_head():
    """Wrap the classifier's last layer (a network-changing plugin algorithm)."""
    return WrapHead()
'''


@pytest.mark.slow
def test_a_plugin_algorithm_that_changes_the_network_is_rebuilt_for_eval(tmp_path):
    """``changes_network=True`` on the registration is all a plugin says: eval rebuilds the trained network with it
    (the checkpoint's weight names are the wrapped network's; loading them into the plain one would fail)."""
    from dlrecipes.builders.trainer import network_algorithms

    write(tmp_path / "wrap_head.py", PLUGIN_NETWORK_ALGORITHM)
    recipe = write(tmp_path / "tiny.yaml", TINY_RECIPE)
    recipe.write_text(recipe.read_text() + f"runs_dir: {tmp_path / 'runs'}\n")
    trained = run_cli(
        "train",
        str(recipe),
        f"imports=[{tmp_path / 'wrap_head.py'}]",
        "algorithms.wrap_head=true",
        "trainer.max_duration=1ep",
        "run_name=wrapped",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    evaluated = run_cli("eval", str(tmp_path / "runs" / "wrapped"), "--checkpoint", "latest", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "top1=" in evaluated.stdout
    plugins.import_plugin("wrap_head.py", tmp_path, "imports")  # the registry says so (the CLI's plugins are gone)
    assert registry.algorithms.get("wrap_head").metadata == {"changes_network": True}
    assert network_algorithms({"wrap_head": {}, "label_smoothing": {}}) == {"wrap_head": {}}
    # ... and a resume cannot drop it (the checkpoint's weights are the wrapped network's)
    from dlrecipes.records.resume_check import check_resume
    from dlrecipes.records.run_files import read_recipe

    without = read_recipe(tmp_path / "runs" / "wrapped")
    del without["algorithms"]["wrap_head"]
    with pytest.raises(RecipeError, match=r"cannot continue it: algorithms\.wrap_head "):
        check_resume(tmp_path / "runs" / "wrapped", without)
