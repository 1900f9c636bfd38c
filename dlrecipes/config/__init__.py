"""The recipe's schema and the validate stage: a loaded recipe (a nested dict) in, a :class:`RecipeConfig` out.

:func:`validate` (:mod:`.validation`) checks unknown keys, types, required keys, registry names and the parameters of
every named component against its factory's signature.  It builds nothing and imports no torch,
except to ask whether a GPU exists when the recipe wants one (:mod:`dlrecipes.core.devices`).  The parts:
:mod:`.sections` (what a recipe may contain), :mod:`.schema` (the type checker), :mod:`.checks` (components and
cross-field rules), :mod:`.tasks` (tasks), :mod:`.paths` (input paths), :mod:`.device_checks` (what a launch can
run), :mod:`.meanings` (what each key means), :mod:`.resolving` (a recipe file here loaded with its plugins and
validated).
"""

from dlrecipes.config.checks import check_component
from dlrecipes.config.sections import (
    COMPONENT_MAPS,
    COMPONENT_SECTIONS,
    CheckpointConfig,
    Component,
    FinetuneConfig,
    OutputConfig,
    RecipeConfig,
    TaskConfig,
    TrainerConfig,
)
from dlrecipes.config.validation import validate

__all__ = [
    "COMPONENT_MAPS",
    "COMPONENT_SECTIONS",
    "CheckpointConfig",
    "Component",
    "FinetuneConfig",
    "OutputConfig",
    "RecipeConfig",
    "TaskConfig",
    "TrainerConfig",
    "check_component",
    "validate",
]
