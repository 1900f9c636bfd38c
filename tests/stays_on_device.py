"""A dispatch mode that checks per-batch code never leaves its device (tests of the sync-free loaders).

Run the code on ``meta`` tensors inside :class:`StaysOnDevice`: every aten op it calls is seen,
and any op with a tensor on another device (a constant made on the host, a copy from or to
it) or that reads a value back (``item``) is recorded in ``left``.  On a GPU those are the
host-device copies and synchronisations a training step would wait for.  A copy onto the
device with ``non_blocking=True`` (a pinned batch arriving) is allowed.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

READS_BACK = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


class StaysOnDevice(TorchDispatchMode):
    def __init__(self, device: str = "meta"):
        super().__init__()
        self.device = device
        self.ops: list[str] = []
        self.left: list[tuple[str, set[str]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        devices = {t.device.type for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)}
        self.ops.append(str(func))
        arriving = (
            func is torch.ops.aten._to_copy.default
            and kwargs.get("non_blocking")
            and getattr(kwargs.get("device"), "type", kwargs.get("device")) == self.device
        )
        if func in READS_BACK or (devices - {self.device} and not arriving):
            self.left.append((str(func), devices))
        return out
