"""Optimizers and learning-rate schedules, registered in :mod:`.registered` (the schedules Composer
lacks are in :mod:`.lr_schedules`).

Modules:
- :mod:`.groups`: the parameter groups every optimizer factory shares
- :mod:`.muon`: Muon on the filters and a second optimizer on the rest, stepped as one
- :mod:`.timm_meanings`: what the keys of timm's optimizers mean
- :mod:`.timm_optim`: timm's optimizers by name, validated without timm (timm_optimizers.json)
"""

from dlrecipes.optim import registered  # noqa: F401  (registers the built-ins)
