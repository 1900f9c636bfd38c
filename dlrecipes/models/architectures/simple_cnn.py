"""Small CNNs for MNIST-sized images (1x28x28; any size works thanks to adaptive pooling)."""

from __future__ import annotations

import torch
from torch import nn


class CNNSimple(nn.Module):
    """The baseline: two 3x3 convolutions with max-pooling, then one hidden dense layer.

    No normalisation and no augmentation-specific tricks; on MNIST this kind of net tops
    out near 98.8% test accuracy.
    """

    def __init__(self, num_classes: int = 10, in_chans: int = 1, width: int = 32, hidden: int = 128):
        super().__init__()
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(in_chans, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(7),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 49, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _conv_bn(in_chans: int, out_chans: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_chans, out_chans, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(out_chans),
        nn.ReLU(inplace=True),
    )


class MnistCNN(nn.Module):
    """A stronger MNIST net: batch-normalised conv blocks, strided 5x5 downsampling, dropout.

    The design (two 3x3 convs then a strided 5x5 conv per stage, BN everywhere, dropout
    0.4) is the one widely used to pass 99.5% on MNIST; here it ends in global average
    pooling so it accepts any input size.
    """

    def __init__(self, num_classes: int = 10, in_chans: int = 1, width: int = 32, dropout: float = 0.4):
        super().__init__()
        self.num_classes = num_classes
        w = width
        self.features = nn.Sequential(
            _conv_bn(in_chans, w, 3),
            _conv_bn(w, w, 3),
            _conv_bn(w, w, 5, stride=2),
            nn.Dropout(dropout),
            _conv_bn(w, 2 * w, 3),
            _conv_bn(2 * w, 2 * w, 3),
            _conv_bn(2 * w, 2 * w, 5, stride=2),
            nn.Dropout(dropout),
            _conv_bn(2 * w, 4 * w, 3),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(4 * w, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
