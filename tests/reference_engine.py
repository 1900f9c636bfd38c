"""A test plugin (``--plugin tests/reference_engine.py`` or ``imports:``) that makes dlrecipes
train with Composer's own Trainer, unchanged, so a test can compare it with ours."""

from __future__ import annotations

from composer import Trainer as ComposerTrainer

import dlrecipes.engine


class ComposerReference(ComposerTrainer):
    """Composer 0.32.1's Trainer; takes (and ignores) the settings only our Trainer has."""

    def __init__(self, *args, train_metrics_interval: int = 1, **kwargs):
        super().__init__(*args, **kwargs)


dlrecipes.engine.Trainer = ComposerReference  # build_trainer imports the name at call time
