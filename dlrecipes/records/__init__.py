"""What a run leaves on disk, and what keeps it safe: checkpoints (written atomically, resumed
from, trusted or not), the per-epoch history and its plots, the run directory's lock, and the
check that a resumed run is the same run.  Nothing here registers anything.

Modules:
- :mod:`.checkpoint_file`: a checkpoint file read without unpickling: its pickle's storages against its records
- :mod:`.checkpoint_safety`: every checkpoint read tensors-only, unless --trust-checkpoint
- :mod:`.frames`: a run's records as pandas DataFrames
- :mod:`.layout`: the run directory's layout: RunDir, ExportDir, every file's name
- :mod:`.provenance`: what made a run: software, machine, command, the recipe's origin
- :mod:`.recorded_code`: a run's recorded recipe is data: the plugin files it names checked before any import
- :mod:`.request`: a run handed to another process (a sweep's point): the recipe as loaded, its options
- :mod:`.resume_check`: what --resume may change
- :mod:`.run_dir`: the run directory: its name, creation, recipe, a failed run set aside
- :mod:`.run_files`: summary.json, history.csv, recipe.yaml read back strictly
- :mod:`.run_lock`: run.lock: one training process group per run directory
- :mod:`.runs`: past runs, one row each (dlrecipes runs)
- :mod:`.store`: where a run lives, decided once: a local runs folder or an object store
"""
