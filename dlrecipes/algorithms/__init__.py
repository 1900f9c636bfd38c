"""Training-time algorithms (Composer's ``Algorithm`` objects), registered in :mod:`.registered`: Composer's
own by name, and dlrecipes' (layer-wise lr decay, gradient checkpointing, quantization-aware
training, progressive resizing for every loader), whose implementations sit beside it.
"""

from dlrecipes.algorithms import registered  # noqa: F401  (registers the built-ins)
