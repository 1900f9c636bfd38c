"""A plugin in a plain file: use it with `imports: [./local_plugin.py]` in a recipe (paths are
relative to the recipe) or `--plugin examples/local_plugin.py` on the command line.

    dlrecipes train recipes/quickstart.yaml --plugin examples/local_plugin.py \
        algorithms.input_jitter='{std: 0.05}'
"""

from dlrecipes.registry import algorithms


@algorithms.register("input_jitter")
def input_jitter(std: float = 0.05):
    """Add Gaussian noise of the given std to every training input batch (a tiny augmentation)."""
    import torch
    from composer.core import Algorithm, Event

    class InputJitter(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_DATALOADER

        def apply(self, event, state, logger):
            inputs, targets = state.batch
            state.batch = (inputs + std * torch.randn_like(inputs), targets)

    return InputJitter()
