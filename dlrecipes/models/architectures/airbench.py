"""The network of the airbench CIFAR-10 speedruns (Jordan 2024, "94% on CIFAR-10 in 3.29 seconds"), as a module.

A 2x2 convolution of 24 channels without padding (initialised by patch whitening at the start of training,
:mod:`dlrecipes.callbacks.speedrun`; its weight never trained), GELU, three blocks of convolution, 2x2 max-pool,
batch norm and GELU, each followed by one more convolution (airbench94) or two with a residual connection around
them (airbench96), a 3x3 max-pool, a linear layer without bias and a fixed output scale.  Every 3x3 convolution
starts as the identity on its first input channels (a Dirac kernel); batch norms keep their scale at 1 and train
their shift only.  The layers are numbered as in the speedrun's ``nn.Sequential``, so that the two networks'
state dicts have the same keys.
"""

from __future__ import annotations

import torch
from torch import nn


class DiracConv(nn.Conv2d):
    """A convolution (3x3 'same' without bias unless told) whose kernel starts as the identity on its first input
    channels (the rest as torch initialises them) and whose bias starts at zero."""

    def __init__(self, channels_in: int, channels_out: int, kernel_size: int = 3, padding="same", bias: bool = False):
        super().__init__(channels_in, channels_out, kernel_size=kernel_size, padding=padding, bias=bias)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        nn.init.dirac_(self.weight.data[: self.weight.size(1)])


class Block(nn.Module):
    """conv, 2x2 max-pool, norm, GELU, then ``convs - 1`` more (conv, norm, GELU); residual around those with 3."""

    def __init__(self, channels_in: int, channels_out: int, convs: int, norm):
        super().__init__()
        self.conv1 = DiracConv(channels_in, channels_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = norm(channels_out)
        self.conv2 = DiracConv(channels_out, channels_out)
        self.norm2 = norm(channels_out)
        self.residual = convs == 3
        if self.residual:
            self.conv3 = DiracConv(channels_out, channels_out)
            self.norm3 = norm(channels_out)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        shortcut = x
        x = self.activ(self.norm2(self.conv2(x)))
        if self.residual:
            x = self.activ(self.norm3(self.conv3(x))) + shortcut
        return x


class Scale(nn.Module):
    """Multiply by a fixed factor (not trained)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def frozen_scale_norm(momentum: float, eps: float, train_weight: bool):
    """A BatchNorm2d maker: torch's ``momentum`` (the new batch's share), ``eps``, the scale trained or kept at 1."""

    def norm(channels: int) -> nn.BatchNorm2d:
        layer = nn.BatchNorm2d(channels, eps=eps, momentum=momentum)
        layer.weight.requires_grad = train_weight
        return layer

    return norm


def airbench_net(
    widths: tuple[int, int, int] = (64, 256, 256),
    convs_per_block: int = 2,
    num_classes: int = 10,
    in_chans: int = 3,
    whiten_kernel: int = 2,
    scale: float = 1 / 9,
    bn_momentum: float = 0.4,
    bn_eps: float = 1e-12,
    bn_train_weight: bool = False,
) -> nn.Sequential:
    """The speedrun network; ``convs_per_block`` 2 is airbench94's, 3 (with the residual) airbench96's."""
    whiten_width = 2 * in_chans * whiten_kernel**2
    norm = frozen_scale_norm(bn_momentum, bn_eps, bn_train_weight)
    whiten = DiracConv(in_chans, whiten_width, whiten_kernel, padding=0, bias=True)
    whiten.weight.requires_grad = False  # set from the training images, never trained
    net = nn.Sequential(
        whiten,
        nn.GELU(),
        Block(whiten_width, widths[0], convs_per_block, norm),
        Block(widths[0], widths[1], convs_per_block, norm),
        Block(widths[1], widths[2], convs_per_block, norm),
        nn.MaxPool2d(3),
        nn.Flatten(),
        nn.Linear(widths[2], num_classes, bias=False),
        Scale(scale),
    )
    return net
