"""Datasets: factories of :class:`~dlrecipes.data.splits.DatasetSplits`, registered in :mod:`.registered`;
the loaders (torch, on-device, tensor cache, FFCV) and dataset implementations sit beside it.
"""

from dlrecipes.data import registered  # noqa: F401  (registers the built-ins)
from dlrecipes.data.splits import DatasetSplits

__all__ = ["DatasetSplits"]
