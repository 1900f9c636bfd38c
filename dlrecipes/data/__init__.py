"""Datasets: built-in factories register themselves in :data:`dlrecipes.registry.datasets`.

A dataset factory takes keyword parameters from the recipe and returns a
:class:`~dlrecipes.data.splits.DatasetSplits` (train and eval datasets yielding
``(image, label)``, the class count and the input shape).
"""

from dlrecipes.data import factories  # noqa: F401  (registers the built-ins)
from dlrecipes.data.splits import DatasetSplits

__all__ = ["DatasetSplits"]
