"""Training-time algorithms (Composer's ``Algorithm`` objects): the built-ins, registered by name.

Composer's own algorithms first: one small factory each, whose parameters mirror the Composer
class's constructor (a test compares them), minus the batch-key plumbing that a classifier
recipe never needs to change, so recipes are checked without importing Composer.  Then
dlrecipes' own (layer-wise lr decay, gradient checkpointing, quantization-aware training),
registered exactly as a user's plugin registers its own; their implementations sit beside this
file and load only when a recipe uses them (:mod:`.finetune` holds the frozen-backbone algorithm
of ``finetune:``, :mod:`.progressive_resizing` Composer's progressive resizing for every loader).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal, Optional, Union

from dlrecipes.algorithms.augment_keys import ON_DEVICE, check_erasing, default_fill, one_policy, policy_or_keys
from dlrecipes.algorithms.teacher import check_distillation_params, teacher_fits_the_run
from dlrecipes.core.distributed import world_size
from dlrecipes.core.durations import Duration, parse_duration
from dlrecipes.core.precision import precision_of
from dlrecipes.errors import RecipeError
from dlrecipes.core.ranges import AtLeastOne, Fraction, NonNegative, Positive, Probability, Range
from dlrecipes.registry import algorithms, datasets


# Prerequisites, checked when a recipe is validated: each returns a problem or None.
def _needs_pil_dataset(on_batches: str):
    """The check of an algorithm that augments PIL images, naming ``on_batches``: the one that does it on tensors."""

    def check(config) -> Optional[str]:
        if datasets.get(config.dataset.name).metadata.get("pil_images") and config.trainer.loader != "device":
            return None
        pil = ", ".join(e.name for e in datasets if e.metadata.get("pil_images"))
        given = ("the device loader yields batches of tensors" if config.trainer.loader == "device"
                 else f"dataset '{config.dataset.name}' yields tensors")
        return (f"augments PIL images before ToTensor, and {given}; use algorithms.{on_batches}, which does it "
                f"on whole batches of tensors on the device (or a PIL dataset: {pil})")

    return check


def _needs_pixels(config) -> Optional[str]:
    if datasets.get(config.dataset.name).metadata.get("pixels", True):
        return None
    return (f"works on pixel values (it undoes the loader's normalisation), and dataset '{config.dataset.name}' "
            "yields random tensors; use an image dataset (digits, cifar10, image_folder, ...)")


def _needs_bottleneck_resnet(config) -> Optional[str]:
    from dlrecipes.models.registered import BOTTLENECK_RESNETS

    if config.model.name == "torchvision" and config.model.params.get("arch") in BOTTLENECK_RESNETS:
        return None
    return (
        "drops torchvision ResNet Bottleneck blocks; use model {name: torchvision, arch: resnet50} "
        f"(or {', '.join(BOTTLENECK_RESNETS[1:])})"
    )


@algorithms.register("channels_last", changes_network=True, checkpoint_state=False)
def channels_last():
    """Store activations in NHWC memory order (faster convolutions on tensor-core GPUs)."""
    from composer.algorithms import ChannelsLast

    return ChannelsLast()


@algorithms.register("label_smoothing", image_label_batch="smooths batch[1] as the class labels")
def label_smoothing(smoothing: Probability = 0.1):
    """Blend one-hot targets with the uniform distribution (Szegedy et al. 2016): Composer's, with no read-back."""
    from dlrecipes.algorithms.soft_targets import LabelSmoothing

    return LabelSmoothing(smoothing=smoothing)


@algorithms.register("blurpool", changes_network=True)
def blurpool(replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True, min_channels: int = 16):
    """Anti-aliased downsampling: blur before strided convolutions and max-pools (Zhang 2019)."""
    from composer.algorithms import BlurPool

    return BlurPool(
        replace_convs=replace_convs, replace_maxpools=replace_maxpools, blur_first=blur_first, min_channels=min_channels
    )


@algorithms.register("ema", conflicts_with={"swa": "both replace the weights used for evaluation"},
                     checkpoint_state=True)
def ema(
    half_life: Optional[Duration] = "1000ba",
    smoothing: Optional[float] = None,
    ema_start: Duration = "0.0dur",
    update_interval: Optional[Duration] = None,
):
    """Evaluate with an exponential moving average of the weights."""
    from composer.algorithms import EMA

    return EMA(half_life=half_life, smoothing=smoothing, ema_start=ema_start, update_interval=update_interval)


@algorithms.register("progressive_resizing", image_label_batch="resizes batch[0] as the images")
def progressive_resizing(
    mode: Literal["resize", "crop"] = "resize",
    initial_scale: float = 0.5,
    finetune_fraction: float = 0.2,
    delay_fraction: float = 0.5,
    size_increment: int = 4,
    resize_targets: bool = False,
):
    """Train on downscaled images early, growing to full size (Composer resizes the batches; FFCV decodes
    at the size)."""
    from dlrecipes.algorithms.progressive_resizing import ProgressiveResizing

    return ProgressiveResizing(
        mode=mode,
        initial_scale=initial_scale,
        finetune_fraction=finetune_fraction,
        delay_fraction=delay_fraction,
        size_increment=size_increment,
        resize_targets=resize_targets,
    )


@algorithms.register(
    "mixup",
    conflicts_with={"cutmix": "both replace the labels of every batch"},
    image_label_batch="mixes batch[0] as the images and batch[1] as the labels",
)
def mixup(alpha: Positive = 0.2, interpolate_loss: bool = False):
    """Train on convex combinations of pairs of examples and their labels (Zhang et al. 2017)."""
    from composer.algorithms import MixUp

    from dlrecipes.algorithms.soft_targets import without_read_backs

    return without_read_backs(MixUp(alpha=alpha, interpolate_loss=interpolate_loss))


@algorithms.register("cutmix", image_label_batch="mixes boxes of batch[0] as the images and batch[1] as the labels")
def cutmix(alpha: Positive = 1.0, interpolate_loss: bool = False, uniform_sampling: bool = False):
    """Paste a box from another image and mix the labels by area (Yun et al. 2019)."""
    from composer.algorithms import CutMix

    from dlrecipes.algorithms.soft_targets import without_read_backs

    return without_read_backs(CutMix(alpha=alpha, interpolate_loss=interpolate_loss, uniform_sampling=uniform_sampling))


@algorithms.register("cutout", image_label_batch="masks batch[0] as the images")
def cutout(num_holes: AtLeastOne = 1, length: Fraction = 0.5, uniform_sampling: bool = False):
    """Zero out random square patches of each image (DeVries & Taylor 2017)."""
    from composer.algorithms import CutOut

    return CutOut(num_holes=num_holes, length=length, uniform_sampling=uniform_sampling)


@algorithms.register("gradient_clipping")
def gradient_clipping(clipping_type: Literal["norm", "value", "adaptive"] = "norm", clipping_threshold: Positive = 1.0):
    """Clip gradients by global norm, by value, or adaptively (AGC) before each step."""
    from composer.algorithms import GradientClipping

    return GradientClipping(clipping_type=clipping_type, clipping_threshold=clipping_threshold)


@algorithms.register("randaugment", requires=_needs_pil_dataset("batch_randaugment"), image_label_batch="augments the one image of each sample")
def randaugment(severity: int = 9, depth: int = 2, augmentation_set: Literal["all", "safe", "original"] = "all"):
    """Apply `depth` random image augmentations of strength `severity` to each training image."""
    from composer.algorithms import RandAugment

    return RandAugment(severity=severity, depth=depth, augmentation_set=augmentation_set)


@algorithms.register("augmix", requires=_needs_pil_dataset("batch_augmix"), image_label_batch="augments the one image of each sample")
def augmix(
    severity: int = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: Literal["all", "safe", "original"] = "all",
):
    """Mix several chains of augmentations of each image (Hendrycks et al. 2020)."""
    from composer.algorithms import AugMix

    return AugMix(severity=severity, depth=depth, width=width, alpha=alpha, augmentation_set=augmentation_set)


@algorithms.register("colout", image_label_batch="drops rows and columns of batch[0] as the images")
def colout(p_row: Probability = 0.15, p_col: Probability = 0.15, batch: bool = True, resize_target: Union[bool, Literal["auto"]] = "auto"):
    """Drop random rows and columns of each image: smaller, faster batches."""
    from composer.algorithms import ColOut

    return ColOut(p_row=p_row, p_col=p_col, batch=batch, resize_target=resize_target)


@algorithms.register("sam", checkpoint_state=True, reads_back=(
    "Composer's SAM optimizer tests each pass's loss on the host (`if loss:`) before stepping: one read-back per "
    "step (two on its ascent steps, every `interval`), as in Composer's Trainer"))
def sam(rho: Positive = 0.05, epsilon: Positive = 1e-12, interval: AtLeastOne = 1):
    """Sharpness-aware minimisation every `interval` steps (Foret et al. 2020)."""
    from composer.algorithms import SAM

    return SAM(rho=rho, epsilon=epsilon, interval=interval)


@algorithms.register("swa", checkpoint_state=True)
def swa(
    swa_start: Duration = "0.7dur",
    swa_end: Duration = "0.97dur",
    update_interval: Duration = "1ep",
    schedule_swa_lr: bool = False,
    anneal_strategy: Literal["linear", "cos"] = "linear",
    anneal_steps: int = 10,
    swa_lr: Optional[float] = None,
):
    """Stochastic weight averaging over the end of training (Izmailov et al. 2018)."""
    from composer.algorithms import SWA

    return SWA(
        swa_start=swa_start, swa_end=swa_end, update_interval=update_interval, schedule_swa_lr=schedule_swa_lr,
        anneal_strategy=anneal_strategy, anneal_steps=anneal_steps, swa_lr=swa_lr,
    )


@algorithms.register("stochastic_depth", requires=_needs_bottleneck_resnet, changes_network=True, reads_back=(
    "Composer's stochastic bottleneck tests its drop rate, a device tensor, in each block's forward: 16 per ResNet-50 step"))
def stochastic_depth(
    target_layer_name: Literal["ResNetBottleneck"] = "ResNetBottleneck",
    stochastic_method: Literal["block", "sample"] = "block",
    drop_rate: float = 0.2,
    drop_distribution: Literal["uniform", "linear"] = "linear",
    drop_warmup: Union[float, Duration] = 0.0,
):
    """Randomly skip residual blocks during training (torchvision ResNet bottleneck blocks)."""
    from composer.algorithms import StochasticDepth

    return StochasticDepth(
        target_layer_name=target_layer_name, stochastic_method=stochastic_method, drop_rate=drop_rate,
        drop_distribution=drop_distribution, drop_warmup=drop_warmup,
    )


@algorithms.register("squeeze_excite", changes_network=True)
def squeeze_excite(latent_channels: float = 64, min_channels: int = 128):
    """Add squeeze-and-excitation blocks after convolutions with enough channels (Hu et al. 2018)."""
    from composer.algorithms import SqueezeExcite

    return SqueezeExcite(latent_channels=latent_channels, min_channels=min_channels)


@algorithms.register("layer_freezing")
def layer_freezing(freeze_start: float = 0.5, freeze_level: float = 1.0):
    """Progressively freeze the earliest layers from freeze_start (fraction of training) on."""
    from composer.algorithms import LayerFreezing

    return LayerFreezing(freeze_start=freeze_start, freeze_level=freeze_level)


@algorithms.register(
    "selective_backprop", image_label_batch="scores samples by running the model on batch[0] against batch[1]"
)
def selective_backprop(
    start: float = 0.5, end: float = 0.9, keep: float = 0.5, scale_factor: float = 1.0, interrupt: int = 2
):
    """Backpropagate only the highest-loss fraction `keep` of each batch between start and end."""
    from composer.algorithms import SelectiveBackprop

    return SelectiveBackprop(start=start, end=end, keep=keep, scale_factor=scale_factor, interrupt=interrupt)


def _ghost_batch_fits(config) -> Optional[str]:
    ghost = config.algorithms["ghost_batchnorm"].get("ghost_batch_size", 32)
    micro = config.trainer.device_train_microbatch_size
    batch = micro if isinstance(micro, int) else config.trainer.batch_size
    if ghost <= batch:
        return None
    return f"ghost_batch_size={ghost} is larger than the batch each device sees ({batch}); lower it"


@algorithms.register("ghost_batchnorm", requires=_ghost_batch_fits, changes_network=True)
def ghost_batchnorm(ghost_batch_size: AtLeastOne = 32):
    """Normalise over sub-batches of ghost_batch_size instead of the whole batch."""
    from composer.algorithms import GhostBatchNorm

    return GhostBatchNorm(ghost_batch_size=ghost_batch_size)


@algorithms.register("weight_standardization", changes_network=True)
def weight_standardization(n_last_layers_ignore: int = 0):
    """Standardise convolution weights to zero mean and unit variance (Qiao et al. 2019)."""
    from composer.algorithms import WeightStandardization

    return WeightStandardization(n_last_layers_ignore=n_last_layers_ignore)


@algorithms.register("layerwise_lr_decay")
def layerwise_lr_decay(decay: float = 0.75, block_depth: AtLeastOne = 2):
    """Smaller learning rates nearer the input: block d of D trains at lr * decay ** (D - 1 - d)."""
    from dlrecipes.algorithms.layerwise_lr_decay import LayerwiseLRDecay

    return LayerwiseLRDecay(decay=decay, block_depth=block_depth)


@algorithms.register("gradient_checkpointing", changes_network=True)
def gradient_checkpointing(targets: Optional[list[str]] = None, every: AtLeastOne = 1):
    """Recompute the activations of residual blocks in backward instead of storing them (memory for compute)."""
    from dlrecipes.algorithms.gradient_checkpointing import GradientCheckpointing

    return GradientCheckpointing(targets=targets, every=every)


@algorithms.register(
    "distillation",
    image_label_batch="runs the teacher on batch[0] as the images and blends its loss with the labels' loss",
    validator=check_distillation_params,
    requires=teacher_fits_the_run,
    paths=("teacher",),
)
def distillation(
    teacher: Union[str, dict[str, Any]],
    temperature: Positive = 4.0,
    alpha: Annotated[float, Range(0, 1)] = 0.5,
    kind: Literal["soft", "hard"] = "soft",
    teacher_sha256: Optional[str] = None,
):
    """Knowledge distillation from a frozen teacher (a run directory, a checkpoint or a model spec; Hinton et al. 2015)."""
    from dlrecipes.algorithms.distillation import Distillation

    return Distillation(teacher, temperature=temperature, alpha=alpha, kind=kind, teacher_sha256=teacher_sha256)


# --- quantization-aware training -------------------------------------------------------------

_QAT_TIMES = ("start", "freeze_bn", "freeze_observers")


def _qat_times(params: dict) -> dict[str, str]:
    """The recipe's QAT times, defaults filled in, unset freezes left out."""
    defaults = {k: p.default for k, p in inspect.signature(qat).parameters.items() if k in _QAT_TIMES}
    times = {k: params.get(k, defaults[k]) for k in _QAT_TIMES}
    return {k: v for k, v in times.items() if v is not None}


def _check_qat_times(params: dict, path: str) -> None:
    """The freezes come after ``start`` (checked where the units agree; Composer checks nothing)."""
    times = _qat_times(params)
    start = parse_duration(times["start"])
    for key in ("freeze_bn", "freeze_observers"):
        if key in times and parse_duration(times[key])[1] == start[1] and parse_duration(times[key])[0] < start[0]:
            raise RecipeError(
                f"{path}.{key}: {times[key]!r} comes before start {times['start']!r}; "
                "it freezes what QAT inserts, so give a time at or after start"
            )


def _qat_fits_the_run(config) -> Optional[str]:
    """QAT runs in fp32, in one process, uncompiled, and its times fall inside training."""
    t = config.trainer
    if precision_of(t.precision).mixed:
        return f"fake quantization needs fp32 activations; trainer.precision is {t.precision} (use fp32)"
    if t.compile is not False:
        return (
            "swaps the network's modules mid-training, which a torch.compile'd model does not follow; "
            "set trainer.compile=false"
        )
    if getattr(config, "task", None) is not None:
        return "quantizes single-output classifiers; remove the task section (several inputs/outputs)"
    if t.fsdp is not None or world_size() > 1:
        return "runs in a single process (DDP/FSDP would not keep the inserted observers in sync); train on one device"
    end = parse_duration(t.max_duration)
    for key, value in _qat_times(config.algorithms["qat"]).items():
        number, unit = parse_duration(value)
        if (unit == "dur" and number >= 1) or (unit == end[1] and number >= end[0]):
            # a problem of one key: name it (requires' messages name only the algorithm)
            raise RecipeError(
                f"algorithms.qat.{key}: {value!r} is not before the end of training "
                f"(trainer.max_duration={t.max_duration}); QAT would never {'start' if key == 'start' else 'freeze'}"
            )
    return None


@algorithms.register(
    "qat",
    conflicts_with={
        "ema": "EMA keeps weights by name, and the QAT switch renames the fused layers",
        "swa": "SWA averages a copy of the network made before the QAT switch",
    },
    requires=_qat_fits_the_run,
    validator=_check_qat_times,
    changes_network=True,
)
def qat(
    run_dir=None,
    /,
    start: Duration = "0.5dur",
    backend: Literal["x86", "fbgemm", "qnnpack"] = "x86",
    freeze_bn: Optional[Duration] = None,
    freeze_observers: Optional[Duration] = None,
    export: bool = True,
):
    """Quantization-aware training from `start` (conv-bn folding, int8 fake quantization); exports int8 TorchScript."""
    from dlrecipes.algorithms.qat import QAT
    from dlrecipes.records.layout import RunDir

    export_dir = RunDir(run_dir).exports if export and run_dir is not None else None
    return QAT(start=start, backend=backend, freeze_bn=freeze_bn, freeze_observers=freeze_observers, export_dir=export_dir)


# --- strong augmentation of whole batches on the training device (dlrecipes/algorithms/batch_augment.py) ---

@algorithms.register("batch_randaugment", conflicts_with=one_policy("batch_randaugment"),
                     image_label_batch=ON_DEVICE, validator=policy_or_keys("randaugment"), requires=_needs_pixels)
def batch_randaugment(
    policy: Optional[str] = None,
    num_ops: AtLeastOne = 2,
    magnitude: NonNegative = 9,
    num_magnitude_bins: AtLeastOne = 31,
    magnitude_std: NonNegative = 0.0,
    p: Annotated[float, Range(0, 1)] = 1.0,
    ops: Literal["torchvision", "timm"] = "torchvision",
    fill: Optional[list[float]] = None,
):
    """RandAugment on whole batches on the device (any loader); or a timm string such as rand-m9-mstd0.5-inc1."""
    import dlrecipes.algorithms.augment_policy as augment_policy
    from dlrecipes.algorithms.augment_keys import parse_timm
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    if policy is not None:
        keys = parse_timm(policy)
        num_ops, magnitude, num_magnitude_bins = keys["num_ops"], keys["magnitude"], keys["num_magnitude_bins"]
        magnitude_std, p, ops = keys["magnitude_std"], keys["p"], keys["ops"]
    return BatchAugmentation("batch_randaugment", augment_policy.randaugment_policy(
        num_ops, magnitude, num_magnitude_bins, magnitude_std, p, ops, default_fill(fill, ops)))


@algorithms.register("batch_trivialaugment", conflicts_with=one_policy("batch_trivialaugment"),
                     image_label_batch=ON_DEVICE, requires=_needs_pixels)
def batch_trivialaugment(num_magnitude_bins: Annotated[int, Range(2)] = 31, fill: Optional[list[float]] = None):
    """TrivialAugmentWide on whole batches on the device: one op per image at a random magnitude."""
    import dlrecipes.algorithms.augment_policy as augment_policy
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    return BatchAugmentation("batch_trivialaugment", augment_policy.trivialaugment_policy(
        num_magnitude_bins, default_fill(fill, "torchvision")))


@algorithms.register("batch_augmix", conflicts_with=one_policy("batch_augmix"), image_label_batch=ON_DEVICE,
                     validator=policy_or_keys("augmix"), requires=_needs_pixels)
def batch_augmix(
    policy: Optional[str] = None,
    severity: Annotated[int, Range(1, 10)] = 3,
    width: AtLeastOne = 3,
    depth: int = -1,
    alpha: Positive = 1.0,
    all_ops: bool = True,
    fill: Optional[list[float]] = None,
):
    """AugMix on whole batches on the device (Hendrycks et al. 2020); or a timm string such as augmix-m5-w4-d2."""
    import dlrecipes.algorithms.augment_policy as augment_policy
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    ops = "torchvision"
    if policy is not None:
        from dlrecipes.algorithms.augment_keys import parse_timm

        keys = parse_timm(policy)
        severity, width, depth, alpha, ops = keys["severity"], keys["width"], keys["depth"], keys["alpha"], keys["ops"]
    return BatchAugmentation("batch_augmix", augment_policy.augmix_policy(
        severity, width, depth, alpha, all_ops, ops, default_fill(fill, ops)))


@algorithms.register("batch_color_jitter", image_label_batch=ON_DEVICE, requires=_needs_pixels)
def batch_color_jitter(
    brightness: NonNegative = 0.4,
    contrast: NonNegative = 0.4,
    saturation: NonNegative = 0.4,
    hue: Annotated[float, Range(0, 0.5)] = 0.0,
    p: Annotated[float, Range(0, 1)] = 1.0,
):
    """Color jitter on whole batches on the device: per image, brightness, contrast, saturation, hue in random order."""
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    def around_one(x: float):
        return (max(0.0, 1.0 - x), 1.0 + x) if x > 0 else None

    ranges = {"brightness": around_one(brightness), "contrast": around_one(contrast),
              "saturation": around_one(saturation), "hue": (-hue, hue) if hue > 0 else None}
    return BatchAugmentation("batch_color_jitter", jitter={"ranges": ranges, "p": p})


@algorithms.register("batch_random_erasing", image_label_batch=ON_DEVICE, validator=check_erasing)
def batch_random_erasing(
    p: Annotated[float, Range(0, 1)] = 0.25,
    scale: list[float] = [0.02, 0.33],  # noqa: B006 (read only)
    ratio: list[float] = [0.3, 3.3],  # noqa: B006
    value: Union[float, Literal["random"]] = 0.0,
):
    """Random erasing on whole normalised batches on the device (Zhong et al. 2017): a box per image, 0 or noise."""
    from dlrecipes.algorithms.batch_augment import BatchAugmentation

    return BatchAugmentation("batch_random_erasing",
                             erasing={"p": p, "scale": tuple(scale), "ratio": tuple(ratio), "value": value})
