"""What a run leaves on disk, and what keeps it safe: checkpoints (written atomically, resumed
from, trusted or not), the per-epoch history and its plots, the run directory's lock, and the
check that a resumed run is the same run.  Nothing here registers anything."""
