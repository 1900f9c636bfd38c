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
The private attributes of Composer's objects it reads or sets beside its overrides are listed, with what each is for,
in :data:`COMPOSER_PRIVATE` (``tests/test_engine_overrides.py`` holds the list to the code and to Composer).

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

# Composer's private attributes dlrecipes reads or sets, beside the overrides (each override's docstring names the
# method it replaces): what each is used for. tests/test_engine_overrides.py fails when the installed Composer lacks
# one, and when dlrecipes reaches one that is not listed here.
COMPOSER_PRIVATE = {
    "Trainer._train_data_spec": "the training DataSpec the loop and step read batches and counts from",
    "Trainer._rng_state": "a checkpoint's random state, restored inside an epoch for a dataset that resumes itself",
    "Trainer._ddp_sync_strategy": "when DDP syncs gradients across microbatches (the step keeps Composer's choice)",
    "Trainer._original_model": "the ComposerModel whose loss and metrics the step calls (not its DDP wrapper)",
    "Trainer._use_grad_scaling": "whether the step scales the loss (amp_fp16)",
    "Trainer._backwards_create_graph": "whether backward keeps its graph (an algorithm that asks for it)",
    "Trainer._ensure_metrics_device_and_dtype": "train metrics moved to the step's device before their update",
    "Engine._close": "the atexit hook every Engine registers, unregistered for a weakly held one",
    "Engine._is_closed": "whether an engine closed already (the exit hook, the direct engine's events)",
    "Engine._run_algorithms": "an event's algorithms, run by the direct engine as Composer's engine runs them",
    "Timestamp._batch": "a timestamp's counters, advanced in place each batch instead of rebuilt (this and below)",
    "Timestamp._batch_in_epoch": "",
    "Timestamp._sample": "",
    "Timestamp._sample_in_epoch": "",
    "Timestamp._token": "",
    "Timestamp._token_in_epoch": "",
    "Timestamp._token_in_iteration": "",
    "Timestamp._total_wct": "",
    "Timestamp._iteration_wct": "",
    "Timestamp._epoch_wct": "",
    "Timestamp._batch_wct": "",
    "Time._value": "a Time's value and unit, made without its checks for the counters above",
    "Time._unit": "",
    "DataSpec._default_get_num_samples_in_batch": "whether a loader counts samples Composer's generic way",
    "DataSpec._default_get_num_tokens_in_batch": "whether a loader counts tokens Composer's generic way",
    "DataSpec._get_num_tokens_in_batch": "a loader's own token count, kept",
    "CheckpointSaver._save_checkpoint": "a save made atomic (records/checkpoints.py) and called on a stop signal",
    "CheckpointSaver._rotate_checkpoints": "Composer's keep rule, applied after an atomic save",
}

__all__ = [
    "COMPOSER_PRIVATE",
    "COMPOSER_VERSION",
    "DirectEngine",
    "QuickTimestamp",
    "Trainer",
    "batch_plan",
    "keep_freed_memory_for_reuse",
    "needs_closure",
    "quick_counts",
]
