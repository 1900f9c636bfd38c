"""What each ``trainer.precision`` means, in one place: every module that acts on the precision asks here.

Composer runs the training step (``Precision`` and its autocast context); what dlrecipes itself
decides from the precision is below: the autocast dtype of a hand-written loop (``bench``), whether
the loss is scaled (a GradScaler), whether a loader may hand over half-precision images (FFCV),
whether the optimizer is fused on a GPU, whether the precision needs a GPU (or one with bf16).
No torch here: validation reads it too (the dtype is torch's attribute name).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """The facts of one ``trainer.precision`` value."""

    name: str
    autocast_dtype: str | None  # torch's name for the autocast dtype (``getattr(torch, ...)``); None: no autocast
    grad_scaler: bool  # the loss is scaled (fp16's narrow range) and the step goes through a GradScaler
    half_data: bool  # a loader may normalise images to fp16 on the device (autocast takes fp16 inputs)
    fused_optimizer: bool  # on a GPU, torch's optimizer is fused (``fused: true`` unless the recipe sets it):
    # it takes the scaler's inf/NaN flag on the device instead of reading it back every step
    needs_bf16: bool = False  # the GPU must support bfloat16

    @property
    def mixed(self) -> bool:
        """Automatic mixed precision: Composer runs it on a GPU only; fake quantization (QAT) needs fp32."""
        return self.autocast_dtype is not None


PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", autocast_dtype=None, grad_scaler=False, half_data=False, fused_optimizer=False),
        Precision("amp_fp16", autocast_dtype="float16", grad_scaler=True, half_data=True, fused_optimizer=True),
        Precision(
            "amp_bf16",
            autocast_dtype="bfloat16",
            grad_scaler=False,
            half_data=False,
            fused_optimizer=False,
            needs_bf16=True,
        ),
    )
}


def precisions_meaning() -> str:
    """What ``trainer.precision`` means, value by value, said from the facts above (``show --explain``, validation
    errors, the reference pages)."""

    def said(p: Precision) -> str:
        if not p.mixed:
            return f"{p.name}: float32 throughout, on any device"
        gpu = "a GPU with bfloat16 support" if p.needs_bf16 else "a GPU"
        scaled = ", the loss scaled against float16's narrow range by a GradScaler" if p.grad_scaler else ""
        return f"{p.name}: automatic mixed precision, {p.autocast_dtype} autocast where it is safe, needs {gpu}{scaled}"

    return "numeric precision of the training step: " + "; ".join(said(p) for p in PRECISIONS.values())


def precision_of(name: str) -> Precision:
    """The facts of ``trainer.precision`` (validated already: one of :data:`PRECISIONS`)."""
    return PRECISIONS[name]


__all__ = ["PRECISIONS", "Precision", "precision_of", "precisions_meaning"]
