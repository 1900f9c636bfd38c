"""Metrics, registered by name in :mod:`.registered` (torchmetrics-backed); the end-of-run tables are
:mod:`.report`.

Modules:
- :mod:`.eval_loss`: the evaluation loss, averaged over samples rather than batches
"""

from dlrecipes.metrics import registered  # noqa: F401  (registers the built-ins)
