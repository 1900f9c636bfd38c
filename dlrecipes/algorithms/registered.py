"""Training-time algorithms (Composer's ``Algorithm`` objects): the built-ins, registered by name.

Composer's own first: one small factory each, whose parameters mirror the Composer class's constructor (a test
compares them) minus the batch-key plumbing, so recipes are checked without importing Composer.  Then dlrecipes'
own, added by name with what is known of each (their factories in :mod:`.factories` and :mod:`.batch_factories`);
their implementations sit beside this file and load only when a recipe uses them (:mod:`.finetune` holds the
frozen-backbone algorithm of ``finetune:``); what the factories check at validation is in :mod:`.support`.
"""

from __future__ import annotations

from typing import Literal

from dlrecipes.algorithms.augment_keys import ON_DEVICE, check_erasing, one_policy, policy_or_keys
from dlrecipes.algorithms.batch_factories import (
    batch_augmix,
    batch_color_jitter,
    batch_randaugment,
    batch_random_erasing,
    batch_trivialaugment,
)
from dlrecipes.algorithms.factories import (
    cutmix,
    distillation,
    gradient_checkpointing,
    layerwise_lr_decay,
    mixup,
    mixup_cutmix,
    qat,
    tta,
)
from dlrecipes.algorithms.support import (
    check_qat_times,
    ghost_batch_fits,
    needs_bottleneck_resnet,
    needs_pil_dataset,
    needs_pixels,
    qat_fits_the_run,
)
from dlrecipes.algorithms.teacher import check_distillation_params, teacher_fits_the_run
from dlrecipes.core.durations import Duration
from dlrecipes.core.ranges import AtLeastOne, Fraction, Positive, Probability
from dlrecipes.registry import algorithms


@algorithms.register("channels_last", changes_network=True, checkpoint_state=False)
def channels_last():
    """Store activations in NHWC memory order (faster convolutions on tensor-core GPUs)."""
    from composer.algorithms import ChannelsLast

    return ChannelsLast()


@algorithms.register("label_smoothing", image_label_batch="smooths batch[1] as the class labels")
def label_smoothing(smoothing: Probability = 0.1):
    """Blend one-hot targets with the uniform distribution (Szegedy et al. 2016): Composer's, with no read-back.

    Args:
        smoothing: the share of each target spread evenly over all classes, in [0, 1); 0 leaves the labels alone.
    """
    from dlrecipes.algorithms.soft_targets import LabelSmoothing

    return LabelSmoothing(smoothing=smoothing)


@algorithms.register("blurpool", changes_network=True)
def blurpool(
    replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True, min_channels: int = 16
):
    """Anti-aliased downsampling: blur before strided convolutions and max-pools (Zhang 2019).

    Args:
        replace_convs: add a blur to each strided convolution that has at least min_channels input channels.
        replace_maxpools: replace each max-pool with its anti-aliased form (max at stride 1, then a strided blur).
        blur_first: true blurs before the strided convolution (cheap); false convolves at stride 1, then blurs (slow).
        min_channels: strided convolutions with fewer input channels are left alone (16 spares an RGB stem).
    """
    from composer.algorithms import BlurPool

    return BlurPool(
        replace_convs=replace_convs, replace_maxpools=replace_maxpools, blur_first=blur_first, min_channels=min_channels
    )


@algorithms.register(
    "ema", conflicts_with={"swa": "both replace the weights used for evaluation"}, checkpoint_state=True
)
def ema(
    half_life: Duration | None = "1000ba",
    smoothing: float | None = None,
    ema_start: Duration = "0.0dur",
    update_interval: Duration | None = None,
):
    """Evaluate with an exponential moving average of the weights.

    Args:
        half_life: how far back the average reaches ('1000ba', '2ep'): weights that old count half; null: use smoothing.
        smoothing: with half_life null, the average's share kept per update (0.999: it moves 0.1% toward the weights).
        ema_start: when averaging begins ('0.0dur': at once, '3ep'); until then evaluation uses the trained weights.
        update_interval: how often the average is updated, in half_life's unit ('5ba', '1ep'); null: each batch/epoch.
    """
    from composer.algorithms import EMA

    return EMA(half_life=half_life, smoothing=smoothing, ema_start=ema_start, update_interval=update_interval)


@algorithms.register("progressive_resizing", image_label_batch="resizes batch[0] as the images")
def progressive_resizing(
    mode: Literal["resize", "crop"] = "resize",
    initial_scale: float = 0.5,
    finetune_fraction: float = 0.2,
    delay_fraction: float = 0.5,
    size_increment: AtLeastOne = 4,
    resize_targets: bool = False,
):
    """Train on downscaled images early, growing to full size.

    Composer resizes the batches; FFCV and `dataset.decode: device` decode (crop) at the size.

    Args:
        mode: 'resize' scales the images down (nearest neighbour), 'crop' takes a random crop of the smaller size.
        initial_scale: the images' side at first, a fraction of the full side (0.5: half the height and width).
        finetune_fraction: the share of training, at its end, spent at full size (0.2: the last fifth).
        delay_fraction: the share of training, at its start, spent at initial_scale before the side grows linearly.
        size_increment: the scaled side is rounded to a multiple of this many pixels.
        resize_targets: resize the targets with the images (dense targets such as masks; not class labels).
    """
    from dlrecipes.algorithms.progressive_resizing import ProgressiveResizing

    return ProgressiveResizing(
        mode=mode,
        initial_scale=initial_scale,
        finetune_fraction=finetune_fraction,
        delay_fraction=delay_fraction,
        size_increment=size_increment,
        resize_targets=resize_targets,
    )


@algorithms.register("cutout", image_label_batch="masks batch[0] as the images")
def cutout(num_holes: AtLeastOne = 1, length: Fraction = 0.5, uniform_sampling: bool = False):
    """Zero out random square patches of each image (DeVries & Taylor 2017).

    Args:
        num_holes: how many square holes are zeroed, at the same places in every image of a batch.
        length: a hole's side, as a fraction of the image's shorter side (0.5: half of it).
        uniform_sampling: let a hole's centre fall up to half a hole outside the image, so edges are masked as often.
    """
    from composer.algorithms import CutOut

    return CutOut(num_holes=num_holes, length=length, uniform_sampling=uniform_sampling)


@algorithms.register("gradient_clipping")
def gradient_clipping(clipping_type: Literal["norm", "value", "adaptive"] = "norm", clipping_threshold: Positive = 1.0):
    """Clip gradients by global norm, by value, or adaptively (AGC) before each step.

    Args:
        clipping_type: 'norm' caps the global L2 norm of all gradients; 'value' clamps each element; 'adaptive'
            (AGC) caps each unit's gradient norm relative to its weights' norm.
        clipping_threshold: the cap: global norm ('norm'), absolute value ('value'), gradient/weight norm ratio
            ('adaptive', typically 0.01 to 0.1).
    """
    from composer.algorithms import GradientClipping

    return GradientClipping(clipping_type=clipping_type, clipping_threshold=clipping_threshold)


@algorithms.register(
    "randaugment",
    requires=needs_pil_dataset("batch_randaugment"),
    image_label_batch="augments the one image of each sample",
)
def randaugment(severity: int = 9, depth: int = 2, augmentation_set: Literal["all", "safe", "original"] = "all"):
    """Apply `depth` random image augmentations of strength `severity` to each training image.

    Args:
        severity: the ops' strength, 0 to 10 (M in the paper): each op draws a random strength up to it.
        depth: how many ops, each drawn at random, are applied one after another (N in the paper).
        augmentation_set: the ops drawn from: 'all' (the paper's), 'safe' (not color, contrast, brightness and
            sharpness, which ImageNet-C tests), 'original' (those four as the authors' code has them).
    """
    from composer.algorithms import RandAugment

    return RandAugment(severity=severity, depth=depth, augmentation_set=augmentation_set)


@algorithms.register(
    "augmix", requires=needs_pil_dataset("batch_augmix"), image_label_batch="augments the one image of each sample"
)
def augmix(
    severity: int = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: Literal["all", "safe", "original"] = "all",
):
    """Mix several chains of augmentations of each image (Hendrycks et al. 2020).

    Args:
        severity: the ops' strength, 0 (none) to 10: each op draws a random strength up to it.
        depth: how many ops each chain applies; -1 draws 1 to 3 for each chain.
        width: how many chains of ops are run on each image and mixed.
        alpha: concentration of the chains' Dirichlet weights and of the Beta weight of the mix: 1 is uniform.
        augmentation_set: the ops drawn from: 'all' (the paper's), 'safe' (not color, contrast, brightness and
            sharpness, which ImageNet-C tests), 'original' (those four as the authors' code has them).
    """
    from composer.algorithms import AugMix

    return AugMix(severity=severity, depth=depth, width=width, alpha=alpha, augmentation_set=augmentation_set)


@algorithms.register("colout", image_label_batch="drops rows and columns of batch[0] as the images")
def colout(
    p_row: Probability = 0.15,
    p_col: Probability = 0.15,
    batch: bool = True,
    resize_target: bool | Literal["auto"] = "auto",
):
    """Drop random rows and columns of each image: smaller, faster batches.

    Args:
        p_row: the share of the image's rows removed (0.15: the image is 15% shorter).
        p_col: the share of the image's columns removed (0.15: the image is 15% narrower).
        batch: true drops the same rows and columns across a batch; false drops others per image, in the dataset.
        resize_target: also from the targets: 'auto' when they have the images' size (masks), true always, false never.
    """
    from composer.algorithms import ColOut

    return ColOut(p_row=p_row, p_col=p_col, batch=batch, resize_target=resize_target)


@algorithms.register(
    "sam",
    checkpoint_state=True,
    reads_back=(
        "Composer's SAM optimizer tests each pass's loss on the host (`if loss:`) before stepping: one read-back per "
        "step (two on its ascent steps, every `interval`), as in Composer's Trainer"
    ),
)
def sam(rho: Positive = 0.05, epsilon: Positive = 1e-12, interval: AtLeastOne = 1):
    """Sharpness-aware minimisation every `interval` steps (Foret et al. 2020).

    Args:
        rho: the neighbourhood's radius: weights first move this far (L2) up the gradient, then step with its gradient.
        epsilon: added to the gradient's norm before dividing by it, so that a zero gradient is safe.
        interval: a SAM step (two forward-backward passes) every this many steps, plain ones between; 1: every step.
    """
    from composer.algorithms import SAM

    return SAM(rho=rho, epsilon=epsilon, interval=interval)


@algorithms.register("swa", checkpoint_state=True)
def swa(
    swa_start: Duration = "0.7dur",
    swa_end: Duration = "0.97dur",
    update_interval: Duration = "1ep",
    schedule_swa_lr: bool = False,
    anneal_strategy: Literal["linear", "cos"] = "linear",
    anneal_steps: AtLeastOne = 10,
    swa_lr: float | None = None,
):
    """Stochastic weight averaging over the end of training (Izmailov et al. 2018).

    Args:
        swa_start: when averaging begins, as a fraction of training ('0.7dur') or in epochs ('8ep'), swa_end's unit.
        swa_end: when the weights become the average and averaging stops; leave an epoch after it for batch norm.
        update_interval: how often the weights are added to the average, in batches or epochs ('1ep', '50ba').
        schedule_swa_lr: let torch's SWALR set the learning rate from swa_start on; false keeps the run's schedule.
        anneal_strategy: the shape of SWALR's annealing: 'linear' or 'cos' (cosine).
        anneal_steps: over how many updates of the average (one per update_interval) SWALR anneals the rate.
        swa_lr: the rate SWALR anneals to; Composer replaces it with the run's rate at swa_start: no effect.
    """
    from composer.algorithms import SWA

    return SWA(
        swa_start=swa_start,
        swa_end=swa_end,
        update_interval=update_interval,
        schedule_swa_lr=schedule_swa_lr,
        anneal_strategy=anneal_strategy,
        anneal_steps=anneal_steps,
        swa_lr=swa_lr,
    )


@algorithms.register(
    "stochastic_depth",
    requires=needs_bottleneck_resnet,
    changes_network=True,
    reads_back=(
        "Composer's stochastic bottleneck tests its drop rate, a device tensor, in each block's forward: "
        "16 per ResNet-50 step"
    ),
)
def stochastic_depth(
    target_layer_name: Literal["ResNetBottleneck"] = "ResNetBottleneck",
    stochastic_method: Literal["block", "sample"] = "block",
    drop_rate: float = 0.2,
    drop_distribution: Literal["uniform", "linear"] = "linear",
    drop_warmup: float | Duration = 0.0,
):
    """Randomly skip residual blocks during training (torchvision ResNet bottleneck blocks).

    Args:
        target_layer_name: the blocks made stochastic: torchvision's ResNet bottleneck, the one kind supported.
        stochastic_method: 'block' skips whole blocks for a batch; 'sample' zeroes a block's residual per sample.
        drop_rate: the largest probability that a block (or a sample in it) is dropped, 0 to 1.
        drop_distribution: 'linear': the i-th of n blocks drops with i / n * drop_rate; 'uniform': all with drop_rate.
        drop_warmup: how long the rates ramp up from 0, a fraction of training (0.1) or a duration ('2ep'); 0: none.
    """
    from composer.algorithms import StochasticDepth

    return StochasticDepth(
        target_layer_name=target_layer_name,
        stochastic_method=stochastic_method,
        drop_rate=drop_rate,
        drop_distribution=drop_distribution,
        drop_warmup=drop_warmup,
    )


@algorithms.register("squeeze_excite", changes_network=True)
def squeeze_excite(latent_channels: float = 64, min_channels: int = 128):
    """Add squeeze-and-excitation blocks after convolutions with enough channels (Hu et al. 2018).

    Args:
        latent_channels: the width of each block's hidden layer: channels (64), or below 1 a share of the conv's output.
        min_channels: a block follows only convolutions with at least this many input and output channels.
    """
    from composer.algorithms import SqueezeExcite

    return SqueezeExcite(latent_channels=latent_channels, min_channels=min_channels)


@algorithms.register("layer_freezing")
def layer_freezing(freeze_start: float = 0.5, freeze_level: float = 1.0):
    """Progressively freeze the earliest layers from freeze_start (fraction of training) on.

    Args:
        freeze_start: the fraction of training after which layers begin to freeze (0.5: from halfway).
        freeze_level: the fraction of layers, from the input, frozen by the end; it grows linearly, at epoch ends.
    """
    from dlrecipes.algorithms.layer_freezing import LayerFreezing  # Composer's, its checkpoints writable

    return LayerFreezing(freeze_start=freeze_start, freeze_level=freeze_level)


@algorithms.register(
    "selective_backprop", image_label_batch="scores samples by running the model on batch[0] against batch[1]"
)
def selective_backprop(
    start: float = 0.5, end: float = 0.9, keep: float = 0.5, scale_factor: float = 1.0, interrupt: int = 2
):
    """Backpropagate only the highest-loss fraction `keep` of each batch between start and end.

    Args:
        start: the fraction of training at which selection begins.
        end: the fraction of training at which it stops (whole batches again).
        keep: the fraction of each batch trained on: its highest-loss samples, found by an extra forward pass.
        scale_factor: the images' scale in that scoring pass only (0.5: half the side, cheaper); 1: full size.
        interrupt: every interrupt-th batch of an epoch is trained whole (2: every other one); 0: none.
    """
    from composer.algorithms import SelectiveBackprop

    return SelectiveBackprop(start=start, end=end, keep=keep, scale_factor=scale_factor, interrupt=interrupt)


@algorithms.register("ghost_batchnorm", requires=ghost_batch_fits, changes_network=True)
def ghost_batchnorm(ghost_batch_size: AtLeastOne = 32):
    """Normalise over sub-batches of ghost_batch_size instead of the whole batch.

    Args:
        ghost_batch_size: how many samples each batch norm normalises over together; at most each device's batch.
    """
    from composer.algorithms import GhostBatchNorm

    return GhostBatchNorm(ghost_batch_size=ghost_batch_size)


@algorithms.register("weight_standardization", changes_network=True)
def weight_standardization(n_last_layers_ignore: int = 0):
    """Standardise convolution weights to zero mean and unit variance (Qiao et al. 2019).

    Args:
        n_last_layers_ignore: how many of the last convolutions (in running order) keep plain weights; 0: none.
    """
    from composer.algorithms import WeightStandardization

    return WeightStandardization(n_last_layers_ignore=n_last_layers_ignore)


# dlrecipes' own, their factories in .factories
algorithms.add("layerwise_lr_decay", layerwise_lr_decay)
algorithms.add("gradient_checkpointing", gradient_checkpointing, changes_network=True)
algorithms.add(
    "distillation",
    distillation,
    validator=check_distillation_params,
    requires=teacher_fits_the_run,
    paths=("teacher",),
    image_label_batch=("runs the teacher on batch[0] as the images and blends its loss with the labels' loss"),
)
algorithms.add(
    "qat",
    qat,
    requires=qat_fits_the_run,
    validator=check_qat_times,
    changes_network=True,
    conflicts_with={
        "ema": "EMA keeps weights by name, and the QAT switch renames the fused layers",
        "swa": "SWA averages a copy of the network made before the QAT switch",
    },
)

# strong augmentation of whole batches on the training device (.batch_augment), their factories in .batch_factories
algorithms.add(
    "batch_randaugment",
    batch_randaugment,
    conflicts_with=one_policy("batch_randaugment"),
    image_label_batch=ON_DEVICE,
    validator=policy_or_keys("randaugment"),
    requires=needs_pixels,
)
algorithms.add(
    "batch_trivialaugment",
    batch_trivialaugment,
    conflicts_with=one_policy("batch_trivialaugment"),
    image_label_batch=ON_DEVICE,
    requires=needs_pixels,
)
algorithms.add(
    "batch_augmix",
    batch_augmix,
    conflicts_with=one_policy("batch_augmix"),
    image_label_batch=ON_DEVICE,
    validator=policy_or_keys("augmix"),
    requires=needs_pixels,
)
algorithms.add("batch_color_jitter", batch_color_jitter, image_label_batch=ON_DEVICE, requires=needs_pixels)
algorithms.add("batch_random_erasing", batch_random_erasing, image_label_batch=ON_DEVICE, validator=check_erasing)

# the label mixing (Composer's MixUp and CutMix, timm's switching between them) and test-time augmentation (eval
# rebuilds it, as a network's), their factories in .factories
MIXES = "mixes batch[0] as the images and batch[1] as the labels"
algorithms.add(
    "mixup",
    mixup,
    image_label_batch=MIXES,
    conflicts_with={
        "cutmix": "both replace the labels of every batch",
        "mixup_cutmix": "mixup_cutmix already MixUps the batches it does not CutMix",
    },
)
algorithms.add(
    "cutmix",
    cutmix,
    image_label_batch="mixes boxes of batch[0] as the images and batch[1] as the labels",
    conflicts_with={"mixup_cutmix": "mixup_cutmix already CutMixes the batches it does not MixUp"},
)
algorithms.add("mixup_cutmix", mixup_cutmix, image_label_batch=MIXES)
algorithms.add(
    "tta",
    tta,
    changes_network=True,
    checkpoint_state=False,
    image_label_batch="averages the logits over mirrored and shifted views of batch[0] as the images",
)
