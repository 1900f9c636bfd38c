"""Every parameter explained: the meanings read from factories (dlrecipes.core.param_docs), and every built-in
component's parameters have one."""

from __future__ import annotations

import inspect
from typing import Annotated

import pytest

from dlrecipes import registry
from dlrecipes.core.param_docs import Doc, docstring_args, meanings, summary
from dlrecipes.core.ranges import Range
from dlrecipes.plugins import load_all


def test_docstring_args_reads_google_sections():
    def factory(width: int = 4, depth: int = 2, rate: float = 0.1):
        """A net.

        More words about it.

        Args:
            width (int): channels of the first layer,
                doubled at each stage.
            depth: how many stages.

            rate: the dropout probability.

        Returns:
            the network
        """

    assert docstring_args(inspect.getdoc(factory)) == {
        "width": "channels of the first layer, doubled at each stage.",
        "depth": "how many stages.",
        "rate": "the dropout probability.",
    }
    assert summary(factory.__doc__) == "A net.\n\nMore words about it."


def test_annotated_doc_wins_and_variants_inherit():
    def factory(size: Annotated[int, Range(1), Doc("the side in pixels")] = 8, other: int = 1):
        """F.

        Args:
            size: overridden by the annotation.
            other: from the docstring.
        """

    assert meanings(factory) == {"size": "the side in pixels", "other": "from the docstring."}
    reg = registry.Registry("things", "thing", "anything")
    reg.add("base", factory)
    reg.add_variant("small", of="base", description="A smaller one.", size=2)
    assert reg.get("small").meanings == meanings(factory)


def _builtin(entry: registry.Entry) -> bool:
    return entry.factory.__module__.startswith("dlrecipes.")


@pytest.mark.parametrize("group", list(registry.REGISTRIES))
def test_every_builtin_parameter_has_a_meaning(group):
    load_all()
    missing = [
        f"{entry.name}.{name}"
        for entry in registry.REGISTRIES[group]
        if _builtin(entry)
        for name in entry.parameters
        if not entry.meanings.get(name)
    ]
    assert not missing, f"{group}: parameters without a meaning (an Args: line or a Doc annotation): {missing}"


@pytest.mark.parametrize("group", list(registry.REGISTRIES))
def test_no_meaning_names_a_parameter_that_is_not_there(group):
    """An Args: line for a parameter the factory does not take is a renamed or removed key's leftover."""
    load_all()
    stale = [
        f"{entry.name}.{name}"
        for entry in registry.REGISTRIES[group]
        if _builtin(entry)
        for name in entry.meanings
        if name not in inspect.signature(entry.factory).parameters
    ]
    assert not stale, f"{group}: meanings of parameters the factory does not take: {stale}"


def test_the_meanings_that_said_nothing_say_the_form_the_values_and_the_places():
    """Issue 63: "how often to evaluate", "how often to save", "numeric precision; AMP needs a GPU", "callbacks by
    name" and "where run directories are written" named no unit, no value, no registry, no bucket."""
    from dlrecipes.config.meanings import key_meaning
    from dlrecipes.core.addresses import SCHEMES
    from dlrecipes.core.durations import DURATION_UNITS
    from dlrecipes.core.precision import PRECISIONS
    from dlrecipes.records.store.bucket import STAGING_ENV

    load_all()
    for key in ("trainer.eval_interval", "checkpoint.save_interval"):
        meaning = key_meaning(key)
        assert all(f"{example} (" in meaning for example, _ in DURATION_UNITS.values()), meaning  # every unit's form
        assert "0 and null are refused" in meaning and "at the end of training" in meaning
    precision = key_meaning("trainer.precision")
    assert all(f"{name}: " in precision for name in PRECISIONS) and "needs a GPU with bfloat16 support" in precision
    callbacks = key_meaning("callbacks")
    assert (
        "{name: {params}}" in callbacks
        and "e.g. {early_stopping: " in callbacks
        and "dlrecipes list callbacks" in callbacks
    )
    assert callbacks.endswith("registered: " + ", ".join(registry.callbacks.names()))  # from the registry itself
    runs_dir = key_meaning("runs_dir")
    assert all(f"{scheme}://" in runs_dir for scheme in SCHEMES) and "s3://BUCKET/PREFIX" in runs_dir
    assert f"${STAGING_ENV}" in runs_dir and "staging" in runs_dir
