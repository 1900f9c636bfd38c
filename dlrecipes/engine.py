"""Composer's Trainer with a training step that never waits for the device.

Composer 0.32.1's step reads values back from the device five to six times per batch
(``Tensor.item``/``.cpu``), so the host can never queue the next step while the GPU works
and every microsecond of Python is GPU idle time.  :class:`Trainer` keeps Composer's loop,
events, algorithms, checkpoints, loggers and distributed handling, and changes only where values
come from (each override below names the Composer method it replaces):

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
and two gloo processes), and ``scripts/composer_conformance.sh`` runs Composer's own Trainer,
callback and logger tests against this class.  Valid for the pinned Composer 0.32.1.
"""

from __future__ import annotations

import atexit
import contextlib
import copyreg
import datetime
import functools
import itertools
import os
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Optional, Union

import torch
from composer import Trainer as ComposerTrainer
from composer.core import Callback, Engine, Event, State, Time, Timestamp, TimeUnit
from composer.core.precision import Precision, get_precision_context
from composer.distributed import ddp_sync_context
from composer.loggers import Logger, LoggerDestination
from composer.models import ComposerModel
from composer.trainer.trainer import OOM_FOUND_ON_OTHER_RANK, TrainerMode
from composer.utils import dist, ensure_tuple, map_collection, model_eval_mode, reproducibility
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from dlrecipes.core.devices import gpu_available
from dlrecipes.core.distributed import HostReducer, gloo_errors
from dlrecipes.loggers.run_log import MICROBATCH_KEY

COMPOSER_VERSION = "0.32.1"  # the version whose private step methods these overrides follow
_NO_CONTEXT = contextlib.nullcontext()  # reusable
_ENGINE_DEBUG = bool(os.environ.get("ENGINE_DEBUG"))  # Composer's per-event debug lines


def keep_freed_memory_for_reuse() -> bool:
    """Tell glibc's malloc to keep large freed blocks for reuse (CPU training).

    Optimizers and autograd allocate parameter-sized temporaries every step.  glibc returns
    blocks above its (adaptive) mmap threshold to the kernel and faults fresh zeroed pages in
    on the next step; measured on 2 cores, that made AdamW on ResNet-18 2-3x slower in one of
    two identical loops in the same process.  Fixing the threshold at its maximum (32 MiB) and
    not trimming the heap keeps those blocks.  No effect (False) where libc is not glibc.
    """
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20)) and bool(libc.mallopt(m_trim_threshold, 2**30))
    except (OSError, AttributeError):
        return False


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Optimizers that evaluate the loss themselves (SAM's two passes, L-BFGS' line search)."""
    from composer.algorithms.sam import SAMOptimizer

    return isinstance(optimizer, (SAMOptimizer, torch.optim.LBFGS)) or getattr(optimizer, "needs_closure", False)


def batch_plan(loader: Any, length: Optional[int]) -> Optional[list[float]]:
    """Four numbers that fix how many batches this rank's loader gives and the size of each, or None.

    Known for a map-style DataLoader cutting its sampler with a BatchSampler (its sampler's length,
    batch size, drop_last and the number of batches taken) and for loaders that declare
    ``fixed_batches = True`` (dlrecipes' device, tensor-cache and FFCV loaders: batch ``i`` holds
    ``min(batch_size, num_samples - i * batch_size)`` samples).
    """
    count = -1.0 if length is None else float(length)
    if getattr(loader, "fixed_batches", False):
        return [float(loader.num_samples), float(loader.batch_size), 0.0, count]
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return None
    batches = loader.batch_sampler
    if type(batches) is not BatchSampler:
        return None
    try:
        return [float(len(batches.sampler)), float(batches.batch_size), float(batches.drop_last), count]
    except TypeError:  # a sampler without a length
        return None


def _total_loss(loss: Any, device: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss to differentiate and the named parts to log, with Composer 0.32.1's values:
    a dict's ``total`` if it has one, else the sum of the means of its parts.

    Composer adds the means to a new zero tensor; for a single loss tensor that sum is the
    mean itself (0 + x == x exactly), so the common case costs no extra tensor operations.
    """
    if isinstance(loss, torch.Tensor):
        return (loss if loss.dim() == 0 else loss.mean()), {}
    if isinstance(loss, dict) and "total" in loss:
        return loss["total"], dict(loss)
    total = device.tensor_to_device(torch.zeros(size=(1,)))
    parts = list(loss.values()) if isinstance(loss, dict) else list(ensure_tuple(loss))
    for part in parts:
        total.add_(part.mean())
    if isinstance(loss, dict):
        named = dict(loss)
    elif len(parts) > 1:
        named = {f"loss{i}": part for i, part in enumerate(parts)}
    else:
        named = {}
    return total, named


def _logged(part: torch.Tensor, scale: float) -> torch.Tensor:
    """A loss part as Composer logs it: detached, averaged, weighed by the microbatch's share
    (the mean of a 0-d tensor and a product by 1.0 change nothing, so they are skipped)."""
    part = part.detach()
    if part.dim() != 0:
        part = part.mean()
    return part if scale == 1.0 else part * scale


def _detached(outputs: Any) -> Any:
    return map_collection(outputs, lambda t: t.detach() if torch.is_tensor(t) else t)


def _time(value: int, unit: TimeUnit) -> Time:
    """A Time without its constructor's conversions and checks (the value is a counter already)."""
    made = Time.__new__(Time)
    made._value, made._unit = value, unit
    return made


class _Timestamp(Timestamp):
    """Composer's Timestamp with a cheaper step to the next batch.

    Composer's ``to_next_batch`` adds ``Time`` objects and rebuilds the timestamp through its
    validating constructor, about 19 ``Time`` objects and 25 us per batch; this one makes the
    same values directly (``tests/test_engine.py`` compares the two).  Copies stay this class;
    pickled (a callback keeping ``state.timestamp``, a deep copy of the state) it becomes
    Composer's own Timestamp, so the pickle loads without dlrecipes.
    """

    # Composer keys checkpointed objects by class qualname: checkpoints must keep saying "Timestamp"
    __qualname__ = "Timestamp"

    @classmethod
    def of(cls, timestamp: Timestamp) -> "_Timestamp":
        made = Timestamp.__new__(cls)
        made.__dict__.update(timestamp.__dict__)
        return made

    def __reduce_ex__(self, protocol: Any):
        # copyreg's own rebuilder: Timestamp.__new__, then these fields; the pickle names no dlrecipes class
        return copyreg._reconstructor, (Timestamp, object, None), dict(self.__dict__)

    def copy(self, *args: Any, **kwargs: Any) -> "_Timestamp":
        return _Timestamp.of(super().copy(*args, **kwargs))

    def to_next_batch(self, samples: Any = 0, tokens: Any = 0, duration: Optional[datetime.timedelta] = None):
        if type(samples) is not int or type(tokens) is not int:  # Time or float counts: Composer's arithmetic
            return super().to_next_batch(samples, tokens, duration)
        duration = datetime.timedelta(seconds=0) if duration is None else duration
        made = _Timestamp.of(self)
        made._batch = _time(self._batch._value + 1, TimeUnit.BATCH)
        made._batch_in_epoch = _time(self._batch_in_epoch._value + 1, TimeUnit.BATCH)
        made._sample = _time(self._sample._value + samples, TimeUnit.SAMPLE)
        made._sample_in_epoch = _time(self._sample_in_epoch._value + samples, TimeUnit.SAMPLE)
        made._token = _time(self._token._value + tokens, TimeUnit.TOKEN)
        made._token_in_epoch = _time(self._token_in_epoch._value + tokens, TimeUnit.TOKEN)
        made._token_in_iteration = _time(self._token_in_iteration._value + tokens, TimeUnit.TOKEN)
        made._total_wct = self._total_wct + duration
        made._iteration_wct = self._iteration_wct + duration
        made._epoch_wct = self._epoch_wct + duration
        made._batch_wct = duration
        return made


def _quick_counts(spec: Any) -> None:
    """Give a DataSpec that uses Composer's default counting a shortcut for (inputs, targets) pairs.

    Composer's defaults walk the batch with ``isinstance`` checks against typing generics, five
    times per batch in its loop and ours; for a pair of tensors of one length the answer is that
    length (samples) and 0 (tokens, when the dataset has no ``max_seq_len``), as they compute.
    """
    if getattr(spec, "quick_counts", False):
        return
    spec.quick_counts = True
    default_samples = spec._default_get_num_samples_in_batch
    if spec.get_num_samples_in_batch == default_samples:
        def samples(batch: Any) -> int:
            if type(batch) in (tuple, list) and len(batch) == 2:
                x, y = batch
                if type(x) is torch.Tensor and type(y) is torch.Tensor and x.shape[0] == y.shape[0]:
                    return x.shape[0]
            return default_samples(batch)

        spec.get_num_samples_in_batch = samples
    default_tokens = spec._default_get_num_tokens_in_batch
    if spec._get_num_tokens_in_batch == default_tokens and not hasattr(getattr(spec.dataloader, "dataset", None),
                                                                        "max_seq_len"):
        spec._get_num_tokens_in_batch = lambda batch: 0 if type(batch) in (tuple, list) else default_tokens(batch)


class _TrainMetricEpochs(Callback):
    """The train metrics' epoch: reset at its start; at the end of training inside an epoch
    (``max_duration`` in batches), the part trained is computed and logged.

    It holds its Trainer weakly: the state holds the callbacks, and a strong reference back would keep
    the Trainer (its model, optimizers and loaders) alive as long as the state."""

    def __init__(self, trainer: "Trainer"):
        self._trainer = weakref.ref(trainer)

    @property
    def trainer(self) -> "Trainer":
        trainer = self._trainer()
        assert trainer is not None, "the Trainer of these train metrics is gone"
        return trainer

    def epoch_start(self, state: State, logger: Logger) -> None:
        self.trainer.reset_train_metrics()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.trainer.log_train_metrics()


def _forget_models() -> None:
    """Empty torch's cache of parameter names by model (``_get_fqns``, an unbounded ``lru_cache`` keyed by the
    model, filled when Composer reads the state dict for a checkpoint): it keeps every model it saw alive."""
    from torch.distributed.checkpoint import state_dict

    cached = getattr(state_dict, "_get_fqns", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()


def _stop_loader_workers(state: State) -> None:
    """End the worker processes of the run's data loaders (``persistent_workers`` keeps them between epochs).
    Left to the garbage collector, a loader is collected with the Trainer's other objects, in no set order: its
    queues can go first, and each worker's join then waits out torch's 5 s timeout, at a moment of the next
    training in the same process (a notebook, a sweep), while the workers stay alive until then."""
    for loader in [state.train_dataloader, *(evaluator.dataloader.dataloader for evaluator in state.evaluators)]:
        for _ in range(3):  # the loader, and the DataLoader a wrapper of ours holds as .loader (the tensor cache's)
            iterator = getattr(loader, "_iterator", None)  # torch's DataLoader: its workers' iterator, if kept
            if hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()  # what the iterator's __del__ calls, now, with its queues alive
                loader._iterator = None  # a later epoch (trainer.eval after close) starts workers of its own
            loader = getattr(loader, "loader", None)


def _close_at_exit(engine: "weakref.ref[Engine]") -> None:
    """At the process's end, the engine's close (its callbacks' close and post_close) if it is still open."""
    alive = engine()
    if alive is not None and not alive._is_closed:
        alive.close()


class _DirectEngine(Engine):
    """Composer's Engine, dispatching each event only to the callbacks that define a handler for it.

    Composer's ``run_event`` formats a debug line for every callback of every event (printed
    only with ``ENGINE_DEBUG``), compares the event against lists of events several times and
    calls every callback's no-op handlers: about a millisecond per training step.  With the
    profiler on, ``ENGINE_DEBUG`` set, or at INIT, Composer's own ``run_event`` runs.
    """

    _receivers: dict
    _receivers_of: tuple

    def run_event(self, event: Union[Event, str]):
        if not isinstance(event, Event):
            event = Event(event)
        if self.state.profiler is not None or event is Event.INIT or self._is_closed or _ENGINE_DEBUG:
            return super().run_event(event)
        # Composer runs its ordering passes even when no algorithm matches the event
        matched = any(algorithm.match(event, self.state) for algorithm in self.state.algorithms)
        traces = self._run_algorithms(event) if matched else OrderedDict()
        for callback in self.receivers(event):
            callback.run_event(event, self.state, self.logger)
        return traces

    def receivers(self, event: Event) -> list[Callback]:
        """The callbacks with a handler for ``event``: others first, then loggers (Composer's order)."""
        callbacks = self.state.callbacks
        key = tuple(map(id, callbacks))
        if getattr(self, "_receivers_of", None) != key:
            self._receivers, self._receivers_of = {}, key
        found = self._receivers.get(event)
        if found is None:
            def handles(cb: Callback) -> bool:
                kind = type(cb)
                return kind.run_event is not Callback.run_event or getattr(kind, event.value) is not getattr(
                    Callback, event.value
                )

            ordered = [c for c in callbacks if not isinstance(c, LoggerDestination)]
            ordered += [c for c in callbacks if isinstance(c, LoggerDestination)]
            found = self._receivers[event] = [c for c in ordered if handles(c)]
        return found


class Trainer(ComposerTrainer):
    """Composer's Trainer without per-step host-device synchronisation (see the module docstring).

    ``train_metrics_interval``: every how many batches the step's outputs update the train
    metrics (1: every batch; 0: no train metrics).  ``dist_timeout`` (Composer's) also bounds the
    host-side reductions.
    """

    def __init__(self, *args: Any, train_metrics_interval: int = 1, **kwargs: Any):
        self.train_metrics_interval = int(train_metrics_interval)
        self._cuda = gpu_available()
        self._closures: tuple[Any, bool] = (None, False)
        self._logged_microbatch: Any = None
        self._sample_metrics = self._record_metrics = self._metrics_pending = False
        self._sampled_epoch = -1  # the epoch whose batches last updated the train metrics
        self._metric_updates: list[tuple[Any, Any]] = []  # this batch's (batch, outputs), applied once it trained
        self._metric_source: Any = None  # the microbatch list whose first pass is being recorded
        self._metrics_placed: Any = None
        self._same_batches: dict[TrainerMode, bool] = {}  # per mode: the ranks' batch plans agree
        if kwargs.get("device") in (None, "cpu"):
            keep_freed_memory_for_reuse()
        with gloo_errors("the process group (torch.distributed, gloo)"):
            super().__init__(*args, **kwargs)
        self._host = HostReducer(timeout=kwargs.get("dist_timeout", 300.0))
        if self.train_metrics_interval <= 0:
            self.state.train_metrics = {}  # Composer's way of computing none
        self.state.callbacks.insert(0, _TrainMetricEpochs(self))
        self.engine.__class__ = _DirectEngine  # same state; only the dispatch differs
        # Composer's Engine registers its close with the state and logger at exit, and unregisters it only when
        # it is collected unclosed: after close() the hook keeps the state (model, optimizers) until the process
        # ends. This one holds the engine weakly and leaves at close(). (atexit unregisters by function: every
        # Engine's hook goes, and each of ours has its own.)
        atexit.unregister(Engine._close)
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self.engine))
        atexit.register(self._at_exit)

    def close(self) -> None:
        try:
            super().close()
        finally:
            atexit.unregister(self._at_exit)
            _forget_models()
            _stop_loader_workers(self.state)


    # -- the loop itself stays Composer's; its timestamp and batch counting get cheaper --
    def _train_loop(self) -> None:
        self.state.timestamp = _Timestamp.of(self.state.timestamp)
        if self._train_data_spec is not None:
            _quick_counts(self._train_data_spec)
        if not self._resumed_at_an_epochs_end():
            return super()._train_loop()
        with warnings.catch_warnings():  # its epoch has no batch left, only its evaluation: not a broken loader
            warnings.filterwarnings("ignore", message="No batches were trained for global rank")
            return super()._train_loop()

    def _resumed_at_an_epochs_end(self) -> bool:
        """Whether this run resumes from a stop after its epoch's last batch (the epoch's end not yet run)."""
        done, length = int(self.state.timestamp.batch_in_epoch), self.state.dataloader_len
        return done > 0 and length is not None and done >= int(length)

    def _agree_on_batches(self, mode: TrainerMode) -> bool:
        """Whether every rank's loader gives the same number of batches of the same sizes (asked once
        per epoch or evaluation, by every rank at the same point)."""
        if self._host.world_size == 1:
            same = True
        else:
            plan = batch_plan(self.state.dataloader, self.state.dataloader_len)
            mine = [1.0, *plan] if plan is not None else [0.0] * 5
            reduced = self._host.max(mine + [-v for v in mine])  # maxima and minima in one reduction
            same = reduced[0] == 1.0 and -reduced[5] == 1.0 and all(reduced[i] == -reduced[i + 5] for i in range(5))
        self._same_batches[mode] = same
        return same

    def _equal_on_every_rank(self) -> bool:
        """Whether this epoch's training batches are alike on every rank (no per-batch reductions)."""
        return self._host.world_size == 1 or self._same_batches.get(TrainerMode.TRAIN, False)

    # -- the end of the data: Composer all-reduces a device flag and reads it every batch --
    def _iter_dataloader(self, trainer_mode: TrainerMode):
        loader = self.state.dataloader
        assert loader is not None
        length = self.state.dataloader_len
        resumed = trainer_mode == TrainerMode.TRAIN and "train" in self.state.dataset_resumption
        if resumed and length is not None:  # the dataset starts where the checkpoint was: only the rest is left
            length = max(0, int(length) - int(self.state.timestamp.batch_in_epoch))
        iterator = iter(loader) if length is None else itertools.islice(loader, int(length))
        if resumed:
            self._restore_random_state_inside_the_epoch()
        agree = not self._agree_on_batches(trainer_mode)  # ranks may run out at different batches: ask them all
        while True:
            if trainer_mode == TrainerMode.TRAIN:
                self.engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch, finished = next(iterator), 0.0
            except StopIteration:
                if trainer_mode == TrainerMode.TRAIN:
                    self.engine.run_marker_only_event(Event.AFTER_DATALOADER)
                batch, finished = None, 1.0
            if agree:
                finished = self._host.max([finished])[0]  # any rank out of data: every rank stops
            if finished:
                return
            yield batch

    def _restore_random_state_inside_the_epoch(self) -> None:
        """A checkpoint's random state, for a run resumed inside an epoch by a dataset that resumes itself
        (``dlrecipes.data.order``; Composer's ``dataset_resumption``): Composer restores it only at an epoch's
        start or as it spins the loader, so here, with the epoch's iterator made as the uninterrupted run had
        it (making it draws the workers' seed), before the first batch is trained."""
        if self._rng_state is not None and int(self.state.timestamp.batch_in_epoch) > 0:
            reproducibility.load_rng_state(self._rng_state)
            self._rng_state = None

    # -- the optimizer closure: only there to call ``.item()`` on the loss for most optimizers --
    def _use_closures(self) -> bool:
        key = (self.state.precision, self.state.device.dist_backend, tuple(map(id, self.state.optimizers)))
        if self._closures[0] != key:  # asked every batch; the answer changes only with these
            use = super()._use_closures() and any(needs_closure(o) for o in self.state.optimizers)
            self._closures = (key, use)
        return self._closures[1]

    def _precision_context(self):
        """Composer's precision context; on a machine without CUDA its FP32 context does nothing,
        and asking ``torch.cuda.is_available()`` twice per microbatch is what it would cost."""
        state = self.state
        if state.precision is Precision.FP32 and not self._cuda:
            return _NO_CONTEXT
        return get_precision_context(state.precision, state.precision_config)

    # -- one batch: Composer's _train_batch, then the train metrics and the loss log --
    def _train_batch(self, use_grad_scaling: bool):
        state = self.state
        interval = self.train_metrics_interval
        epoch = int(state.timestamp.epoch)
        # each epoch's first batch too, and the first this process trains of an epoch resumed in its middle (its
        # row then has the train metrics every other row has: the terminal's table keeps one header)
        self._sample_metrics = (bool(state.train_metrics) and interval > 0 and (
            int(state.timestamp.batch_in_epoch) % interval == 0 or epoch != self._sampled_epoch))
        if self._sample_metrics:
            self._sampled_epoch = epoch
        self._metric_updates, self._metric_source = [], None
        if state.auto_microbatching or state.device.dist_backend == "xla":
            # Composer's retry loop resets state.train_metrics on every attempt: they accumulate
            # over the epoch here, and this batch's updates wait until it has trained
            hidden, state.train_metrics = state.train_metrics, {}
            try:
                losses = super()._train_batch(use_grad_scaling)
            finally:
                state.train_metrics = hidden
        else:
            losses = self._train_batch_direct(use_grad_scaling)
        self._update_train_metrics()
        if losses:
            self.log_losses(losses)
        return None  # Composer's loop then skips its read-back of the loss

    def _train_batch_direct(self, use_grad_scaling: bool) -> dict[str, torch.Tensor]:
        """Forward, backward and optimizer step of a batch with a fixed microbatch size.

        Composer's version also resets the train metrics, walks every module to look for FSDP
        and reads the CUDA allocator's statistics each batch; those serve its auto-microbatching
        retry loop only.
        """
        state = self.state
        assert self._train_data_spec is not None and state.scaler is not None
        assert state.device_train_microbatch_size is not None
        totals: dict[str, torch.Tensor] = {}  # filled by _train_microbatches
        spec, micro = self._train_data_spec, state.device_train_microbatch_size
        if spec.get_num_samples_in_batch(state.batch) <= micro:  # one microbatch: the batch itself
            microbatches = [state.batch]
        else:
            microbatches = spec.split_batch(state.batch, micro)
        if self._use_closures():  # the optimizer evaluates the loss itself (SAM, L-BFGS)
            for optimizer in state.optimizers:
                # SAM passes its own loss_dict for the second pass; both as in Composer
                def closure(loss_dict=totals, **kwargs):
                    return self._train_microbatches(microbatches, loss_dict, **kwargs)

                if use_grad_scaling:
                    state.scaler.step(optimizer, closure=closure)
                else:
                    optimizer.step(closure=lambda loss_dict=totals, **kw: closure(loss_dict, **kw).item())
        else:
            self._train_microbatches(microbatches, totals)
            for optimizer in state.optimizers:
                if use_grad_scaling:
                    state.scaler.step(optimizer)
                else:
                    optimizer.step()
        if state.device_train_microbatch_size != self._logged_microbatch:
            self._logged_microbatch = state.device_train_microbatch_size
            self.logger.log_metrics({MICROBATCH_KEY: state.device_train_microbatch_size})
        self.first_train_batch_complete = True
        return totals

    # -- the batch size averaged over ranks: Composer reduces it on the device and reads it back --
    def _train_microbatches(self, microbatches, total_loss_dict, ddp_sync: bool = True) -> torch.Tensor:
        """Composer 0.32.1's ``_train_microbatches`` with the batch size counted on the host."""
        assert self._train_data_spec is not None and self.state.scaler is not None
        spec, model = self._train_data_spec, self.state.model
        # the train metrics see the first pass over these microbatches (SAM makes two); a retry
        # after an out-of-memory error splits the batch anew and starts the record again
        first_pass = microbatches is not self._metric_source
        if first_pass:
            self._metric_source, self._metric_updates = microbatches, []
        self._record_metrics = self._sample_metrics and first_pass
        if ddp_sync or not isinstance(model, DistributedDataParallel) or (
            self.state.auto_microbatching and not self.first_train_batch_complete  # see Composer: avoids a deadlock
        ):
            context = contextlib.nullcontext
        else:
            context = model.no_sync
        with context():
            self.engine.run_event(Event.BEFORE_TRAIN_BATCH)
            use_grad_scaling = self._use_grad_scaling(self.state.precision, self.state.scaler)
            for optimizer in self.state.optimizers:
                optimizer.zero_grad(set_to_none=True)
            batch_size = float(sum(map(self._microbatch_size, microbatches)))
            if self.accumulate_train_batch_on_tokens or not self._equal_on_every_rank():
                batch_size = self._host.sum([batch_size])[0] / self._host.world_size
            full_batch = self.state.batch
            for index, microbatch in enumerate(microbatches):
                self.state.batch = spec.microbatch_transforms(self.state.device.batch_to_device(microbatch))
                losses = self._train_microbatch(use_grad_scaling, batch_size, index + 1 == len(microbatches))
                for name, loss in losses.items():  # Composer adds them to zeros: the same sums
                    key = f"loss/train/{name}"
                    previous = total_loss_dict.get(key)
                    total_loss_dict[key] = loss.float() if previous is None else previous + loss
            self.state.batch = full_batch
            self._record_metrics = False
            if use_grad_scaling:  # gradients unscaled before AFTER_TRAIN_BATCH, as Composer does
                for optimizer in self.state.optimizers:
                    self.state.scaler.unscale_(optimizer)
            self.engine.run_event(Event.AFTER_TRAIN_BATCH)
            return total_loss_dict["loss/train/total"]

    def _microbatch_size(self, microbatch) -> int:
        spec = self._train_data_spec
        assert spec is not None
        if self.accumulate_train_batch_on_tokens:
            return spec.get_num_tokens_in_batch(microbatch, token_type="loss_generating")
        return spec.get_num_samples_in_batch(microbatch)

    # -- one microbatch: Composer's, without the deep copy of the batch kept for the metrics --
    def _train_microbatch(self, use_grad_scaling: bool, current_batch_size, is_final_microbatch: bool):
        state = self.state
        batch = state.batch
        labelled = list(batch) if isinstance(batch, (list, tuple)) else batch  # before algorithms change it
        if state.device.dist_backend == "xla":
            losses = super()._train_microbatch(use_grad_scaling, current_batch_size, is_final_microbatch)
        else:
            losses = self._train_microbatch_direct(use_grad_scaling, current_batch_size, is_final_microbatch)
        if self._record_metrics:
            self._metric_updates.append((labelled, self._metric_outputs(labelled)))
        return losses

    def _metric_outputs(self, batch: Any) -> Any:
        """What the train metrics are updated with: the step's outputs, as Composer's ``eval_forward``
        returns them for models that keep ComposerModel's; other models' own ``eval_forward``, run
        in eval mode now (before the optimizer step), as Composer does."""
        state, model = self.state, self._original_model
        if type(model).eval_forward is ComposerModel.eval_forward:
            return _detached(state.outputs)
        with torch.no_grad(), model_eval_mode(state.model), \
                get_precision_context(state.precision, state.precision_config, fp8_autocast_enabled=False):
            return _detached(model.eval_forward(batch, state.outputs))

    def _train_microbatch_direct(self, use_grad_scaling: bool, batch_size: float, is_final: bool):
        """Forward, loss and backward of one microbatch, with Composer's events and arithmetic."""
        state, run = self.state, self.engine.run_event
        size = self._microbatch_size(state.batch)
        if not isinstance(state.model, DistributedDataParallel):
            sync = contextlib.nullcontext()
        elif state.auto_microbatching and not self.first_train_batch_complete:
            sync = contextlib.nullcontext()  # Composer: every microbatch syncs on the first batch
        else:
            sync = ddp_sync_context(state, is_final, self._ddp_sync_strategy)
        with sync:
            run(Event.BEFORE_FORWARD)
            with self._precision_context():
                state.outputs = state.model(state.batch)
            run(Event.AFTER_FORWARD)
            if state.auto_microbatching:
                self._check_other_ranks_oom()
            run(Event.BEFORE_LOSS)
            with self._precision_context():
                state.loss = self._original_model.loss(state.outputs, state.batch)
            run(Event.AFTER_LOSS)
            run(Event.BEFORE_BACKWARD)
            loss, parts = _total_loss(state.loss, state.device)
            scale = size / batch_size
            logged = {name: _logged(part, scale) for name, part in parts.items()}
            logged["total"] = _logged(loss, scale)
            if use_grad_scaling:
                loss = state.scaler.scale(loss)
            if scale != 1.0:  # a microbatch's gradients weigh by its share of the batch
                loss = loss * scale  # not in place: the loss may be the model's own tensor (state.loss)
            loss.backward(create_graph=self._backwards_create_graph)
            run(Event.AFTER_BACKWARD)
        return logged

    def _check_other_ranks_oom(self) -> None:
        """Composer's check after the forward pass with auto microbatching: another rank ran out of
        memory (its flags are read back, as auto microbatching does by design)."""
        device = self.state.device
        found = device.tensor_to_device(torch.tensor([0], dtype=torch.uint8))
        dist.all_reduce(found, reduce_operation="MAX")
        still_in_batch = device.tensor_to_device(torch.tensor([0], dtype=torch.uint8))
        dist.all_reduce(still_in_batch, reduce_operation="MIN")
        if found.item() == 1:
            raise RuntimeError(OOM_FOUND_ON_OTHER_RANK)

    # -- the loss: Composer all-reduces it and reads it back every batch --
    def log_losses(self, losses: dict[str, torch.Tensor]) -> None:
        """Log the step's losses as 0-d device tensors averaged over ranks (no read-back here)."""
        world = self._host.world_size
        if world > 1:
            names = list(losses)
            stacked = torch.stack([losses[k].reshape(()).float() for k in names])
            dist.all_reduce(stacked)  # on the device: NCCL queues it behind the step
            values = dict(zip(names, (stacked / world).unbind()))
        else:
            values = {k: v if v.dim() == 0 else v.reshape(()) for k, v in losses.items()}
        self.state.total_loss_dict = values
        self.logger.log_metrics(values)

    # -- train metrics: updated from the step's outputs, accumulated over the epoch --
    def _update_train_metrics(self) -> None:
        updates, self._metric_updates, self._metric_source = self._metric_updates, [], None
        if not updates:
            return
        metrics = self.state.train_metrics
        placed = (id(metrics), tuple(map(id, metrics.values())))
        if placed != self._metrics_placed:  # new metrics (a callback's, a new fit): onto the model's device
            self.state.train_metrics = self._ensure_metrics_device_and_dtype(metrics)
            self._metrics_placed = (id(self.state.train_metrics), tuple(map(id, self.state.train_metrics.values())))
        with torch.no_grad():
            for batch, outputs in updates:
                for metric in self.state.train_metrics.values():
                    self._original_model.update_metric(batch, outputs, metric)
        self._metrics_pending = True
        self._log_running_train_metrics()

    def _log_running_train_metrics(self) -> None:
        """After a sampled batch, as Composer logs train metrics after every batch: the epoch so far,
        as device tensors (no read-back).  With several processes each rank computes its own running
        value (no collective per step); the value logged at the epoch's end covers every rank."""
        values = {}
        for name, metric in self.state.train_metrics.items():
            if not metric.update_called:
                continue
            syncs = metric._to_sync  # torchmetrics' sync_on_compute
            metric._to_sync = syncs and dist.get_world_size() == 1
            try:
                values[name] = metric.compute()
            finally:
                metric._to_sync = syncs
                metric._computed = None  # the epoch's value is computed afresh, over every rank
        if values:
            self.state.train_metric_values.update(values)
            self.logger.log_metrics({f"metrics/train/{name}": value for name, value in values.items()})

    def reset_train_metrics(self) -> None:
        for metric in (self.state.train_metrics or {}).values():
            metric.reset()
        self._metrics_pending = False

    def log_train_metrics(self) -> None:
        """Compute and log the train metrics updated since the last log (every rank takes part)."""
        if not self._metrics_pending:
            return
        self._metrics_pending = False
        metrics = {name: m for name, m in (self.state.train_metrics or {}).items() if m.update_called}
        if metrics:
            super()._compute_and_log_metrics("train", metrics)

    def _compute_and_log_metrics(self, dataloader_label: str, metrics: dict[str, Any]):
        """Composer computes and logs the train metrics after every batch and at each epoch's end;
        here only at the epoch's end (the call after the last batch of the data)."""
        if dataloader_label != "train":
            return super()._compute_and_log_metrics(dataloader_label, metrics)
        if self._in_batch:  # the per-batch call
            self._in_batch = False
            return None
        return self.log_train_metrics()

    _in_batch = False  # between a batch's step and its BATCH_END: Composer's per-batch metrics call

    # -- samples and wall time: Composer reduces on the device and reads three values --
    def _accumulate_time_across_ranks(self, num_samples, num_tokens: int, batch_time: datetime.timedelta):
        self._in_batch = True
        if self._host.world_size == 1:
            return num_samples, num_tokens, batch_time
        if self._equal_on_every_rank() and not num_tokens and isinstance(num_samples, int):
            return num_samples * self._host.world_size, 0, batch_time  # each rank's own clock
        seconds = batch_time.total_seconds() if self._host.rank == 0 else 0.0
        samples, tokens, seconds = self._host.sum([float(num_samples), float(num_tokens), seconds])
        if abs(samples - round(samples)) > 1e-4 or abs(tokens - round(tokens)) > 1e-4:
            raise ValueError("The sums of samples and tokens across ranks should each be integers.")
        return int(round(samples)), int(round(tokens)), datetime.timedelta(seconds=seconds)
