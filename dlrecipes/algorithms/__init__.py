"""Training-time algorithms (Composer's ``Algorithm`` objects), registered by name.

Composer's own speedup algorithms are wrapped in :mod:`.composer_algorithms`: one small
factory each, whose signature mirrors the Composer class so recipes are checked without
importing Composer.
"""

from dlrecipes.algorithms import composer_algorithms  # noqa: F401  (registers the built-ins)
