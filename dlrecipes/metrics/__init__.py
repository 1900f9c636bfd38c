"""Metrics, registered by name in :mod:`.registered` (torchmetrics-backed); the end-of-run tables are
:mod:`.report`.
"""

from dlrecipes.metrics import registered  # noqa: F401  (registers the built-ins)
