"""Knowledge distillation (Hinton, Vinyals, Dean 2015): the student trains toward a frozen teacher's outputs as
well as the labels.

The teacher is held by the algorithm, outside the student's module tree: it is not in ``state.model``, so it is in no
checkpoint, no EMA/SWA copy, no DDP wrapper (every process runs its own copy, with no collective), and evaluation,
export and predict never see it.  It is built at the first training batch (its class count and input channels are the
student's logits' and images'), frozen, in eval mode, on the run's device, in the student's memory format (channels-last
with the ``channels_last`` algorithm), and run under ``torch.no_grad`` in the run's precision context once the student's
loss is final (``Event.BEFORE_BACKWARD``, after every other algorithm: mixup's and cutmix's ``interpolate_loss`` act
there), on the same (possibly mixed or resized) images. The loss becomes ``(1 - alpha) * label_loss + alpha *
distillation_loss`` with

- ``soft``: ``KL(softmax(teacher / T) || softmax(student / T)) * T**2`` (batch mean);
- ``hard``: cross-entropy against the teacher's top class (DeiT's hard distillation).

``label_loss`` is the recipe's own loss (label smoothing, BCE, mixup's mixed targets included); the three are
logged as ``loss/train/total``, ``loss/train/labels`` and ``loss/train/distillation``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from composer.core import Algorithm, Event, State
from composer.core.precision import get_precision_context
from torch import nn

from dlrecipes import registry
from dlrecipes.algorithms.teacher import KEY, SPEC_WEIGHTS, TeacherSource, teacher_file, teacher_source
from dlrecipes.errors import UserError
from dlrecipes.records.run_files import file_digest

if TYPE_CHECKING:
    from composer.loggers import Logger

    from dlrecipes.data.splits import DatasetSplits


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float, kind: str) -> torch.Tensor:
    """The distillation term alone, in float32 whatever the logits' precision.

    Under ``amp_bf16``/``amp_fp16`` the student's logits are half precision, and so are the teacher's when its
    network runs in the precision context (on a GPU; on the CPU Composer's amp context does nothing, so they are
    float32). This term is computed at ``Event.BEFORE_BACKWARD``, outside autocast, so nothing would upcast it:
    ``log_softmax`` of bf16 logits (8 bits of mantissa) would give soft targets and log-probabilities off by
    about 1e-2, and the loss itself would be bf16. Both logits are cast to float32 here, where the loss needs
    it (not at the teacher: its outputs stay in the run's precision); the cast is differentiable, so the
    gradient reaches the student's logits in their own dtype."""
    student, teacher = student.float(), teacher.float()
    if kind == "hard":
        return F.cross_entropy(student, teacher.argmax(dim=-1))
    t = float(temperature)
    return F.kl_div(
        F.log_softmax(student / t, dim=-1), F.log_softmax(teacher / t, dim=-1), reduction="batchmean", log_target=True
    ) * (t * t)


def blended_loss(
    label_loss: torch.Tensor, student: torch.Tensor, teacher: torch.Tensor, temperature: float, alpha: float, kind: str
) -> dict[str, torch.Tensor]:
    """``{total, labels, distillation}``: the loss to train on and its two parts."""
    labels = label_loss if label_loss.dim() == 0 else label_loss.mean()
    kd = distillation_loss(student, teacher, temperature, kind)
    return {"total": (1.0 - alpha) * labels + alpha * kd, "labels": labels, "distillation": kd}


def teacher_weights(source: TeacherSource, pinned: str | None) -> dict[str, torch.Tensor] | None:
    """The teacher's state dict (keys as the bare network names them), read tensors-only, its file checked
    against the checksum validation recorded (``pinned``)."""
    from dlrecipes.records.checkpoints import UntrustedCheckpoint, model_weights, read_checkpoint

    checked = source.checksum_file
    if pinned and checked is not None and file_digest(checked) != pinned:
        raise UserError(
            f"{KEY}: {checked} has changed since the recipe recorded it (teacher_sha256 {pinned[:12]}..., "
            f"the file's is {file_digest(checked)[:12]}...); remove teacher_sha256 to use the file as it is now"
        )
    if source.weights is None:
        return None
    try:
        state = read_checkpoint(source.weights, key=KEY)
    except UntrustedCheckpoint as refused:  # its advice, --trust-checkpoint, is not for a teacher: say what is
        raise UserError(
            f"{KEY}: {source.weights} holds Python objects beyond tensors ({', '.join(refused.found[:3])}"
            f"); a teacher is always read tensors-only, --trust-checkpoint or not: save its weights alone, "
            f"torch.save(network.state_dict(), FILE), and give the teacher as {{name: <model>, "
            f"<parameters>, {SPEC_WEIGHTS}: FILE}}"
        ) from None
    weights = model_weights(state, source.weights, key=KEY)
    weights = {k.replace("_orig_mod.", ""): v for k, v in weights.items()}  # saved from a torch.compile'd network
    if weights and all(k.startswith("module.") for k in weights):  # a Composer classifier's: module.<layer>
        weights = {k.removeprefix("module."): v for k, v in weights.items()}
    return weights


def build_teacher(
    source: TeacherSource, weights: dict | None, num_classes: int, in_chans: int, input_shape: tuple
) -> nn.Module:
    """The teacher network for this data, its weights loaded, frozen, in eval mode (on the CPU)."""
    from dlrecipes.config.checks import check_component

    params = check_component({"name": source.model, **source.params}, KEY, registry.models).params
    accepted = registry.models.get(source.model).parameters
    for key, value in {"num_classes": num_classes, "in_chans": in_chans, "input_shape": input_shape}.items():
        if key in accepted and key not in params:
            params[key] = value
    network = registry.build_component(registry.models, source.model, params, KEY)
    if weights is not None:
        mismatch = _mismatch(network.state_dict(), weights, num_classes, in_chans)
        if mismatch:
            raise UserError(f"{KEY}: {source.origin} ({source.weights}) {mismatch}")
        try:
            network.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            detail = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
            raise UserError(
                f"{KEY}: the weights of {source.weights} do not fit {source.origin}'s network for this "
                f"data ({num_classes} classes, {in_chans} channels): {detail}"
            ) from None
    network.eval()
    network.requires_grad_(False)
    return network


def _mismatch(
    expected: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], num_classes: int, in_chans: int
) -> str:
    """What a teacher's weights say it was trained for, where that is not this data: its class count (the last
    matrix whose rows are this data's classes) or its input channels (the first convolution); else ''."""
    shaped = [(k, v) for k, v in expected.items() if k in weights and getattr(weights[k], "shape", None) is not None]
    heads = [k for k, v in shaped if v.dim() == 2 and v.shape[0] == num_classes]
    if heads and weights[heads[-1]].shape[0] != num_classes:
        return (
            f"predicts {weights[heads[-1]].shape[0]} classes and this dataset has {num_classes}; a teacher must be "
            "trained on the student's classes"
        )
    convs = [k for k, v in shaped if v.dim() == 4]
    if convs and expected[convs[0]].shape[1] == in_chans and weights[convs[0]].shape[1] != in_chans:
        return (
            f"takes {weights[convs[0]].shape[1]}-channel images and this dataset's have {in_chans} channels; a "
            "teacher must take the student's images"
        )
    return ""


class Distillation(Algorithm):
    """Blend the student's loss with a distillation loss toward a frozen teacher (see the module docstring)."""

    def __init__(
        self,
        teacher: Any,
        temperature: float = 4.0,
        alpha: float = 0.5,
        kind: str = "soft",
        teacher_sha256: str | None = None,
    ):
        if isinstance(teacher, (str, Path)):
            teacher = str(teacher_file(Path(teacher)))
        self.source = teacher_source(teacher)
        self.weights = teacher_weights(self.source, teacher_sha256)
        self.temperature, self.alpha, self.kind = temperature, alpha, kind
        # a plain attribute, not a submodule of anything the Trainer holds: in no checkpoint, no DDP wrapper
        self.teacher: nn.Module | None = None
        self._placed = False  # on the run's device, in its memory format

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.BEFORE_BACKWARD)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            # last in the list, so last at BEFORE_BACKWARD: the label term is the loss every other algorithm made
            # (mixup's and cutmix's interpolate_loss replace it there, and refuse a dict)
            state.algorithms = [*(a for a in state.algorithms if a is not self), self]
            return
        images, student = state.batch[0], state.outputs
        if self.teacher is None:  # not built before the run (check_data): from the first batch's shapes
            self.teacher = build_teacher(
                self.source, self.weights, student.shape[-1], images.shape[1], tuple(images.shape[1:])
            )
            self.weights = None  # the network holds them now
        if not self._placed:
            self.teacher = self._on_device(state, self.teacher)
            self._placed = True
        with torch.no_grad(), get_precision_context(state.precision, state.precision_config):
            teacher = self.teacher(images)
        if teacher.shape != student.shape:
            raise UserError(
                f"{KEY}: the teacher's outputs have shape {tuple(teacher.shape)}, the student's "
                f"{tuple(student.shape)}; a teacher must predict the student's classes"
            )
        state.loss = blended_loss(state.loss, student, teacher, self.temperature, self.alpha, self.kind)

    def check_data(self, data: DatasetSplits) -> None:
        """Before the run starts (the builder calls it with the data): build the teacher for this data's classes
        and images, so that a teacher trained for other classes or channels is refused before the start line, in
        one line naming both."""
        shape = tuple(data.input_shape or ())
        if self.teacher is None and shape and data.num_classes:
            self.teacher = build_teacher(self.source, self.weights, data.num_classes, shape[0], shape)
            self.weights = None

    def _on_device(self, state: State, network: nn.Module) -> nn.Module:
        from composer.algorithms import ChannelsLast

        network = state.device.module_to_device(network)
        if any(isinstance(a, ChannelsLast) for a in state.algorithms):
            network = network.to(memory_format=torch.channels_last)
        return network

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing of the teacher goes into the student's checkpoints
