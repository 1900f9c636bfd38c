"""Weight initialisations a recipe can ask for by name (``model.init``).

``mosaicml``: the scheme of MosaicML's ResNet ImageNet benchmark (mosaicml/examples,
examples/benchmarks/resnet_imagenet/model.py): Kaiming-normal weights for every convolution and
linear layer (fan-in, ReLU gain), BatchNorm weights drawn uniformly from [0, 1) and biases zero;
with a binary cross-entropy loss the classifier's bias starts at -log(num_classes), so that every
class starts at a predicted probability of about 1 / num_classes.
"""

from __future__ import annotations

import math

from torch import nn

INITS = ("torchvision", "mosaicml")


def mosaicml_init(module: nn.Module, num_classes: int, binary_cross_entropy: bool) -> nn.Module:
    """Re-initialise ``module`` in place (from torch's global generator, seeded by the run)."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight)
        if isinstance(layer, nn.BatchNorm2d):
            nn.init.uniform_(layer.weight, 0.0, 1.0)
            nn.init.zeros_(layer.bias)
        if binary_cross_entropy and isinstance(layer, nn.Linear) and layer.bias is not None:
            nn.init.constant_(layer.bias, -math.log(num_classes))
    return module
