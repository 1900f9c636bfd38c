"""Composer's Trainer with a training step that never waits for the device.

Composer 0.32.1's step reads values back from the device five to six times per batch
(``Tensor.item``/``.cpu``), so the host can never queue the next step while the GPU works
and every microsecond of Python is GPU idle time.  :class:`Trainer` keeps Composer's loop,
events, algorithms, checkpoints and distributed handling, and changes only where values
come from (each override below names the Composer line it replaces):

- the end-of-data flag, the batch size averaged over ranks and the sample counts are host
  numbers; with several ranks they are reduced over a host-side (gloo) process group;
- the optimizer gets no closure unless it needs one (SAM, L-BFGS): the closure's only
  other effect was a ``loss.item()``;
- the training loss stays on the device and is reduced, read and logged only every
  ``log_interval`` batches and at the last batch of an epoch;
- train metrics are not computed per batch in eval mode with an extra forward pass:
  every ``train_metrics_interval``-th batch, the step's own outputs (train mode, after
  the batch augmentations) update them against that batch's labels, and they are
  computed and logged once per epoch (``metrics/train/*``);
- Composer's loop itself is kept, with two cheaper parts: the timestamp advances without
  rebuilding ~19 ``Time`` objects per batch, and batches that are (inputs, targets) pairs are
  counted without Composer's generic walk; a single loss tensor is differentiated without the
  zero tensor Composer adds it to (the same values).

Training itself is unchanged: ``tests/test_engine.py`` checks bit-identical weights against
Composer's own Trainer (one process and two gloo processes) and counts the read-backs.
Valid for the pinned Composer 0.32.1 (the test names the version).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
from collections import OrderedDict
from typing import Any, Optional, Union

import torch
from composer import Trainer as ComposerTrainer
from composer.core import Callback, Engine, Event, State, Time, Timestamp, TimeUnit
from composer.loggers import Logger, LoggerDestination
from composer.trainer.trainer import TrainerMode
from composer.core.precision import Precision, get_precision_context
from composer.distributed import ddp_sync_context
from composer.utils import dist, ensure_tuple, map_collection
from torch.nn.parallel import DistributedDataParallel

from dlrecipes.config.devices import HostReducer
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


def _time(value: int, unit: TimeUnit) -> Time:
    """A Time without its constructor's conversions and checks (the value is a counter already)."""
    made = Time.__new__(Time)
    made._value, made._unit = value, unit
    return made


class _Timestamp(Timestamp):
    """Composer's Timestamp with a cheaper step to the next batch.

    Composer's ``to_next_batch`` adds ``Time`` objects and rebuilds the timestamp through its
    validating constructor, about 19 ``Time`` objects and 25 us per batch; this one makes the
    same values directly (``tests/test_engine.py`` compares the two).  Copies stay this class.
    """

    # Composer keys checkpointed objects by class qualname: checkpoints must keep saying "Timestamp"
    __qualname__ = "Timestamp"

    @classmethod
    def of(cls, timestamp: Timestamp) -> "_Timestamp":
        made = Timestamp.__new__(cls)
        made.__dict__.update(timestamp.__dict__)
        return made

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


class _EpochTrainMetrics(Callback):
    """Computes and logs the sampled train metrics at each epoch end, then resets them."""

    def __init__(self, trainer: "Trainer"):
        self.trainer = trainer

    def epoch_end(self, state: State, logger: Logger) -> None:
        self.trainer.log_train_metrics()


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

    ``log_interval``: batches between loss read-backs (and logging).  ``train_metrics_interval``:
    every how many batches the step's outputs update the train metrics (0 = none).
    """

    def __init__(self, *args: Any, log_interval: int = 50, train_metrics_interval: int = 10, **kwargs: Any):
        self.log_interval = max(1, int(log_interval))
        self.train_metrics_interval = int(train_metrics_interval)
        self._host = HostReducer()
        self._sample_metrics = False
        self._logged_microbatch: Any = None
        self._cuda = torch.cuda.is_available()
        self._closures: tuple[Any, bool] = (None, False)
        if kwargs.get("device") in (None, "cpu"):
            keep_freed_memory_for_reuse()
        super().__init__(*args, **kwargs)
        # Composer resets, updates (in eval mode, with a second forward pass), computes and
        # logs state.train_metrics every batch when it is non-empty; an empty dict turns that off.
        self.sampled_train_metrics = self.state.train_metrics if self.train_metrics_interval > 0 else {}
        self.state.train_metrics = {}
        if self.sampled_train_metrics:
            self.state.callbacks.insert(0, _EpochTrainMetrics(self))
        self.engine.__class__ = _DirectEngine  # same state; only the dispatch differs

    # -- the loop itself stays Composer's; its timestamp and batch counting get cheaper --
    def _train_loop(self) -> None:
        self.state.timestamp = _Timestamp.of(self.state.timestamp)
        if self._train_data_spec is not None:
            _quick_counts(self._train_data_spec)
        return super()._train_loop()

    # -- the end of the data: Composer all-reduces a device flag and reads it every batch --
    def _iter_dataloader(self, trainer_mode: TrainerMode):
        loader = self.state.dataloader
        assert loader is not None
        length = self.state.dataloader_len
        iterator = iter(loader) if length is None else itertools.islice(loader, int(length))
        while True:
            if trainer_mode == TrainerMode.TRAIN:
                self.engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch, finished = next(iterator), 0.0
            except StopIteration:
                if trainer_mode == TrainerMode.TRAIN:
                    self.engine.run_marker_only_event(Event.AFTER_DATALOADER)
                batch, finished = None, 1.0
            if self._host.sum([finished])[0] > 0:  # any rank out of data: every rank stops
                return
            yield batch

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

    # -- one batch: Composer 0.32.1's _train_batch without the auto-microbatching retry loop --
    def _train_batch(self, use_grad_scaling: bool):
        ts, state = self.state.timestamp, self.state
        self._sample_metrics = bool(self.sampled_train_metrics) and int(ts.batch) % self.train_metrics_interval == 0
        if state.auto_microbatching:  # its OOM detection reads flags back every batch anyway
            losses = super()._train_batch(use_grad_scaling)
        else:
            losses = self._train_batch_direct(use_grad_scaling)
        last_of_epoch = state.dataloader_len is not None and int(ts.batch_in_epoch) + 1 >= int(state.dataloader_len)
        if losses is not None and ((int(ts.batch) + 1) % self.log_interval == 0 or last_of_epoch):
            self.log_losses(losses)
        return None  # Composer's loop then skips its per-batch loss read-back

    def _train_batch_direct(self, use_grad_scaling: bool) -> dict[str, torch.Tensor]:
        """Forward, backward and optimizer step of a batch with a fixed microbatch size.

        Composer's version also resets the (here empty) train metrics, walks every module to
        look for FSDP and reads the CUDA allocator's statistics each batch; those serve its
        auto-microbatching retry loop only.
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
            batch_size = self._host.sum([float(sum(map(self._microbatch_size, microbatches)))])[0]
            batch_size /= self._host.world_size
            full_batch = self.state.batch
            for index, microbatch in enumerate(microbatches):
                self.state.batch = spec.microbatch_transforms(self.state.device.batch_to_device(microbatch))
                losses = self._train_microbatch(use_grad_scaling, batch_size, index + 1 == len(microbatches))
                for name, loss in losses.items():  # Composer adds them to zeros: the same sums
                    key = f"loss/train/{name}"
                    previous = total_loss_dict.get(key)
                    total_loss_dict[key] = loss.float() if previous is None else previous + loss
            self.state.batch = full_batch
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

    # -- one microbatch: Composer's, without the deep copy of the batch kept for eval-mode metrics --
    def _train_microbatch(self, use_grad_scaling: bool, current_batch_size, is_final_microbatch: bool):
        state = self.state
        batch = state.batch
        labelled = list(batch) if isinstance(batch, (list, tuple)) else batch  # before algorithms change it
        if state.auto_microbatching or state.device.dist_backend == "xla":
            losses = super()._train_microbatch(use_grad_scaling, current_batch_size, is_final_microbatch)
        else:
            losses = self._train_microbatch_direct(use_grad_scaling, current_batch_size, is_final_microbatch)
        if self._sample_metrics:
            with torch.no_grad():
                outputs = map_collection(state.outputs, lambda t: t.detach() if torch.is_tensor(t) else t)
                for metric in self.sampled_train_metrics.values():
                    self._original_model.update_metric(labelled, outputs, metric)
        return losses

    def _train_microbatch_direct(self, use_grad_scaling: bool, batch_size: float, is_final: bool):
        """Forward, loss and backward of one microbatch, with Composer's events and arithmetic."""
        state, run = self.state, self.engine.run_event
        size = self._microbatch_size(state.batch)
        if isinstance(state.model, DistributedDataParallel):
            sync = ddp_sync_context(state, is_final, self._ddp_sync_strategy)
        else:
            sync = contextlib.nullcontext()
        with sync:
            run(Event.BEFORE_FORWARD)
            with self._precision_context():
                state.outputs = state.model(state.batch)
            run(Event.AFTER_FORWARD)
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

    def log_losses(self, losses: dict[str, torch.Tensor]) -> None:
        """Average the step's losses over ranks and log them (one read-back for all of them)."""
        names = list(losses)
        stacked = torch.stack([losses[k].reshape(()).float() for k in names])
        dist.all_reduce(stacked)
        values = (stacked / dist.get_world_size()).cpu().tolist()
        self.state.total_loss_dict = dict(zip(names, values))
        self.logger.log_metrics(self.state.total_loss_dict)

    def log_train_metrics(self) -> None:
        """Compute, log and reset the sampled train metrics (at an epoch end)."""
        values = {}
        for name, metric in self.sampled_train_metrics.items():
            if metric.update_called:
                values[name] = metric.compute()
            metric.reset()
        if values:
            self.state.train_metric_values.update(values)
            self.logger.log_metrics({f"metrics/train/{name}": value for name, value in values.items()})

    # -- samples and wall time: Composer reduces on the device and reads three values --
    def _accumulate_time_across_ranks(self, num_samples, num_tokens: int, batch_time: datetime.timedelta):
        seconds = batch_time.total_seconds() if self._host.rank == 0 else 0.0
        samples, tokens, seconds = self._host.sum([float(num_samples), float(num_tokens), seconds])
        if abs(samples - round(samples)) > 1e-4 or abs(tokens - round(tokens)) > 1e-4:
            raise ValueError("The sums of samples and tokens across ranks should each be integers.")
        return int(round(samples)), int(round(tokens)), datetime.timedelta(seconds=seconds)
