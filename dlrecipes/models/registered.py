"""Models: the built-in model factories, registered in :data:`dlrecipes.registry.models`.

A model factory takes keyword parameters from the recipe and returns a ``torch.nn.Module``
mapping a batch of images to class logits.  The builder fills ``num_classes``,
``in_chans`` and ``input_shape`` from the dataset when a factory takes them and the recipe
leaves them out.  Each is a few lines; torch and timm are imported inside the factories (the
architectures live in :mod:`.architectures`), so that listing and validating recipes stays fast.
"""

from __future__ import annotations

from typing import Literal

from dlrecipes.config.checks import refuse_small_inputs
from dlrecipes.core.ranges import AtLeastOne, Classes, Probability, Size
from dlrecipes.errors import DataError, RecipeError
from dlrecipes.registry import models


@models.register("cnn_simple", input_size=(1, 28, 28), param_count=421_642)
def cnn_simple(num_classes: Classes = 10, in_chans: AtLeastOne = 1, width: Size = 32, hidden: Size = 128):
    """Small baseline CNN (2 conv + max-pool, 1 hidden layer), MNIST-sized inputs.

    Args:
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images (1 grey, 3 RGB); filled from the dataset when left out.
        width: channels of the first convolution; the second has twice as many.
        hidden: units of the hidden dense layer before the output layer.
    """
    from dlrecipes.models.architectures.simple_cnn import CNNSimple

    return CNNSimple(num_classes, in_chans, width, hidden)


@models.register("mnist_cnn", input_size=(1, 28, 28), param_count=268_650)
def mnist_cnn(num_classes: Classes = 10, in_chans: AtLeastOne = 1, width: Size = 32, dropout: Probability = 0.4):
    """Stronger MNIST CNN (BN conv blocks, strided 5x5 downsampling, dropout), aims at >= 99.2%.

    Args:
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images (1 grey, 3 RGB); filled from the dataset when left out.
        width: channels of the first stage's convolutions; the second stage has 2x, the last convolution 4x.
        dropout: the probability of zeroing an activation, after each downsampling stage and before the classifier.
    """
    from dlrecipes.models.architectures.simple_cnn import MnistCNN

    return MnistCNN(num_classes, in_chans, width, dropout)


_FUSION_HEADS = {"digit": 10, "parity": 2}


@models.register("fusion_cnn", multi_io=True, input_size=(1, 28, 14))
def fusion_cnn(
    input_channels: tuple[int, ...] = (1, 1),
    output_sizes: dict[str, int] = _FUSION_HEADS,
    width: Size = 16,
    hidden: Size = 128,
    dropout: Probability = 0.1,
    shared_encoder: bool = False,
):
    """Several image inputs (one small BN conv encoder each, or one shared), fused, one linear head per output.

    Args:
        input_channels: the channels of each input image, in the task's input order; filled from the task and
            the dataset when left out.
        output_sizes: each output's name and the size of its linear head (its classes, or its regression values);
            filled from the task and the dataset when left out.
        width: channels of each encoder's first convolution; its second has twice as many.
        hidden: units of the fused layer that every head reads.
        dropout: the probability of zeroing a fused feature before the heads.
        shared_encoder: one encoder, the same weights, for every input (the inputs then need the same channel
            count); false: an encoder per input.
    """
    from dlrecipes.models.architectures.fusion_cnn import FusionCNN

    return FusionCNN(input_channels, output_sizes, width, hidden, dropout, shared_encoder)


@models.register("cifar_resnet18", input_size=(3, 32, 32), param_count=11_173_962)
def cifar_resnet18(num_classes: Classes = 10, in_chans: AtLeastOne = 3):
    """ResNet-18 with a 3x3 stride-1 stem for 32x32 images (11.2 M parameters).

    Args:
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images (1 grey, 3 RGB); filled from the dataset when left out.
    """
    from dlrecipes.models.architectures.cifar_resnet import resnet18

    return resnet18(num_classes, in_chans)


@models.register("cifar_preact_resnet18", input_size=(3, 32, 32), param_count=11_172_170)
def cifar_preact_resnet18(num_classes: Classes = 10, in_chans: AtLeastOne = 3):
    """Pre-activation ResNet-18 with a 32x32 stem (He et al. 2016).

    Args:
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images (1 grey, 3 RGB); filled from the dataset when left out.
    """
    from dlrecipes.models.architectures.cifar_resnet import preact_resnet18

    return preact_resnet18(num_classes, in_chans)


@models.register("airbench", input_size=(3, 32, 32), param_count=1_972_792)
def airbench(
    num_classes: Classes = 10,
    in_chans: AtLeastOne = 3,
    widths: tuple[int, int, int] = (64, 256, 256),
    convs_per_block: Literal[2, 3] = 2,
    scaling_factor: float = 1 / 9,
    whiten_kernel: Size = 2,
    batchnorm_momentum: Probability = 0.4,
    batchnorm_eps: float = 1e-12,
    batchnorm_train_weight: bool = False,
):
    """The airbench CIFAR-10 speedruns' network: airbench94's; airbench96's with widths [128, 512, 512], 3 convs.

    Its first convolution is meant to be set by the patch_whitening callback at the start of training.

    Args:
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images (1 grey, 3 RGB); filled from the dataset when left out.
        widths: output channels of the three convolution blocks.
        convs_per_block: 3x3 convolutions per block: 2 (airbench94), or 3 with a residual connection around the
            last two (airbench96).
        scaling_factor: the fixed factor the logits are multiplied by (airbench: 1/9).
        whiten_kernel: side of the first convolution's kernel, whose 2 * in_chans * side**2 channels patch
            whitening sets (airbench: 2).
        batchnorm_momentum: torch's momentum of every batch norm: the share of each batch's statistics in the
            running ones (airbench's 'batchnorm_momentum' 0.6 is the old statistics' share: torch's 0.4).
        batchnorm_eps: added to the batch variance before its square root in every batch norm (airbench: 1e-12).
        batchnorm_train_weight: train the batch norms' scale; false keeps it at 1 and trains the shift only
            (airbench).
    """
    from dlrecipes.models.architectures.airbench import airbench_net

    return airbench_net(
        tuple(widths),
        convs_per_block,
        num_classes,
        in_chans,
        whiten_kernel,
        scaling_factor,
        batchnorm_momentum,
        batchnorm_eps,
        batchnorm_train_weight,
    )


def _check_timm_arch(params: dict, path: str) -> None:
    from dlrecipes.models.arch_names import check_arch

    if params.get("arch") is not None:
        check_arch("timm", params["arch"], path)


@models.register(
    "timm",
    input_size=(3, 224, 224),
    example_params={"arch": "resnet18"},
    validator=_check_timm_arch,
    pretrained="yes: hub or local file",
    paths=("pretrained_path",),
)
def timm_model(
    arch: str,
    num_classes: Classes = 1000,
    in_chans: AtLeastOne = 3,
    pretrained: bool = False,
    pretrained_path: str | None = None,
    drop_rate: Probability = 0.0,
    drop_path_rate: float | None = None,
    min_input_size: AtLeastOne = 64,
    input_shape: tuple[int, int, int] | None = None,
):
    """Any timm architecture by name (`arch`), optionally with pretrained weights (hub or local file).

    Args:
        arch: the timm model name, e.g. 'resnet18' or 'vit_small_patch16_224' (`timm.list_models()` lists them).
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images (1 grey, 3 RGB); filled from the dataset when left out.
        pretrained: start from timm's pretrained weights, downloaded from the hub (the classifier is new when
            the class count differs); false: random initialisation.
        pretrained_path: a local weights file to start from instead of the hub (pretrained is then not needed);
            null: none.
        drop_rate: the dropout probability before the classifier.
        drop_path_rate: the stochastic-depth rate: the largest probability of skipping a residual block during
            training; null: the architecture's default.
        min_input_size: the smallest image side, in pixels, the model accepts: ImageNet networks downsample 32x,
            so smaller data is refused; lower it to train on it anyway.
        input_shape: (channels, height, width) of the input images, read only by the min_input_size check;
            filled from the dataset when left out.
    """
    import timm

    refuse_small_inputs("timm", arch, input_shape, min_input_size)
    kwargs = {"num_classes": num_classes, "in_chans": in_chans, "drop_rate": drop_rate}
    if drop_path_rate is not None:
        kwargs["drop_path_rate"] = drop_path_rate
    if pretrained_path is not None:
        from pathlib import Path

        if not Path(pretrained_path).is_file():
            raise DataError(f"model.pretrained_path: weights file not found: {pretrained_path}")
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay={"file": str(pretrained_path)}, **kwargs)
    if not pretrained:
        return timm.create_model(arch, **kwargs)
    from dlrecipes.models.fetch import fetching_weights

    with fetching_weights(f"timm '{arch}'"):
        return timm.create_model(arch, pretrained=True, **kwargs)


# torchvision ResNets built from Bottleneck blocks (what Composer's stochastic depth targets)
BOTTLENECK_RESNETS = (
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "wide_resnet50_2",
    "wide_resnet101_2",
)


def _check_torchvision_arch(params: dict, path: str) -> None:
    from dlrecipes.models.arch_names import check_arch

    if params.get("arch") is not None:
        check_arch("torchvision", params["arch"], path)


@models.register(
    "torchvision",
    input_size=(3, 224, 224),
    example_params={"arch": "resnet18"},
    validator=_check_torchvision_arch,
    pretrained="yes: local file",
    paths=("pretrained_path",),
)
def torchvision_model(
    arch: str,
    num_classes: Classes = 1000,
    in_chans: AtLeastOne = 3,
    pretrained_path: str | None = None,
    min_input_size: AtLeastOne = 64,
    input_shape: tuple[int, int, int] | None = None,
    init: Literal["torchvision", "mosaicml"] = "torchvision",
    loss: str = "cross_entropy",
):
    """Any torchvision classification model by name (`arch`), e.g. resnet50; weights from a local file.

    Args:
        arch: the torchvision model name, e.g. 'resnet50' (`torchvision.models.list_models()` lists them).
        num_classes: classes the model predicts (logits per image); filled from the dataset when left out.
        in_chans: channels of the input images, filled from the dataset; torchvision models take 3 only.
        pretrained_path: a local state-dict file (torch.save) loaded after initialisation; tensors of another
            shape, such as a classifier for another class count, stay as initialised; null: none.
        min_input_size: the smallest image side, in pixels, the model accepts: ImageNet networks downsample 32x,
            so smaller data is refused; lower it to train on it anyway.
        input_shape: (channels, height, width) of the input images, read only by the min_input_size check;
            filled from the dataset when left out.
        init: 'torchvision' keeps torchvision's initialisation; 'mosaicml' redraws the weights as MosaicML's
            ResNet benchmark does (dlrecipes.models.init).
        loss: the recipe's loss, filled from it (another value is refused); with binary_cross_entropy, init
            mosaicml starts the classifier's bias at -log(classes).
    """
    import torch
    import torchvision

    if in_chans != 3:
        raise RecipeError(f"model.in_chans: torchvision '{arch}' takes 3-channel images, the data has {in_chans}")
    refuse_small_inputs("torchvision", arch, input_shape, min_input_size)
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if init == "mosaicml":
        from dlrecipes.models.init import mosaicml_init

        mosaicml_init(model, num_classes, binary_cross_entropy=loss == "binary_cross_entropy")
    if pretrained_path is not None:
        from pathlib import Path

        if not Path(pretrained_path).is_file():
            raise DataError(f"model.pretrained_path: weights file not found: {pretrained_path}")
        state = torch.load(pretrained_path, map_location="cpu", weights_only=True)
        own = model.state_dict()
        # a different class count: keep the backbone, leave the new classifier freshly initialised
        loadable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        missing = sorted(set(own) - set(loadable))
        model.load_state_dict(loadable, strict=False)
        if any(not k.startswith(("fc.", "classifier.", "heads.")) for k in missing):
            raise DataError(f"model.pretrained_path: {pretrained_path} does not fit '{arch}' (missing {missing[:5]})")
    return model
