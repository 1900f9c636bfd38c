"""Factories of the label-mixing algorithms and of test-time augmentation, which :mod:`.registered` adds by name
(``algorithms.add``, beside the rest): light, as validation imports them; each implementation loads when a recipe
uses it."""

from __future__ import annotations

from typing import Annotated, Literal

from dlrecipes.core.ranges import Positive, Probability, Range

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


def mixup_cutmix(mixup_alpha: Positive = 0.1, cutmix_alpha: Positive = 1.0, switch_prob: Share = 0.5,
                 prob: Share = 1.0, label_smoothing: Probability = 0.0, correct_lam: bool = True):
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

    return MixUpCutMix(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, switch_prob=switch_prob, prob=prob,
                       label_smoothing=label_smoothing, correct_lam=correct_lam)


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
