"""Composer's Trainer with a training step that never waits for the device.

Composer 0.32.1's step reads values back from the device five to six times per batch
(``Tensor.item``/``.cpu``), so the host can never queue the next step while the GPU works
and every microsecond of Python is GPU idle time.  :class:`Trainer` keeps Composer's loop,
events, algorithms, checkpoints, loggers and distributed handling, and changes only where values
come from (each override names the Composer method it replaces):

- **the loss** is logged every batch, as Composer does, but as a 0-d tensor on the device
  (averaged over ranks on the device); a logger reads it when it writes it.  Composer's own
  loggers already take tensors (they get the metrics that way); our terminal and run log read
  the loss every ``trainer.log_interval`` batches, so the steps in between never wait.
- **train metrics** (``state.train_metrics``) are updated from the step's own outputs on every
  ``train_metrics_interval``-th batch (1, Composer's, by default; and the first this process trains of each
  epoch, one resumed in its middle too) once the batch has trained and
  accumulate over the epoch, instead of being reset, updated and synchronised every batch.  After
  each such batch their value so far is logged (device tensors; with several processes, each
  rank's own running value, so no collective per step); at the epoch's end (and at the end of
  training inside an epoch) the value over every rank is computed and logged.  Callbacks that
  read them (early and threshold stoppers on ``train``) see the epoch so far.
- **the end of the data, the batch size averaged over ranks and the sample counts** are host
  numbers.  At the start of each epoch (and evaluation) the ranks compare their loaders' batch
  plans once (:func:`batch_plan`: a DistributedSampler's equal shards, dlrecipes' loaders); when
  they agree, every rank has as many batches of the same sizes, and these numbers need no
  reduction at all.  Otherwise (uneven per-rank data, iterable datasets) a gloo group reduces
  them on the host every batch (:mod:`dlrecipes.core.distributed`); the device is never involved.
- **the optimizer** gets no closure unless it needs one (SAM, L-BFGS): the closure's only other
  effect was a ``loss.item()``.
- Composer's loop is kept, with cheaper parts: the timestamp advances without rebuilding ~19
  ``Time`` objects per batch, (inputs, targets) batches are counted without Composer's generic
  walk, events go only to the callbacks that handle them, and a single loss tensor is
  differentiated without the zero tensor Composer adds it to (the same values).

Auto microbatching keeps Composer's retry loop (its out-of-memory checks read flags back by
design); XLA keeps Composer's microbatch step.  Training itself is unchanged:
``tests/test_engine.py`` checks bit-identical weights against Composer's Trainer (one process
and two gloo processes), and ``scripts/composer_conformance.sh`` runs every Composer test module
that builds a Trainer (and its callback and logger tests) against this class.  Valid for the pinned Composer 0.32.1.

Modules:
- :mod:`.lifecycle`: memory kept for reuse on a CPU; what close frees (exit hook, caches, workers)
"""

from __future__ import annotations

from dlrecipes.engine.counts import QuickTimestamp, quick_counts
from dlrecipes.engine.events import DirectEngine
from dlrecipes.engine.lifecycle import keep_freed_memory_for_reuse
from dlrecipes.engine.loop import batch_plan
from dlrecipes.engine.step import needs_closure
from dlrecipes.engine.trainer import Trainer

COMPOSER_VERSION = "0.32.1"  # the version whose private step methods these overrides follow

__all__ = [
    "COMPOSER_VERSION",
    "DirectEngine",
    "QuickTimestamp",
    "Trainer",
    "batch_plan",
    "keep_freed_memory_for_reuse",
    "needs_closure",
    "quick_counts",
]
