"""Sweeps: a grid (or a random sample, or an Optuna search) of overrides, each point one training run, resumable,
with a table.

``dlrecipes sweep RECIPE optimizer.lr=0.01,0.03 trainer.precision=fp32,amp_bf16 [--seeds N]`` runs the
Cartesian product of the comma-separated values (times N seeds), each point as its own
``dlrecipes train`` process under ``runs/<sweep name>/<point name>/``, named from its values
(``lr=0.01,precision=amp_bf16,seed=1``).  A value in brackets or braces stays one value
(``'key=[a,b]'``), as in Hydra's multirun.  ``--trials N --search random`` instead samples N points from
ranges: ``loguniform(1e-4,1e-1)``, ``uniform(a,b)``, ``randint(a,b)`` (both ends included),
``choice(a,b,c)``.

Every point is validated before the first one starts.  Running the same sweep again skips finished
points, resumes stopped or killed ones from their checkpoints and reruns failed or diverged ones.
Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stops the running trainings as training always stops (a
checkpoint, exit 75) and then the sweep (exit 75).  At the end ``summary.csv``, ``summary.md`` and
``summary.png`` in the sweep's folder hold one row per grid point (seeds aggregated as mean ± std) with each
point's outcome and its reason; the sweep exits 0 when every point finished or was pruned, else 1.

Three modules, one per step:

- :mod:`dlrecipes.tools.sweep.plan`: the points (the grid, the random sample, an Optuna search's ranges) and
  the sweep's folder with its ``sweep.yaml``;
- :mod:`dlrecipes.tools.sweep.run`: the trainings, ``--parallel`` at a time, their signals, and the Optuna
  search that picks each next trial;
- :mod:`dlrecipes.tools.sweep.report`: each point's outcome, the line printed as a training ends, the table
  and the plot.

On a CPU the trainings are forked from a server (:mod:`dlrecipes.runtime.fork_server`) that imported, once, what a
training imports: the program the caller gives (the CLI's, :data:`dlrecipes.api.FORKED`).
"""

from __future__ import annotations

from dlrecipes.tools.sweep.plan import (
    Point,
    SweepPlan,
    check_points,
    overrides_of,
    plan_sweep,
    point_name,
    prepare_folder,
    probe_points,
    split_values,
)
from dlrecipes.tools.sweep.run import finish_folder, get_ready, run_sweep

__all__ = [
    "Point",
    "SweepPlan",
    "check_points",
    "finish_folder",
    "get_ready",
    "overrides_of",
    "plan_sweep",
    "point_name",
    "prepare_folder",
    "probe_points",
    "run_sweep",
    "split_values",
]
