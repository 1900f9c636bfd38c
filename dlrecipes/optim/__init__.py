"""Optimizers and learning-rate schedules, registered in :mod:`.registered` (the schedules Composer
lacks are in :mod:`.lr_schedules`).
"""

from dlrecipes.optim import registered  # noqa: F401  (registers the built-ins)
