"""A small late-fusion CNN: one conv encoder per input image, features concatenated, one head per output."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _encoder(in_chans: int, width: int, grid: int) -> nn.Sequential:
    # adaptive pooling to a small grid (not to 1x1) keeps where things are, which halves of a digit need
    return nn.Sequential(
        nn.Conv2d(in_chans, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(grid),
        nn.Flatten(),
    )


class FusionCNN(nn.Module):
    """``forward(*images)`` -> ``{output name: logits or values}``.

    ``input_channels`` gives one encoder per input (``shared_encoder``: one encoder for all,
    when the inputs are views of the same kind); ``output_sizes`` one linear head per output.
    """

    def __init__(
        self,
        input_channels: Sequence[int],
        output_sizes: dict[str, int],
        width: int = 16,
        hidden: int = 128,
        dropout: float = 0.1,
        shared_encoder: bool = False,
        grid: int = 4,
    ):
        super().__init__()
        if shared_encoder and len(set(input_channels)) > 1:
            raise ValueError(f"shared_encoder needs inputs with the same channel count, got {list(input_channels)}")
        self.num_inputs = len(input_channels)
        count = 1 if shared_encoder else self.num_inputs
        self.encoders = nn.ModuleList(_encoder(c, width, grid) for c in list(input_channels)[:count])
        features = 2 * width * grid * grid * self.num_inputs
        self.fuse = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout))
        self.heads = nn.ModuleDict({name: nn.Linear(hidden, size) for name, size in output_sizes.items()})

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        if len(inputs) != self.num_inputs:
            raise ValueError(f"FusionCNN was built for {self.num_inputs} inputs and got {len(inputs)}")
        encoders = self.encoders if len(self.encoders) == self.num_inputs else [self.encoders[0]] * self.num_inputs
        fused = self.fuse(torch.cat([encode(x) for encode, x in zip(encoders, inputs)], dim=1))
        return {name: head(fused) for name, head in self.heads.items()}
