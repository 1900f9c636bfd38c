"""Models: built-in factories register themselves in :data:`dlrecipes.registry.models`.

A model factory takes keyword parameters from the recipe and returns a ``torch.nn.Module``
mapping a batch of images to class logits.  The builder fills ``num_classes``,
``in_chans`` and ``input_shape`` from the dataset when a factory takes them and the recipe
leaves them out.
"""

from dlrecipes.models import factories  # noqa: F401  (registers the built-ins)
