"""Factories of dlrecipes' own algorithms (the batch augmentations' are in :mod:`.batch_factories`): the label
mixing (Composer's MixUp and CutMix without read-backs, timm's switching between them), test-time augmentation,
layer-wise lr decay, gradient checkpointing, distillation and quantization-aware training, which :mod:`.registered`
adds by name (``algorithms.add``, beside the rest): light, as validation imports them; each implementation loads
when a recipe uses it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from dlrecipes.core.durations import Duration
from dlrecipes.core.ranges import AtLeastOne, Positive, Probability, Range

Share = Annotated[float, Range(0, 1)]  # a probability that may be 1


def mixup(alpha: Positive = 0.2, interpolate_loss: bool = False):
    """Train on convex combinations of pairs of examples and their labels (Zhang et al. 2017).

    Args:
        alpha: the batch's mixing weight (at most 0.5) comes from Beta(alpha, alpha): 0.2 mostly mixes in little.
        interpolate_loss: blend the losses against both labels rather than the labels (the same for cross-entropy).
    """
    from composer.algorithms import MixUp

    from dlrecipes.algorithms.soft_targets import without_read_backs

    return without_read_backs(MixUp(alpha=alpha, interpolate_loss=interpolate_loss))


def cutmix(alpha: Positive = 1.0, interpolate_loss: bool = False, uniform_sampling: bool = False):
    """Paste a box from another image and mix the labels by area (Yun et al. 2019).

    Args:
        alpha: the pasted box's share of the image comes from Beta(alpha, alpha): 1 (the paper's) is uniform.
        interpolate_loss: blend the losses against both labels rather than the labels (the same for cross-entropy).
        uniform_sampling: let the box's centre fall up to half a box outside the image, so edges mix as often.
    """
    from composer.algorithms import CutMix

    from dlrecipes.algorithms.soft_targets import without_read_backs

    return without_read_backs(CutMix(alpha=alpha, interpolate_loss=interpolate_loss, uniform_sampling=uniform_sampling))


def mixup_cutmix(
    mixup_alpha: Positive = 0.1,
    cutmix_alpha: Positive = 1.0,
    switch_prob: Share = 0.5,
    prob: Share = 1.0,
    label_smoothing: Probability = 0.0,
    correct_lam: bool = True,
):
    """MixUp or CutMix, one per batch, as timm's Mixup in batch mode (DeiT; ResNet strikes back's A1-A3).

    Args:
        mixup_alpha: a MixUp batch is lam * images + (1 - lam) * the batch reversed, lam ~ Beta(mixup_alpha,
            mixup_alpha) (0.1, A3's: mostly mixes in little); the labels alike.
        cutmix_alpha: a CutMix batch gets a box of the batch reversed pasted in, its side sqrt(1 - lam) of the
            image's with lam ~ Beta(cutmix_alpha, cutmix_alpha) (1.0: uniform); the labels mixed by area.
        switch_prob: the probability that a batch is CutMixed rather than MixUped (0.5: either, evenly).
        prob: the probability that a batch is mixed at all (1.0: every batch).
        label_smoothing: smooth the mixed labels' one-hot vectors first (each class gets label_smoothing /
            classes, the true class the rest); 0 for none (A3 trains with binary cross-entropy, unsmoothed).
        correct_lam: a CutMix box clipped at the image's edge mixes the labels by the area actually pasted,
            not by the drawn lam.
    """
    from dlrecipes.algorithms.mixup_cutmix import MixUpCutMix

    return MixUpCutMix(
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        switch_prob=switch_prob,
        prob=prob,
        label_smoothing=label_smoothing,
        correct_lam=correct_lam,
    )


def tta(level: Literal[0, 1, 2] = 2, pad: Literal[1, 2] = 1):
    """Test-time augmentation in every evaluation (during training and dlrecipes eval): logits averaged over views.

    Args:
        level: 0: none; 1: the mean of the logits of the images and of their mirror images; 2 (airbench's): half
            level 1's, a quarter each of level 1's on the images translated by pad pixels up-left and down-right
            (crops of the images reflect-padded by pad). Metrics, the best checkpoint's choice and eval's report
            all score the averaged logits; the run logs eval/tta.
        pad: the translation in pixels at level 2 (airbench: 1).
    """
    from dlrecipes.algorithms.tta import TestTimeAugmentation

    return TestTimeAugmentation(level=level, pad=pad)


def layerwise_lr_decay(decay: float = 0.75, block_depth: AtLeastOne = 2):
    """Smaller learning rates nearer the input: block d of D trains at lr * decay ** (D - 1 - d).

    Args:
        decay: the factor the rate shrinks by per block toward the input, in (0, 1]; 1: no decay.
        block_depth: how many leading parts of a parameter's name make its block (2: layer1.0.conv1.weight: layer1.0).
    """
    from dlrecipes.algorithms.layerwise_lr_decay import LayerwiseLRDecay

    return LayerwiseLRDecay(decay=decay, block_depth=block_depth)


def gradient_checkpointing(targets: list[str] | None = None, every: AtLeastOne = 1):
    """Recompute the activations of residual blocks in backward instead of storing them (memory for compute).

    Args:
        targets: class names of the modules checkpointed; null: residual blocks (BasicBlock, Bottleneck, PreActBlock).
        every: checkpoint every this-many-th of them, from the first (1: all; 2: every other one).
    """
    from dlrecipes.algorithms.gradient_checkpointing import GradientCheckpointing

    return GradientCheckpointing(targets=targets, every=every)


def distillation(
    teacher: str | dict[str, Any],
    temperature: Positive = 4.0,
    alpha: Annotated[float, Range(0, 1)] = 0.5,
    kind: Literal["soft", "hard"] = "soft",
    teacher_sha256: str | None = None,
):
    """Knowledge distillation from a frozen teacher (a run directory, a checkpoint or a model spec; Hinton et al. 2015).

    Args:
        teacher: a run directory (best checkpoint), a run's checkpoint, or a model spec {name: ..., checkpoint: FILE}.
        temperature: 'soft' divides both networks' logits by it (higher: softer) and multiplies the term by its square.
        alpha: the teacher's weight: loss = (1 - alpha) * label loss + alpha * distillation loss.
        kind: 'soft': KL divergence from the teacher's tempered probabilities; 'hard': cross-entropy on its top class.
        teacher_sha256: the teacher file's SHA-256, recorded at validation; a given one pins it (checked at the start).
    """
    from dlrecipes.algorithms.distillation import Distillation

    return Distillation(teacher, temperature=temperature, alpha=alpha, kind=kind, teacher_sha256=teacher_sha256)


def qat(
    layout=None,
    /,
    start: Duration = "0.5dur",
    backend: Literal["x86", "fbgemm", "qnnpack"] = "x86",
    freeze_bn: Duration | None = None,
    freeze_observers: Duration | None = None,
    export: bool = True,
):
    """Quantization-aware training from `start` (conv-bn folding, int8 fake quantization); exports int8 TorchScript.

    Args:
        start: when training switches to fake quantization ('0.5dur': halfway, '10ep', '500ba'), before the end.
        backend: the int8 kernels aimed at, which also run the export: 'x86' or 'fbgemm' (x86 CPUs), 'qnnpack' (ARM).
        freeze_bn: when the fused batch norms stop updating their running statistics, at or after start; null: never.
        freeze_observers: when the quantization ranges (scale, zero point) stop moving, at or after start; null: never.
        export: at the end, write the int8 TorchScript model and its accuracy report to the run's exports/.
    """
    from dlrecipes.algorithms.qat import QAT

    export_dir = layout.exports if export and layout is not None else None
    return QAT(
        start=start, backend=backend, freeze_bn=freeze_bn, freeze_observers=freeze_observers, export_dir=export_dir
    )
