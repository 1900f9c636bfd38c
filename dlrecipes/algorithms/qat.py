"""Quantization-aware training (QAT): finish training through int8 fake quantization, export int8.

From ``start`` on, the network trains with int8 rounding simulated in its forward pass
(fake quantization, straight-through gradients), so its weights adapt to the precision they
will run at.  Convolutions are fused with the batch norm (and ReLU) after them first; the
fused QAT modules fold the batch-norm scale into the convolution weight before it is
fake-quantized, so what trains is what the int8 model computes.  At the end of the fit the
network is converted to a real int8 model and written as TorchScript.

Why FX graph mode (``prepare_qat_fx`` / ``convert_fx``):

- eager mode needs the model edited by hand: ``QuantStub``/``DeQuantStub`` at its borders,
  ``FloatFunctional`` for every residual addition and a list of module names to fuse, per
  architecture.  FX traces any symbolically traceable network (``cnn_simple``, ``mnist_cnn``,
  the CIFAR ResNets) and finds conv-bn-relu, conv-relu and linear-relu patterns itself;
- PT2E (``torch.export`` + ``prepare_qat_pt2e``) is torch's newer route, but its converted
  model holds quantize/dequantize pairs meant to be lowered by Inductor or ExecuTorch, not a
  standalone int8 file that runs with ``torch.jit.load`` on fbgemm/qnnpack kernels;
- FX keeps the parameter objects: the fused QAT modules are built around the original weight
  and batch-norm tensors (``from_float`` assigns them), so the optimizer, its momentum and the
  schedulers carry on.  :func:`rebind_optimizer` checks that anyway, and moves any parameter
  that was replaced (matched by storage, else by value) so the new module is the one updated.

Written the Composer way: the functions below do the work on a bare ``nn.Module``;
:class:`QAT` only applies them at training events.  It needs a single process: under DDP
the inserted observers would not be synchronised between ranks, so it refuses to run there.
The registered factory lives in :mod:`dlrecipes.algorithms`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from composer.core import Algorithm, Event, State, Time, TimeUnit
from composer.loggers import Logger
from torch import nn

from dlrecipes.errors import RecipeError, first_line

__all__ = [
    "BACKENDS",
    "EXPORT_FILE",
    "REPORT_FILE",
    "RebindReport",
    "check_traceable",
    "prepare_qat",
    "is_qat_prepared",
    "rebind_optimizer",
    "pause_observers",
    "restore_observers",
    "freeze_batchnorm_stats",
    "freeze_observers",
    "convert_to_int8",
    "export_int8",
    "top1_accuracies",
    "QAT",
]

KEY = "algorithms.qat"
BACKENDS = ("x86", "fbgemm", "qnnpack")
EXPORT_FILE = "model_int8.pt"
REPORT_FILE = "model_int8.json"
# Names that only a network prepared for QAT has in its state dict.
_QUANT_KEY_PARTS = ("activation_post_process", "weight_fake_quant")


def _fake_quantizers(net: nn.Module) -> list[nn.Module]:
    from torch.ao.quantization import FakeQuantizeBase

    return [m for m in net.modules() if isinstance(m, FakeQuantizeBase)]


def is_qat_prepared(net: nn.Module) -> bool:
    """Whether ``net`` holds fake-quantization modules."""
    return bool(_fake_quantizers(net))


@contextlib.contextmanager
def quantized_engine(backend: str) -> Iterator[None]:
    """Run int8 kernels of ``backend`` (a process-wide torch setting, restored afterwards)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = backend
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


@contextlib.contextmanager
def _reduce_range_warning_ignored() -> Iterator[None]:
    """torch's own default qconfigs for x86/fbgemm still pass reduce_range, which torch then warns about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Please use quant_min and quant_max")
        yield


def check_traceable(net: nn.Module) -> None:
    """Raise ``ValueError`` naming the cause when torch.fx cannot trace ``net`` (QAT needs the graph)."""
    try:
        torch.fx.symbolic_trace(net)
    except Exception as exc:  # tracing fails with whatever the model's forward raises on proxies
        first = first_line(exc)
        raise ValueError(
            f"{type(net).__name__} cannot be traced by torch.fx ({type(exc).__name__}: {first}); "
            "QAT inserts its observers into the traced graph, so the forward must not branch on tensor values"
        ) from None


def prepare_qat(net: nn.Module, example_inputs: tuple[Any, ...], backend: str = "x86") -> torch.fx.GraphModule:
    """``net`` fused (conv-bn-relu, conv-relu, linear-relu) with fake quantization for ``backend``.

    Returns a new ``GraphModule`` built around ``net``'s own parameter tensors (weights
    per-channel symmetric int8, activations per-tensor uint8: torch's default QAT qconfig).
    """
    from torch.ao.quantization import get_default_qat_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    with _reduce_range_warning_ignored():
        return prepare_qat_fx(net.train(), get_default_qat_qconfig_mapping(backend), example_inputs)


@dataclass
class RebindReport:
    """What :func:`rebind_optimizer` did: parameters kept, moved to a replacement, dropped, added."""

    kept: int = 0
    moved: int = 0
    dropped: int = 0
    added: int = 0


def rebind_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> RebindReport:
    """Make ``optimizer`` update exactly ``model``'s parameters after its modules were swapped.

    Groups keep their order and options (lr, weight decay; what schedulers index by group).
    A parameter that is no longer in ``model`` is replaced by the new parameter sharing its
    storage, else by the first unclaimed new one of equal shape and value, whose optimizer
    state (momentum, Adam moments) it takes over; one without a replacement is dropped.
    New parameters nobody replaced join the first group with fresh state.
    """
    report = RebindReport()
    current = list(model.parameters())
    current_ids = {id(p) for p in current}
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    unclaimed = [p for p in current if id(p) not in in_optimizer]
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            if id(p) in current_ids:
                params.append(p)
                report.kept += 1
                continue
            replacement = _replacement(p, unclaimed)
            state = optimizer.state.pop(p, None)
            if replacement is None:
                report.dropped += 1
                continue
            unclaimed.remove(replacement)
            if state is not None:
                optimizer.state[replacement] = state
            params.append(replacement)
            report.moved += 1
        group["params"] = params
    if unclaimed:
        optimizer.param_groups[0]["params"].extend(unclaimed)
        report.added = len(unclaimed)
    return report


def _replacement(old: torch.Tensor, candidates: list[torch.Tensor]) -> torch.Tensor | None:
    same_shape = [c for c in candidates if c.shape == old.shape and c.dtype == old.dtype]
    for c in same_shape:
        if c.data_ptr() == old.data_ptr():
            return c
    for c in same_shape:  # in registration order, so equal-valued layers pair up in order
        if c.device == old.device and torch.equal(c.detach(), old.detach()):
            return c
    return None


def pause_observers(net: nn.Module) -> list[tuple[nn.Module, torch.Tensor]]:
    """Stop the observers moving the quantization ranges (e.g. for evaluation); returns what to restore."""
    saved = [(m, m.observer_enabled.clone()) for m in _fake_quantizers(net)]
    for m, _ in saved:
        m.disable_observer()
    return saved


def restore_observers(saved: list[tuple[nn.Module, torch.Tensor]]) -> None:
    for m, enabled in saved:
        m.observer_enabled.copy_(enabled)


def freeze_batchnorm_stats(net: nn.Module) -> None:
    """Fused conv-bn modules stop updating their running statistics (and use them when training)."""
    from torch.ao.nn.intrinsic.qat import freeze_bn_stats

    net.apply(freeze_bn_stats)


def freeze_observers(net: nn.Module) -> None:
    """Quantization ranges (scale, zero point) stay as they are for the rest of training."""
    from torch.ao.quantization import disable_observer

    net.apply(disable_observer)


def convert_to_int8(prepared: nn.Module, backend: str = "x86") -> nn.Module:
    """A real int8 copy of a QAT-prepared network, on the CPU (batch norm folded into the convolutions)."""
    from torch.ao.quantization.quantize_fx import convert_fx

    with quantized_engine(backend), _reduce_range_warning_ignored():
        return convert_fx(copy.deepcopy(prepared).cpu().eval())


def export_int8(prepared: nn.Module, example: torch.Tensor, path: Path, backend: str = "x86") -> nn.Module:
    """Convert ``prepared`` to int8 and save it as TorchScript (traced on ``example``) at ``path``.

    Returns the int8 module.  Load the file with ``torch.backends.quantized.engine = backend``
    then ``torch.jit.load(path)``.
    """
    int8 = convert_to_int8(prepared, backend)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with quantized_engine(backend), torch.no_grad():
        torch.jit.save(torch.jit.trace(int8, example.cpu()), str(path))
    return int8


def top1_accuracies(
    models: dict[str, nn.Module], batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, float]:
    """Top-1 accuracy of each CPU model over the same ``(images, labels)`` batches."""
    from torchmetrics.classification import MulticlassAccuracy

    metrics: dict[str, MulticlassAccuracy] = {}
    with torch.no_grad():
        for images, labels in batches:
            for name, model in models.items():
                logits = model(images)
                if name not in metrics:
                    metrics[name] = MulticlassAccuracy(num_classes=logits.shape[1], top_k=1, average="micro")
                metrics[name].update(logits, labels)
    return {name: float(m.compute()) for name, m in metrics.items()}


def _state_dict_bytes(state_dict: dict[str, Any]) -> int:
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    return buffer.tell()


def _network(state: State) -> nn.Module:
    """The bare network inside the ComposerClassifier (refusing a DDP-wrapped model)."""
    if state.is_model_ddp:
        raise RecipeError(f"{KEY}: QAT runs in a single process; train on one device (no DDP)")
    network = getattr(state.model, "module", None)
    if not isinstance(network, nn.Module):
        raise TypeError(
            f"qat needs a Composer model holding its network as `.module`, got {type(state.model).__name__}"
        )
    return network


def _reached(state: State, when: Time) -> bool:
    if when.unit == TimeUnit.DURATION:
        elapsed = state.get_elapsed_duration()
        return elapsed is not None and elapsed >= when
    return state.timestamp.get(when.unit) >= when


def _eval_batches(state: State, limit: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first evaluator's batches, on the CPU, as Composer would transform them."""
    spec = state.evaluators[0].dataloader
    for i, batch in enumerate(spec.dataloader):
        if limit is not None and limit >= 0 and i >= limit:
            return
        batch = spec.microbatch_transforms(spec.batch_transforms(batch))
        images, labels = batch[0], batch[1]
        yield images.cpu(), labels.cpu()


class QAT(Algorithm):
    """Switches the network to fake-quantized training at ``start``; exports int8 at the end of the fit.

    Events: ``INIT`` (refuse DDP; let checkpoints saved after the switch load into the
    prepared network), ``FIT_START`` (the network must be traceable), ``BATCH_START`` (the
    switch, then the optional freezes), ``EVAL_START``/``EVAL_END`` (observers paused so eval
    data never moves the quantization ranges), ``FIT_END`` (int8 export and the report, when
    an ``export_dir`` is given).
    """

    def __init__(
        self,
        start: str = "0.5dur",
        backend: str = "x86",
        freeze_bn: str | None = None,
        freeze_observers: str | None = None,
        export_dir: Path | None = None,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.start = Time.from_timestring(start)
        self.backend = backend
        self.freeze_bn = Time.from_timestring(freeze_bn) if freeze_bn else None
        self.freeze_observers = Time.from_timestring(freeze_observers) if freeze_observers else None
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.started_at: dict[str, int] | None = None
        self.report: dict[str, Any] | None = None
        self._bn_frozen = False
        self._observers_frozen = False
        self._paused: list | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "started_at": self.started_at}  # kept in checkpoints for resumed runs

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started_at = state.get("started_at", self.started_at)

    def match(self, event: Event, state: State) -> bool:
        return event in (
            Event.INIT,
            Event.FIT_START,
            Event.BATCH_START,
            Event.EVAL_START,
            Event.EVAL_END,
            Event.FIT_END,
        )

    def apply(self, event: Event, state: State, logger: Logger) -> int | None:
        if event == Event.INIT:
            from composer.utils import dist

            if dist.get_world_size() > 1:
                raise RecipeError(f"{KEY}: QAT runs in a single process; train on one device (no DDP)")
            _network(state)
            state.model.register_load_state_dict_pre_hook(self._prepare_before_loading(state))
        elif event == Event.FIT_START and not is_qat_prepared(_network(state)):
            try:
                check_traceable(_network(state))
            except ValueError as exc:
                raise RecipeError(f"{KEY}: {exc}") from None
        elif event == Event.BATCH_START:
            self._advance(state, logger)
        elif event == Event.EVAL_START and is_qat_prepared(_network(state)):
            self._paused = pause_observers(_network(state))
        elif event == Event.EVAL_END and self._paused is not None:
            restore_observers(self._paused)
            self._paused = None
        elif event == Event.FIT_END:
            self._export(state, logger)
        return None

    def _switch(self, state: State, example_inputs: tuple[Any, ...]) -> RebindReport:
        prepared = prepare_qat(_network(state), example_inputs, self.backend)
        state.model.module = prepared
        reports = [rebind_optimizer(optimizer, state.model) for optimizer in state.optimizers]
        return RebindReport(*(sum(getattr(r, f) for r in reports) for f in ("kept", "moved", "dropped", "added")))

    def _prepare_before_loading(self, state: State):
        """A checkpoint written after the switch holds observer buffers: prepare before loading it."""

        def hook(module, state_dict, prefix, *args) -> None:
            quantized = any(part in key for key in state_dict for part in _QUANT_KEY_PARTS)
            if quantized and not is_qat_prepared(_network(state)):
                # torch 2.7 does not use prepare's example_inputs (see quantize_fx.prepare_fx)
                self._switch(state, (torch.zeros(1),))

        return hook

    def _advance(self, state: State, logger: Logger) -> None:
        network = _network(state)
        if not is_qat_prepared(network):
            if not _reached(state, self.start):
                return
            inputs = state.batch_get_item(0)
            report = self._switch(state, (inputs[:1],))
            self.started_at = {"epoch": int(state.timestamp.epoch), "batch": int(state.timestamp.batch)}
            logger.log_hyperparameters(
                {
                    "qat/start_epoch": self.started_at["epoch"],
                    "qat/start_batch": self.started_at["batch"],
                    "qat/fake_quantizers": len(_fake_quantizers(state.model.module)),
                    "qat/params_kept": report.kept,
                    "qat/params_moved": report.moved,
                }
            )
            return  # freezes wait for a later batch: observers need at least one batch to see
        if self.freeze_bn is not None and not self._bn_frozen and _reached(state, self.freeze_bn):
            freeze_batchnorm_stats(network)
            self._bn_frozen = True
        if self.freeze_observers is not None and not self._observers_frozen and _reached(state, self.freeze_observers):
            freeze_observers(network)
            self._observers_frozen = True

    def _export(self, state: State, logger: Logger) -> None:
        from composer.utils import dist
        from torch.ao.quantization import disable_fake_quant

        if self.export_dir is None or dist.get_global_rank() != 0:
            return
        network = _network(state)
        if not is_qat_prepared(network):
            warnings.warn(
                f"{KEY}: training ended before start={self.start} was reached; no int8 model was exported", stacklevel=2
            )
            return
        if not state.evaluators:
            warnings.warn(
                f"{KEY}: no eval data to trace and check the int8 model on; it was not exported", stacklevel=2
            )
            return
        limit = state.evaluators[0].subset_num_batches
        example, _ = next(_eval_batches(state, limit))
        path = self.export_dir / EXPORT_FILE
        int8_module = export_int8(network, example, path, self.backend)
        fake_quant = copy.deepcopy(network).cpu().eval()
        freeze_observers(fake_quant)
        no_fake_quant = copy.deepcopy(fake_quant).apply(disable_fake_quant)
        with quantized_engine(self.backend):
            int8 = torch.jit.load(str(path))  # the file as written, not the module it came from
            top1 = top1_accuracies(
                {"fake_quant": fake_quant, "fp32_no_fake_quant": no_fake_quant, "int8": int8},
                _eval_batches(state, limit),
            )
        fp32_weights = {k: v for k, v in network.state_dict().items() if not any(p in k for p in _QUANT_KEY_PARTS)}
        self.report = {
            "backend": self.backend,
            "qat_started_at": self.started_at,
            "top1": top1,
            "int8_minus_fake_quant": top1["int8"] - top1["fake_quant"],
            "bytes": {
                "fp32_state_dict": _state_dict_bytes(fp32_weights),
                "int8_state_dict": _state_dict_bytes(int8_module.state_dict()),
                "int8_torchscript": path.stat().st_size,
            },
            "file": EXPORT_FILE,
            "load": f"torch.backends.quantized.engine = '{self.backend}'; torch.jit.load('{EXPORT_FILE}')",
        }
        (self.export_dir / REPORT_FILE).write_text(json.dumps(self.report, indent=2) + "\n")
        logger.log_metrics({f"qat/top1/{name}": value for name, value in top1.items()})
        print(
            f"qat: int8 model written to {path} ({path.stat().st_size / 1024:.0f} KiB); eval top-1 "
            f"int8 {top1['int8']:.2%}, fake-quant fp32 {top1['fake_quant']:.2%}",
            file=sys.stderr,
        )
