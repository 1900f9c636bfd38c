"""A census of what a training step would make a GPU wait for, taken on the CPU.

:class:`SyncCensus` is a Composer callback.  From the end of batch ``start`` to the end of batch
``stop`` it records, with where each came from:

- **read-backs**: ``Tensor.item/cpu/tolist/numpy`` and tensor -> ``bool/float/int`` conversions
  called from Python, and every ``aten._local_scalar_dense`` (the same, from C++) or op whose output
  size depends on the data (``nonzero``, boolean-mask indexing, ``unique``...), seen by a dispatch
  mode;
- **mode switches**: ``nn.Module.train``/``eval`` calls;
- **blocking copies**: ``Tensor.to``/``Tensor.cuda`` onto a device without ``non_blocking=True``, called
  from outside torch (torch's own ``.to(device)`` calls, as in ``clip_grad_norm_``, move device tensors
  to the device they are on: no copy).
  Composer's CPU device moves batches with a plain ``.to``; during the census it moves them as its
  GPU device does (``non_blocking=True``), so what remains is the step's own.

On the CPU every tensor is a host tensor, so what reads back a tensor that a GPU run keeps on the
host too is not counted (``HOST_SIDE``, each with its reason), nor ``F.one_hot``'s check of the labels'
range, which only a CPU makes (with ``num_classes`` given, CUDA leaves it to the scatter's device assert).

On a GPU each read-back waits for every kernel queued before it; each is a step the CPU cannot
queue ahead.  Whole training steps are counted: data loading in this process, algorithms,
callbacks, loggers and the loop's bookkeeping.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter

import torch
from composer.core import Callback
from torch.utils._python_dispatch import TorchDispatchMode

READ_BACKS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
DATA_DEPENDENT = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::unique_dim",
    "aten::_unique2",
    "aten::_unique",
    "aten::unique_consecutive",
    "aten::repeat_interleave.Tensor",
    "aten::bincount",
    "aten::histc",
    "aten::masked_scatter",
}


# (file, function) of a frame on the stack -> why what it reads back is a host tensor in a GPU run too
HOST_SIDE = {
    ("torch/utils/data/_utils/fetch.py", "fetch"): "a DataLoader's samples, made on the host (in workers or here)",
    ("torch/optim/optimizer.py", "_get_value"): "an optimizer's step counter, kept on the host unless capturable",
    ("timm/optim/_helpers.py", "_get_value"): "a timm optimizer's step counter, made on the host (device='cpu')",
    (
        "composer/algorithms/blurpool/blurpool_layers.py",
        "_padding_for_filt_2d_same",
    ): "int(torch.div(h, 2)) of two Python ints: a tensor made on the host",
    ("composer/algorithms/colout/colout.py", "colout_batch"): "torch.randperm of the image's side, made on the host",
    ("dlrecipes/algorithms/augment_policy.py", "_binned"): "torchvision's magnitude table, a linspace made on the host",
}
_HOST_FUNCTIONS = {name for _, name in HOST_SIDE}


def _host_side() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _HOST_FUNCTIONS and any(
            code.co_filename.endswith(path) and code.co_name == name for path, name in HOST_SIDE
        ):
            return True
        frame = frame.f_back
    return False


def _where() -> str:
    """The innermost frame outside torch and this file: the code that asked."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("sync_census.py"):
            return f"{frame.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{frame.lineno} {frame.name}"
    return "?"


class _DataDependentOps(TorchDispatchMode):
    def __init__(self, census: SyncCensus):
        super().__init__()
        self.census = census

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if (
            name.split(".")[0] in DATA_DEPENDENT
            or name in DATA_DEPENDENT
            or (
                name.startswith("aten::index")
                and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool
                    for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())
                )
            )
        ):
            self.census.record(f"op {name}")
        return func(*args, **(kwargs or {}))


class SyncCensus(Callback):
    """What steps ``start+1`` to ``stop`` read back, switch or copy: ``found`` counts ``"kind name @ where"``."""

    def __init__(self, start: int = 3, stop: int = 20):
        self.start, self.stop = start, stop
        self.found: Counter = Counter()
        self.active = self.installed = False
        self.batches_seen: list[int] = []
        self._mode = _DataDependentOps(self)
        self._mode_on = False
        self._cpu_only = 0  # inside a check that only a CPU makes

    def record(self, what: str) -> None:
        if self.active and not self._cpu_only:
            self.active = False  # what _where itself calls is not counted
            try:
                if not _host_side():
                    self.found[f"{what} @ {_where()}"] += 1
            finally:
                self.active = True

    def summary(self) -> str:
        return "\n".join(f"{n} x {what}" for what, n in self.found.most_common()) or "nothing"

    # -- installing and removing the patches --
    def _install(self) -> None:
        from composer.devices import DeviceCPU

        census = self
        self._originals = {name: getattr(torch.Tensor, name) for name in READ_BACKS + ("to", "cuda")}
        for name in READ_BACKS:

            def counted(tensor, *args, __name=name, __original=self._originals[name], **kwargs):
                census.record(f"read-back Tensor.{__name}")
                return __original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)

        def to(tensor, *args, __original=self._originals["to"], **kwargs):
            moves = any(isinstance(a, (torch.device, str)) for a in args) or "device" in kwargs
            if (
                moves
                and "/torch/" not in sys._getframe(1).f_code.co_filename
                and not kwargs.get("non_blocking")
                and not (len(args) > 1 and isinstance(args[1], bool) and args[1])
            ):
                census.record("blocking copy Tensor.to")
            return __original(tensor, *args, **kwargs)

        def cuda(tensor, *args, __original=self._originals["cuda"], **kwargs):
            if not kwargs.get("non_blocking"):
                census.record("blocking copy Tensor.cuda")
            return __original(tensor, *args, **kwargs)

        torch.Tensor.to, torch.Tensor.cuda = to, cuda
        self._train = torch.nn.Module.train

        def train(module, mode=True, __original=self._train):
            census.record(f"mode switch {type(module).__name__}.train({mode})")
            return __original(module, mode)

        torch.nn.Module.train = train
        self._one_hot = torch.nn.functional.one_hot

        def one_hot(tensor, num_classes=-1, __original=self._one_hot):
            cpu_only = num_classes > 0 and tensor.device.type == "cpu"
            census._cpu_only += cpu_only
            try:
                return __original(tensor, num_classes)
            finally:
                census._cpu_only -= cpu_only

        torch.nn.functional.one_hot = one_hot
        self._to_device = DeviceCPU.tensor_to_device
        DeviceCPU.tensor_to_device = lambda device, tensor: tensor.to(device._device, non_blocking=True)
        self.installed = True

    def uninstall(self) -> None:
        self.active = False
        if self._mode_on:
            self._mode.__exit__(None, None, None)
            self._mode_on = False
        if not self.installed:
            return
        from composer.devices import DeviceCPU

        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        torch.nn.Module.train = self._train
        torch.nn.functional.one_hot = self._one_hot
        DeviceCPU.tensor_to_device = self._to_device
        self.installed = False

    # -- Composer's events --
    def fit_start(self, state, logger) -> None:
        self._install()

    def batch_end(self, state, logger) -> None:
        batch = int(state.timestamp.batch)
        self.batches_seen.append(batch)
        if batch == self.start:
            self._mode.__enter__()
            self._mode_on, self.active = True, True
        elif batch == self.stop:
            self.uninstall()

    def epoch_end(self, state, logger) -> None:
        if self.active:  # the window must lie inside one epoch: an epoch's end evaluates
            self.record("the epoch ended inside the window")

    def fit_end(self, state, logger) -> None:
        self.uninstall()

    def close(self, state, logger) -> None:
        self.uninstall()

    def complete(self) -> bool:
        """Whether the run went past the window's end."""
        return self.stop in self.batches_seen
