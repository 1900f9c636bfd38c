"""The built-in losses, by name (``loss:`` in a recipe, ``task.outputs.<name>.loss`` per output).

A recipe gives a name, or a name with parameters::

    loss: cross_entropy
    loss: {name: focal, gamma: 2.0}

Each factory returns ``fn(predictions, targets) -> loss``; class losses take index targets
or dense (smoothed, mixed) targets, as Composer's label smoothing and MixUp produce.
``targets=`` says what a loss trains: ``class`` labels or ``regression`` values.  The
implementations (and torch) are imported inside the factories, so validation stays fast.
"""

from __future__ import annotations

from typing import Literal

from dlrecipes.core.ranges import NonNegative, Probability
from dlrecipes.registry import losses


@losses.register("cross_entropy", targets="class")
def cross_entropy(label_smoothing: Probability = 0.0, reduction: Literal["mean", "sum"] = "mean"):
    """Softmax cross-entropy (Composer's, for index or soft targets), optional label smoothing.

    Args:
        label_smoothing: the share of each target's probability spread evenly over the classes (target =
            (1 - s) * one-hot + s / classes); 0: none.
        reduction: 'mean' averages the samples' losses over the batch; 'sum' adds them (the speedruns': the
            gradient grows with the batch, which their learning rates are tuned for).
    """
    from functools import partial

    from dlrecipes.losses.functions import smoothed, soft_cross_entropy

    loss = soft_cross_entropy if reduction == "mean" else partial(soft_cross_entropy, reduction=reduction)
    return smoothed(loss, label_smoothing)


@losses.register("binary_cross_entropy", targets="class")
def binary_cross_entropy(label_smoothing: Probability = 0.0):
    """One sigmoid per class (MosaicML's ResNet recipes), optional label smoothing.

    Args:
        label_smoothing: the share of each target's probability spread evenly over the classes (target =
            (1 - s) * one-hot + s / classes); 0: none.
    """
    from dlrecipes.losses.functions import binary_cross_entropy, smoothed

    return smoothed(binary_cross_entropy, label_smoothing)


@losses.register("focal", targets="class")
def focal(gamma: NonNegative = 2.0, label_smoothing: Probability = 0.0):
    """Softmax focal loss (Lin et al. 2017): cross-entropy weighted by (1 - p)^gamma; gamma 0 is cross-entropy.

    Args:
        gamma: the focusing exponent: each class's term is weighted by (1 - p)^gamma, p its predicted
            probability, so confidently right samples count less; 0 is plain cross-entropy.
        label_smoothing: the share of each target's probability spread evenly over the classes (target =
            (1 - s) * one-hot + s / classes); 0: none.
    """
    from dlrecipes.losses.functions import focal_loss, smoothed

    return smoothed(focal_loss(gamma), label_smoothing)


@losses.register("mse", targets="regression")
def mse():
    """Mean squared error, for regression outputs."""
    from dlrecipes.losses.functions import mse_loss

    return mse_loss


@losses.register("l1", targets="regression")
def l1():
    """Mean absolute error, for regression outputs."""
    from dlrecipes.losses.functions import l1_loss

    return l1_loss
