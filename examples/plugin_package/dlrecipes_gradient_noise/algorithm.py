"""Annealed gradient noise (Neelakantan et al., "Adding Gradient Noise Improves Learning for
Very Deep Networks", 2015), written the Composer way: a function that does the work and an
Algorithm that calls it after every backward pass."""

from __future__ import annotations

import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger


def add_gradient_noise(model: torch.nn.Module, std: float, generator: torch.Generator) -> None:
    """Add N(0, std^2) noise to each parameter's gradient, in place."""
    for p in model.parameters():
        if p.grad is not None:
            noise = torch.randn(p.grad.shape, generator=generator, device="cpu").to(p.grad.device, p.grad.dtype)
            p.grad.add_(noise, alpha=std)


class GradientNoise(Algorithm):
    def __init__(self, eta: float = 0.01, gamma: float = 0.55, seed: int = 0):
        self.eta = eta
        self.gamma = gamma
        self.generator = torch.Generator().manual_seed(seed)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_BACKWARD

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        step = int(state.timestamp.batch)
        std = (self.eta / (1 + step) ** self.gamma) ** 0.5
        add_gradient_noise(state.model, std, self.generator)
        logger.log_metrics({"gradient_noise/std": std})
