"""algorithms: mixup_cutmix: timm's MixUp/CutMix switching in batch mode, held to its definition."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from dlrecipes.algorithms.mixup_cutmix import MixUpCutMix


def state_with(images, labels, classes=4):
    model = types.SimpleNamespace(num_classes=classes)
    state = types.SimpleNamespace(model=model, is_model_ddp=False, batch=[images, labels])
    state.batch_get_item = lambda key: state.batch[key]
    state.batch_set_item = lambda key, value: state.batch.__setitem__(key, value)
    return state


def mixed(algorithm, images, labels):
    state = state_with(images.clone(), labels)
    algorithm.apply(None, state, None)
    return state.batch


def test_each_batch_is_a_mixup_or_a_cutmix_at_the_switch_rate():
    """400 batches of constant images: a CutMix batch keeps pixels of both images unchanged (a pasted box), a MixUp
    batch changes every pixel to one convex mix; CutMix's share is switch_prob; a MixUp's lam is Beta(0.1, 0.1):
    mostly near 0 or 1; a CutMix's lam is the kept area's share, and the labels are mixed by it."""
    np.random.seed(0)
    algorithm = MixUpCutMix(
        mixup_alpha=0.1, cutmix_alpha=1.0, switch_prob=0.5, prob=1.0, label_smoothing=0.0, correct_lam=True
    )
    images = torch.stack([torch.zeros(1, 8, 8), torch.ones(1, 8, 8)])  # image 0 all 0, image 1 all 1
    labels = torch.tensor([0, 1])
    cutmixes, mixup_lams = 0, []
    for _ in range(400):
        x, y = mixed(algorithm, images, labels)
        kept = (x[0] == 0).float().mean().item()  # image 0's own pixels (a pasted box holds image 1's ones)
        values = x[0].unique()
        if set(values.tolist()) <= {0.0, 1.0} and 0 < kept < 1:  # a box pasted
            cutmixes += 1
            assert torch.allclose(y[0], torch.tensor([kept, 1 - kept, 0, 0]))  # labels by area
            assert torch.equal(x[1], 1 - x[0])  # the other image got the same box of image 0
        elif values.numel() == 1:  # one convex mix everywhere: lam * 0 + (1 - lam) * 1
            lam = 1 - values.item()
            mixup_lams.append(lam)
            assert torch.allclose(y[0], torch.tensor([lam, 1 - lam, 0, 0]), atol=1e-6)
    assert cutmixes + len(mixup_lams) >= 390  # a CutMix box of no area, or a whole-image one, is rare
    assert abs(cutmixes / 400 - 0.5) < 0.1
    near_edges = np.mean([min(lam, 1 - lam) < 0.05 for lam in mixup_lams])
    assert near_edges > 0.6  # Beta(0.1, 0.1): P(min(lam, 1 - lam) < 0.05) = 0.73


def test_the_same_draws_as_timms_own_mixup():
    from timm.data import Mixup

    images, labels = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 0, 1])
    timm_mixup = Mixup(mixup_alpha=0.1, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1, num_classes=4)
    algorithm = MixUpCutMix(
        mixup_alpha=0.1, cutmix_alpha=1.0, switch_prob=0.5, prob=1.0, label_smoothing=0.1, correct_lam=True
    )
    for seed in range(6):
        np.random.seed(seed)
        x, y = mixed(algorithm, images, labels)
        np.random.seed(seed)
        want_x, want_y = timm_mixup(images.clone(), labels)
        assert torch.equal(x, want_x) and torch.equal(y, want_y)


def test_an_odd_batch_is_refused_and_it_conflicts_with_mixup_and_cutmix(tiny_recipe):
    from dlrecipes.api import resolve
    from dlrecipes.errors import RecipeError

    algorithm = MixUpCutMix(
        mixup_alpha=0.1, cutmix_alpha=1.0, switch_prob=0.5, prob=1.0, label_smoothing=0.0, correct_lam=True
    )
    with pytest.raises(ValueError, match="even batch"):
        mixed(algorithm, torch.randn(3, 1, 4, 4), torch.tensor([0, 1, 2]))
    for other in ("mixup", "cutmix"):
        with pytest.raises(RecipeError, match="mixup_cutmix"):
            resolve(tiny_recipe, [f"algorithms={{mixup_cutmix: {{}}, {other}: {{}}}}"])
