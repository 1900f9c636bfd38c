"""Optimizers and learning-rate schedulers; the built-ins register themselves by name."""

from dlrecipes.optim import optimizers, schedulers  # noqa: F401  (registers the built-ins)
