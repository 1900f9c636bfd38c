"""The run directory's layout: the one place that names what a run writes, and :class:`RunDir`, which
says where each thing is.

```
runs/<run name>/
  recipe.yaml         the resolved recipe (recipe.before-<time>.yaml: one a resume with other settings replaced)
  history.csv         a row per epoch (records.history)
  summary.json        how the run went (records.history)
  loss.png accuracy.png lr.png   the plots (records.plots)
  train-rank<N>.log   each process's text log
  run.lock            who trains in it now (records.run_lock); in a bucket, run.lease (records.store.lease)
  checkpoints/        ep<E>-ba<B>-rank<N>.pt (periodic), latest-rank<N>.pt (a link to the newest),
                      best.pt and best.json (the best evaluation's: callbacks.best_checkpoint); in a bucket
                      (runs_dir: s3://...), latest.txt: the newest checkpoint whose upload is confirmed
  report/             the class report (metrics.report)
  export/             the models exported for inference (ExportDir): model.torchscript.pt and/or model.onnx,
                      verify.json (each checked against the trained network), preprocess.json, classes.json
  eval/<name>/        an evaluation's report (eval.json)
  profiler/ tensorboard/ mlruns/   torch_profiler's traces, TensorBoard's events, MLflow's local store (loggers)
```

Every other module asks a :class:`RunDir` (an export folder, in a run or not: an :class:`ExportDir`), or these
constants, for a path; none spells a name (``tests/test_architecture.py`` checks).  A ``RunDir`` is only a view
of a path: making the directory is :func:`dlrecipes.records.run_dir.make_run_dir`'s, once per run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

RECIPE_FILE = "recipe.yaml"
REPLACED_RECIPE = "recipe.before-{stamp}.yaml"
SUMMARY_FILE = "summary.json"
HISTORY_FILE = "history.csv"
LOCK_FILE = "run.lock"
LEASE_FILE = "run.lease"  # in a bucket's run (runs_dir: s3://...): who writes it now (records.store.lease)
LOG_FILE = "train-rank{rank}.log"  # Composer's FileLogger fills in {rank} itself
PLOT_FILES = {"loss": "loss.png", "accuracy": "accuracy.png", "lr": "lr.png"}
CHECKPOINT_DIR = "checkpoints"
PERIODIC_CHECKPOINT = "ep{epoch}-ba{batch}-rank{rank}.pt"  # Composer's CheckpointSaver fills it in
LATEST_CHECKPOINT = "latest-rank{rank}.pt"
BEST_CHECKPOINT = "best.pt"
BEST_INFO = "best.json"
REMOTE_LATEST = "latest.txt"  # in a bucket's run (runs_dir: s3://...): the newest checkpoint whose upload is confirmed
REPORT_DIR = "report"
EXPORT_DIR = "export"
EXPORTED_MODELS = {"torchscript": "model.torchscript.pt", "onnx": "model.onnx"}  # by format, in predict's order
EXPORT_REPORT = "verify.json"
PREPROCESS_FILE = "preprocess.json"
CLASSES_FILE = "classes.json"
EVAL_DIR = "eval"
EVAL_FILE = "eval.json"
PROFILER_DIR = "profiler"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_STORE_DIR = "mlruns"  # the mlflow logger's file store, when no tracking_uri is given
EVAL_NAME_MAX = 120  # characters of an evaluation's folder name at most (after_training.evaluate shortens it)
_MOST_DIGITS = {"epoch": 6, "batch": 10, "rank": 5}  # a periodic checkpoint's numbers, as large as a run makes them

_PERIODIC = re.compile(r"ep(\d+)-ba(\d+)-rank0(?:\.w[0-9a-f]{8})?\.pt$")  # in a bucket: its writer's tag (store.commit)


_RECORD_SUFFIXES = (".json", ".csv", ".png", ".txt", ".yaml")  # what a report or an evaluation folder holds
_TOP_RECORD = re.compile(r"(recipe\.before-[0-9-]+\.yaml|train-rank[0-9]+\.log)$")  # replaced recipes, logs


def is_record(relative: str) -> bool:
    """Whether ``relative`` (a path in a run directory, ``/``-separated) is one of the run's records: what the
    commands after training read or show (the recipe, summary, history, plots, logs, the bucket's pointer and
    best.json, reports and evaluations). A run copied from a bucket brings these alone: never its checkpoints or
    exports (brought one at a time, when asked), and never a file no run writes (a ``.py`` beside its recipe)."""
    parts = relative.split("/")
    if len(parts) == 1:
        name = parts[0]
        return name in (RECIPE_FILE, SUMMARY_FILE, HISTORY_FILE, *PLOT_FILES.values()) or bool(_TOP_RECORD.match(name))
    if parts[0] == CHECKPOINT_DIR:
        return len(parts) == 2 and parts[1] in (REMOTE_LATEST, BEST_INFO)
    within = {REPORT_DIR: 2, EVAL_DIR: 3}.get(parts[0])
    return within == len(parts) and parts[-1].endswith(_RECORD_SUFFIXES)


def is_export_file(relative: str) -> bool:
    """Whether ``relative`` is a file an export folder holds (:class:`ExportDir`): what is brought of an export."""
    return relative in (PREPROCESS_FILE, CLASSES_FILE, EXPORT_REPORT, *EXPORTED_MODELS.values())


def latest_checkpoint_name(rank: int | str = 0) -> str:
    """The name of the link to ``rank``'s newest periodic checkpoint (``"{rank}"``: Composer's template)."""
    return LATEST_CHECKPOINT.format(rank=rank)


def periodic_checkpoints_glob(rank: int | str = 0) -> str:
    """A glob pattern matching ``rank``'s periodic checkpoints."""
    return PERIODIC_CHECKPOINT.format(epoch="*", batch="*", rank=rank)


def periodic_progress(path: Path) -> tuple[int, int]:
    """(epochs, batches) trained when rank 0's periodic checkpoint ``path`` was written (from its name);
    (0, 0) for any other file."""
    match = _PERIODIC.match(Path(path).name)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def is_periodic(path: Path) -> bool:
    """Whether ``path`` is named as rank 0's periodic checkpoint."""
    return _PERIODIC.match(Path(path).name) is not None


def longest_relative_path() -> str:
    """The longest path, relative to a run directory, of a file the run holds (written by training or by the commands
    after it: an evaluation's report, whose folder name has up to :data:`EVAL_NAME_MAX` characters, is the longest).
    A bucket's key and a staging folder's path must leave room for it (``RemoteRoot.check_room``)."""
    most = {key: "9" * digits for key, digits in _MOST_DIGITS.items()}
    report_file = "per_class_accuracy.png"  # the longest name metrics.report (which owns it) writes in a report folder
    report = max(EVAL_FILE, report_file, key=len)
    return max(
        [
            f"{CHECKPOINT_DIR}/{name}"
            for name in (PERIODIC_CHECKPOINT.format(**most), BEST_CHECKPOINT, BEST_INFO, REMOTE_LATEST)
        ]
        + [f"{EXPORT_DIR}/{name}" for name in (*EXPORTED_MODELS.values(), EXPORT_REPORT, PREPROCESS_FILE, CLASSES_FILE)]
        + [
            REPLACED_RECIPE.format(stamp="20260101-000000"),
            LOG_FILE.format(rank=most["rank"]),
            LEASE_FILE,
            f"{REPORT_DIR}/{report_file}",
            f"{EVAL_DIR}/{'e' * EVAL_NAME_MAX}/{report}",
        ],
        key=len,
    )


class PathView:
    """A view of a folder's path that converts like a path (``os.fspath``, ``str``, ``Path(view)``)."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


class RunDir(PathView):
    """A run's directory (``runs/<run name>``) and where each of its files is.

    Only a view of the path (making it is :func:`dlrecipes.records.run_dir.make_run_dir`'s); it
    converts like a path (``os.fspath``, ``str``, ``Path(run)``), and ``RunDir(run)`` is ``run``'s view.
    """

    __slots__ = ()

    @property
    def name(self) -> str:
        return self.path.name

    # --- the records -------------------------------------------------------------------------------------

    @property
    def recipe(self) -> Path:
        return self.path / RECIPE_FILE

    def replaced_recipe(self, stamp: str) -> Path:
        """Where the recorded recipe goes when a resume with other settings replaces it."""
        return self.path / REPLACED_RECIPE.format(stamp=stamp)

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def history(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def records(self) -> tuple[Path, Path, Path]:
        """The recipe, the summary and the history (what a tracker uploads first)."""
        return self.recipe, self.summary, self.history

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    def log(self, rank: int | str) -> Path:
        """The text log of the process ``rank`` (``"{rank}"``: the template Composer's FileLogger fills in)."""
        return self.path / LOG_FILE.format(rank=rank)

    def plot(self, name: str) -> Path:
        """The plot ``name`` (one of :data:`PLOT_FILES`: loss, accuracy, lr)."""
        return self.path / PLOT_FILES[name]

    def plots(self) -> list[Path]:
        """The images in the run directory (the plots), sorted."""
        return sorted(self.path.glob("*.png"))

    def is_run(self) -> bool:
        """Whether the folder holds a run (a run records its recipe first)."""
        return self.recipe.is_file()

    # --- checkpoints -------------------------------------------------------------------------------------

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def latest(self) -> Path:
        """The link to rank 0's newest periodic checkpoint."""
        return self.checkpoints / latest_checkpoint_name(0)

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST_CHECKPOINT

    @property
    def best_info(self) -> Path:
        """``best.json``: the monitored metric, its value and when ``best.pt`` was saved."""
        return self.checkpoints / BEST_INFO

    @classmethod
    def holding(cls, checkpoint: Path) -> RunDir | None:
        """The run whose checkpoints folder holds the file ``checkpoint``, or None (a file elsewhere)."""
        folder = Path(checkpoint).parent
        run = cls(folder.parent)
        return run if folder.name == CHECKPOINT_DIR and run.is_run() else None

    # --- what is made from a run -------------------------------------------------------------------------

    @property
    def report(self) -> Path:
        """The class report's folder (confusion matrix, per-class accuracy)."""
        return self.path / REPORT_DIR

    @property
    def exports(self) -> Path:
        """The folder of the models exported for inference."""
        return self.path / EXPORT_DIR

    def eval_report(self, name: str) -> Path:
        """The folder of the evaluation ``name`` (``dlrecipes eval``)."""
        return self.path / EVAL_DIR / name

    @property
    def profiler(self) -> Path:
        return self.path / PROFILER_DIR

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD_DIR

    @property
    def mlflow_store(self) -> Path:
        """The mlflow logger's local file store (a tracking_uri elsewhere leaves it unused)."""
        return self.path / MLFLOW_STORE_DIR


class ExportDir(PathView):
    """A folder of models exported for inference (a run's ``export/``, or wherever ``dlrecipes export --out``
    writes) and where each of its files is; only a view of the path, as :class:`RunDir` is."""

    __slots__ = ()

    def model(self, fmt: str) -> Path:
        """The model exported in ``fmt`` (one of :data:`EXPORTED_MODELS`: torchscript, onnx)."""
        return self.path / EXPORTED_MODELS[fmt]

    @property
    def report(self) -> Path:
        """``verify.json``: each exported file checked against the trained network."""
        return self.path / EXPORT_REPORT

    @property
    def preprocess(self) -> Path:
        """How an image file becomes the model's input (:mod:`dlrecipes.data.preprocess`)."""
        return self.path / PREPROCESS_FILE

    @property
    def classes(self) -> Path:
        """The class names, in the order of the logits."""
        return self.path / CLASSES_FILE

    @property
    def files(self) -> tuple[Path, ...]:
        """What a model is predicted from: the preprocessing, the class names and each format's model."""
        return (self.preprocess, self.classes, *(self.model(fmt) for fmt in EXPORTED_MODELS))


def beside(checkpoint: Path, folder: str) -> Path:
    """``folder`` (:data:`EVAL_DIR`, :data:`EXPORT_DIR`) next to a checkpoint file that is in no run directory."""
    return Path(checkpoint).parent / folder


__all__ = [
    "is_export_file",
    "is_record",
    "BEST_CHECKPOINT",
    "BEST_INFO",
    "CHECKPOINT_DIR",
    "CLASSES_FILE",
    "EVAL_DIR",
    "EVAL_FILE",
    "EVAL_NAME_MAX",
    "EXPORTED_MODELS",
    "EXPORT_DIR",
    "EXPORT_REPORT",
    "ExportDir",
    "HISTORY_FILE",
    "LATEST_CHECKPOINT",
    "LOCK_FILE",
    "LOG_FILE",
    "MLFLOW_STORE_DIR",
    "PERIODIC_CHECKPOINT",
    "PLOT_FILES",
    "PREPROCESS_FILE",
    "PROFILER_DIR",
    "RECIPE_FILE",
    "REPLACED_RECIPE",
    "REPORT_DIR",
    "RunDir",
    "SUMMARY_FILE",
    "TENSORBOARD_DIR",
    "beside",
    "is_periodic",
    "latest_checkpoint_name",
    "longest_relative_path",
    "periodic_checkpoints_glob",
    "periodic_progress",
]
