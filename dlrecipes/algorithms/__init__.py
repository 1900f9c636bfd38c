"""Training-time algorithms (Composer's ``Algorithm`` objects), registered by name.

Composer's own speedup algorithms are wrapped in :mod:`.composer_algorithms`: one small
factory each, whose signature mirrors the Composer class so recipes are checked without
importing Composer.  dlrecipes' own (layer-wise lr decay, gradient checkpointing,
quantization-aware training) are registered in :mod:`.dlrecipes_algorithms`, the same way a
plugin registers its own; :mod:`.finetune` holds the frozen-backbone algorithm of ``finetune:``.
"""

from dlrecipes.algorithms import composer_algorithms, dlrecipes_algorithms  # noqa: F401  (register the built-ins)
