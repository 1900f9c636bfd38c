"""ResNet-18 and pre-activation ResNet-18 with 32x32 stems (He et al. 2015/2016).

ImageNet ResNets start with a 7x7 stride-2 convolution and a max-pool, which throws away
most of a 32x32 image; the CIFAR variants use one 3x3 stride-1 convolution instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class PreActBlock(nn.Module):
    """BN and ReLU before each convolution; the shortcut carries the raw input."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class CifarResNet(nn.Module):
    def __init__(
        self,
        block: type[nn.Module],
        num_blocks: tuple[int, ...] = (2, 2, 2, 2),
        num_classes: int = 10,
        in_chans: int = 3,
        preact: bool = False,
    ):
        super().__init__()
        self.num_classes = num_classes
        self.in_planes = 64
        self.conv1 = nn.Conv2d(in_chans, 64, 3, stride=1, padding=1, bias=False)
        # a pre-activation net normalises inside its blocks and once more at the end
        self.bn1 = nn.Identity() if preact else nn.BatchNorm2d(64)
        self.stem_relu = nn.Identity() if preact else nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, 64, num_blocks[0], 1)
        self.layer2 = self._make_layer(block, 128, num_blocks[1], 2)
        self.layer3 = self._make_layer(block, 256, num_blocks[2], 2)
        self.layer4 = self._make_layer(block, 512, num_blocks[3], 2)
        self.final_norm = nn.Sequential(nn.BatchNorm2d(512), nn.ReLU(inplace=True)) if preact else nn.Identity()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def _make_layer(self, block: type[nn.Module], planes: int, count: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (count - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stem_relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = self.pool(self.final_norm(out))
        return self.fc(torch.flatten(out, 1))


def resnet18(num_classes: int = 10, in_chans: int = 3) -> CifarResNet:
    return CifarResNet(BasicBlock, (2, 2, 2, 2), num_classes, in_chans)


def preact_resnet18(num_classes: int = 10, in_chans: int = 3) -> CifarResNet:
    return CifarResNet(PreActBlock, (2, 2, 2, 2), num_classes, in_chans, preact=True)
