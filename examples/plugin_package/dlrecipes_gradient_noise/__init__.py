"""Registers ``gradient_noise`` with dlrecipes (loaded through the package's entry point).

Keep this module light: dlrecipes imports every entry point when it lists or validates
recipes, so torch and Composer are imported inside the factory, not here.
"""

from dlrecipes.registry import algorithms


@algorithms.register("gradient_noise")
def gradient_noise(eta: float = 0.01, gamma: float = 0.55, seed: int = 0):
    """Add annealed Gaussian noise, variance eta / (1 + step) ** gamma, to every gradient."""
    from dlrecipes_gradient_noise.algorithm import GradientNoise

    return GradientNoise(eta=eta, gamma=gamma, seed=seed)
