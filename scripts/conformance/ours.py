"""pytest plugin: Composer's tests with ``composer.Trainer`` replaced by dlrecipes' engine.

Loaded with ``-p ours`` (this folder on ``PYTHONPATH``) before any test module imports
``Trainer``, so every ``from composer import Trainer`` / ``from composer.trainer import Trainer``
in Composer's test files gets :class:`dlrecipes.engine.Trainer`.
"""

import composer
import composer.trainer
import composer.trainer.trainer

import dlrecipes.engine
from dlrecipes.engine import Trainer

for module in (composer, composer.trainer, composer.trainer.trainer):
    module.Trainer = Trainer


# the name the package exports it under (the class itself lives in dlrecipes.engine.trainer)
MARK = (
    f"composer.Trainer is dlrecipes.engine.{Trainer.__qualname__}"
    if composer.Trainer is dlrecipes.engine.Trainer
    else f"composer.Trainer is {composer.Trainer.__module__}.{composer.Trainer.__qualname__}"
)


def pytest_configure(config):
    import sys

    print(MARK, file=sys.stderr)  # scripts/composer_conformance.sh checks the log for it
