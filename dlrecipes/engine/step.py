"""The step: a batch's microbatches, forward, loss, backward and optimizer step (the closure only where the optimizer
needs one), and the losses logged as device tensors."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from composer.core import Event
from composer.core.precision import Precision, get_precision_context
from composer.distributed import ddp_sync_context
from composer.trainer.trainer import OOM_FOUND_ON_OTHER_RANK
from composer.utils import dist, ensure_tuple
from torch.nn.parallel import DistributedDataParallel

from dlrecipes.loggers.run_log import MICROBATCH_KEY

_NO_CONTEXT = contextlib.nullcontext()  # reusable


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


class Step:
    """The training step without read-backs (a mixin of :class:`dlrecipes.engine.trainer.Trainer`)."""

    # -- the optimizer closure: only there to call ``.item()`` on the loss for most optimizers --
    def _use_closures(self) -> bool:
        """Whether the optimizer step takes a closure: only for optimizers that need one (SAM, L-BFGS), asked again
        only when the precision, backend or optimizers change.

        Replaces ``composer.trainer.trainer.Trainer._use_closures`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_training_is_bit_identical_to_composers_trainer``.
        """
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
        """One batch: Composer's retry loop with auto microbatching or on XLA, else the direct step; then the train
        metrics' updates and the losses logged (returns None: Composer's loop then skips its read-back of the loss).

        Replaces ``composer.trainer.trainer.Trainer._train_batch`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_training_is_bit_identical_to_composers_trainer``.
        """
        state = self.state
        interval = self.train_metrics_interval
        epoch = int(state.timestamp.epoch)
        # each epoch's first batch too, and the first this process trains of an epoch resumed in its middle (its
        # row then has the train metrics every other row has: the terminal's table keeps one header)
        self._sample_metrics = (
            bool(state.train_metrics)
            and interval > 0
            and (int(state.timestamp.batch_in_epoch) % interval == 0 or epoch != self._sampled_epoch)
        )
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
        if losses:  # logged before the train metrics, as Composer's loop logs them
            self.log_losses(losses)
        self._update_train_metrics()
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
        # after every batch, as Composer's (its loggers count the call); the run's log keeps only changes
        self.logger.log_metrics({MICROBATCH_KEY: state.device_train_microbatch_size})
        self.first_train_batch_complete = True
        return totals

    # -- the batch size averaged over ranks: Composer reduces it on the device and reads it back --
    def _train_microbatches(self, microbatches, total_loss_dict, ddp_sync: bool = True) -> torch.Tensor:
        """Composer 0.32.1's ``_train_microbatches`` with the batch size counted on the host.

        Replaces ``composer.trainer.trainer.Trainer._train_microbatches`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_training_is_bit_identical_to_composers_trainer``.
        """
        assert self._train_data_spec is not None and self.state.scaler is not None
        spec, model = self._train_data_spec, self.state.model
        # the train metrics see the first pass over these microbatches (SAM makes two); a retry
        # after an out-of-memory error splits the batch anew and starts the record again
        first_pass = microbatches is not self._metric_source
        if first_pass:
            self._metric_source, self._metric_updates = microbatches, []
        self._record_metrics = self._sample_metrics and first_pass
        if (
            ddp_sync
            or not isinstance(model, DistributedDataParallel)
            or (
                self.state.auto_microbatching and not self.first_train_batch_complete  # see Composer: avoids a deadlock
            )
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
        """One microbatch without the deep copy of the batch Composer keeps for the train metrics (its outputs are
        recorded for them on sampled batches instead).

        Replaces ``composer.trainer.trainer.Trainer._train_microbatch`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_an_out_of_memory_retry_counts_each_batch_once_in_the_train_metrics``.
        """
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
        memory (its flags are read back, as auto microbatching does by design).

        Not an override: the check inline in ``composer.trainer.trainer.Trainer._train_microbatch`` (Composer 0.32.1);
        guarded by ``tests/test_engine.py::test_an_out_of_memory_retry_counts_each_batch_once_in_the_train_metrics``.
        """
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
