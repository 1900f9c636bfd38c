"""Registries: registration, clashes, lookups, and that every entry is documented."""

from __future__ import annotations

import inspect

import pytest

from dlrecipes import registry
from dlrecipes.errors import PluginError, RecipeError


def test_every_group_is_declared_and_filled():
    assert set(registry.REGISTRIES) == {
        "models",
        "datasets",
        "optimizers",
        "schedulers",
        "algorithms",
        "callbacks",
        "loggers",
        "losses",
        "metrics",
    }
    for reg in registry.REGISTRIES.values():
        assert len(reg) > 0, reg.group


@pytest.mark.parametrize(
    "entry",
    [e for reg in registry.REGISTRIES.values() for e in reg],
    ids=lambda e: e.name,
)
def test_every_entry_has_a_description_and_annotated_keyword_parameters(entry):
    assert entry.description, f"{entry.name} needs a one-line docstring"
    # `list` and the reference pages show the first line: a whole sentence, not one cut where the line wrapped
    assert entry.description.endswith("."), f"{entry.name}: the docstring's first line is not a whole sentence"
    for name, param in entry.parameters.items():
        assert param.annotation is not inspect.Parameter.empty, f"{entry.name}.{name} needs a type annotation"


def test_registering_the_same_name_twice_names_both_sources():
    reg = registry.Registry("things", "thing", "anything")

    @reg.register("x")
    def first():
        """First."""

    def second():
        """Second."""

    with pytest.raises(
        PluginError, match=r"two things are registered as 'x': one from .*test_registry.*, one from my_plugin"
    ):
        reg.add("x", second, source="my_plugin")
    reg.add("x", first)  # the same factory again (a module imported twice) is fine
    assert reg.names() == ["x"]


def test_unknown_names_suggest_and_list():
    reg = registry.Registry("things", "thing", "anything")
    reg.add("alpha", lambda: 1)
    reg.add("beta", lambda: 2)
    with pytest.raises(
        RecipeError, match=r"thing.name: unknown thing 'alpah' \(did you mean 'alpha'\?\)\. Valid things: alpha, beta"
    ):
        reg.get("alpah", key_path="thing.name")


def test_composer_algorithm_wrappers_mirror_composer_signatures():
    import composer.algorithms as ca

    plumbing = {"self", "input_key", "target_key"}  # batch-structure keys fixed for classifiers
    classes = {
        "channels_last": ca.ChannelsLast,
        "label_smoothing": ca.LabelSmoothing,
        "blurpool": ca.BlurPool,
        "ema": ca.EMA,
        "progressive_resizing": ca.ProgressiveResizing,
        "mixup": ca.MixUp,
        "cutmix": ca.CutMix,
        "cutout": ca.CutOut,
        "gradient_clipping": ca.GradientClipping,
        "randaugment": ca.RandAugment,
        "augmix": ca.AugMix,
        "colout": ca.ColOut,
        "sam": ca.SAM,
        "swa": ca.SWA,
        "stochastic_depth": ca.StochasticDepth,
        "squeeze_excite": ca.SqueezeExcite,
        "layer_freezing": ca.LayerFreezing,
        "selective_backprop": ca.SelectiveBackprop,
        "ghost_batchnorm": ca.GhostBatchNorm,
        "weight_standardization": ca.WeightStandardization,
    }
    assert len(classes) == 20
    assert set(classes) <= set(registry.algorithms.names())
    for name, cls in classes.items():
        theirs = {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items() if n not in plumbing}
        ours = {n: p.default for n, p in registry.algorithms.get(name).parameters.items()}
        assert set(ours) == set(theirs), name
        for pname, default in theirs.items():
            if default is not inspect.Parameter.empty:
                assert ours[pname] == default, f"{name}.{pname}"


def test_a_factory_returning_the_wrong_kind_of_object_is_named_with_what_was_expected():
    reg = registry.Registry("things", "thing", "a list of numbers", "builtins.list")
    reg.add("bad", lambda: "not a list", source="my_plugin.py")
    with pytest.raises(TypeError, match=r"thing 'bad' \(my_plugin.py\) returned str, expected a list of numbers"):
        registry.build_component(reg, "bad", {}, "things.bad")
    with pytest.raises(TypeError, match=r"thing 'bad' \(my_plugin.py\) returned str"):
        reg.build("bad")  # the registry's own build goes through the same check
    reg.add("good", lambda size, /: [0] * size, source="my_plugin.py")
    assert registry.build_component(reg, "good", {}, "things.good", size=3) == [0, 0, 0]


def test_registering_with_metadata_the_registry_does_not_read_names_the_keys_it_reads():
    from dlrecipes.errors import PluginError

    reg = registry.Registry("things", "thing", "anything", metadata=("in_memory",))
    with pytest.raises(
        PluginError,
        match=r"thing 'x' from my_plugin.py: unknown registry metadata 'in_memroy' "
        r"\(did you mean 'in_memory'\?\); things read validator, paths, in_memory",
    ):
        reg.add("x", lambda: 1, source="my_plugin.py", in_memroy=True)
    reg.add("y", lambda: 1, source="my_plugin.py", in_memory=True, paths=("root",))
    assert reg.get("y").metadata == {"in_memory": True, "paths": ("root",)}


def test_a_named_variant_is_its_base_factory_with_other_defaults(tiny_recipe):
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    reg = registry.Registry("things", "thing", "a list", metadata=("in_memory",))
    reg.add("base", lambda size=2, fill=0: [fill] * size, source="my_plugin.py", in_memory=True)
    reg.add_variant("ones", of="base", description="Ones.", fill=1)
    entry = reg.get("ones")
    assert entry.parameters["fill"].default == 1 and entry.parameters["size"].default == 2
    assert entry.description == "Ones." and entry.metadata == {"in_memory": True}
    assert reg.build("ones") == [1, 1] and reg.build("ones", fill=3, size=1) == [3]
    # the built-in imagenet100 is imagenet's variant: the same keys, checked with imagenet's types
    variant = registry.datasets.get("imagenet100")
    assert list(variant.parameters) == list(registry.datasets.get("imagenet").parameters)
    assert variant.parameters["subset"].default == "imagenet100"
    with pytest.raises(RecipeError, match=r"dataset.subset: expected one of 'all', 'imagenet100'"):
        resolve(tiny_recipe, ["dataset={name: imagenet100, subset: most}"])


def test_a_callback_factory_gets_the_run_directory_as_a_path_or_as_its_layout(tmp_path):
    """The plugin contract: a positional-only ``run_dir`` is the run directory as a Path (what plugins written
    against it use: ``run_dir / "x"``); ``layout`` is the same directory as a RunDir, which names the run's files
    (the built-ins take it)."""
    from composer.core import Callback

    from dlrecipes.builders import build_callbacks
    from dlrecipes.records.layout import RunDir

    got = {}

    class Seen(Callback):
        pass

    def as_path(run_dir, run=None, /):
        got["path"] = run_dir
        return Seen()

    def as_layout(layout, /):
        got["layout"] = layout
        return Seen()

    registry.callbacks.add("as_path", as_path, source="test")
    registry.callbacks.add("as_layout", as_layout, source="test")
    run = RunDir(tmp_path / "run")
    build_callbacks({"as_path": {}, "as_layout": {}, "best_checkpoint": {}}, run)
    assert type(got["path"]) is type(tmp_path) and got["path"] == run.path
    assert got["layout"] == run and got["layout"].checkpoints == tmp_path / "run" / "checkpoints"
