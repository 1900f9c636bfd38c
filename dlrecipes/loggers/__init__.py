"""Logger destinations, registered in :mod:`.registered` (experiment trackers); the run's text log
(:mod:`.run_log`) and terminal output (:mod:`.terminal`) are always there.

Modules:
- :mod:`.notebook`: NotebookReport: the terminal report drawn in a notebook cell
- :mod:`.read_back`: ReadsAtInterval: device values read back every read_every batches
- :mod:`.run_record`: RecordsTheRun: a tracker's parameters, tags, artifacts and status
- :mod:`.wandb_logger`: Composer's WandBLogger, for current wandb, given the run
"""

from dlrecipes.loggers import registered  # noqa: F401  (registers the built-ins)
