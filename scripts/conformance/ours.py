"""pytest plugin: Composer's tests with ``composer.Trainer`` replaced by dlrecipes' engine.

Loaded with ``-p ours`` (this folder on ``PYTHONPATH``) before any test module imports
``Trainer``, so every ``from composer import Trainer`` / ``from composer.trainer import Trainer``
in Composer's test files gets :class:`dlrecipes.engine.Trainer`.
"""

import composer
import composer.trainer
import composer.trainer.trainer

from dlrecipes.engine import Trainer

for module in (composer, composer.trainer, composer.trainer.trainer):
    module.Trainer = Trainer


MARK = f"composer.Trainer is {Trainer.__module__}.{Trainer.__qualname__}"


def pytest_configure(config):
    import sys

    print(MARK, file=sys.stderr)  # scripts/composer_conformance.sh checks the log for it
