"""Logger destinations, registered in :mod:`.registered` (experiment trackers); the run's text log
(:mod:`.run_log`) and terminal output (:mod:`.terminal`) are always there.
"""

from dlrecipes.loggers import registered  # noqa: F401  (registers the built-ins)
