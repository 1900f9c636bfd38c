"""The run directory: its name, its creation, the resolved recipe written into it (rank 0), and what
becomes of it when a run fails.  Where each file is inside it: :class:`dlrecipes.records.layout.RunDir`.

A default name is the recipe's name and the start time, made unique by a suffix when another run
took it in the same second (the directory is created at once, so two processes cannot both take
it).  A run that fails before its first checkpoint leaves no directory; one that fails later is
marked in summary.json (``status``), and starting it again under the same name sets it aside as
``<name>.failed-<time>`` with a warning (``--resume`` continues it instead).
"""

from __future__ import annotations

import difflib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrecipes.core.distributed import rank, same_on_all_ranks
from dlrecipes.core.durations import parse_duration
from dlrecipes.core.secrets import redact
from dlrecipes.errors import RecipeError, UserError
from dlrecipes.recipe import RUN_RECIPE_END, RUN_RECIPE_HEADER, run_recipe_text
from dlrecipes.records.checkpoints import NoCheckpointToResume, damaged_checkpoints, resume_point
from dlrecipes.records.layout import (
    CHECKPOINT_DIR,
    RECIPE_FILE,
    REMOTE_LATEST,
    RunDir,
    latest_checkpoint_name,
    periodic_progress,
)
from dlrecipes.records.run_files import DamagedRunFile, read_summary

if TYPE_CHECKING:
    from dlrecipes.config.sections import RecipeConfig
    from dlrecipes.records.run_lock import HeldLock


def choose_run_name(config: RecipeConfig, resume: bool, device: str, runs: Path) -> str:
    """The recipe's run_name; with ``resume``, the newest run of this recipe; else name + timestamp, in ``runs`` (the
    store's folder: ``runs_dir``, or a bucket's local staging folder).  ``resume`` with a run_name that names no run
    is refused (rank 0), with the closest names there are."""
    runs = Path(runs)
    if config.run_name:
        if resume and rank() == 0:
            check_run_exists(runs, config.run_name)
        return config.run_name
    if resume:
        candidates = sorted(
            (p for p in runs.glob(f"{config.name}-*") if RunDir(p).latest.exists()),
            key=lambda p: p.stat().st_mtime,
        )
        if not candidates:
            raise UserError(
                f"--resume: no run of recipe '{config.name}' with a checkpoint under {runs}/ "
                f"(looked for {runs}/{config.name}-*/{CHECKPOINT_DIR}/{latest_checkpoint_name(0)}); "
                "set run_name=... to name the run to continue"
            )
        return candidates[-1].name
    name = _claim_new_name(runs, f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}") if rank() == 0 else ""
    return same_on_all_ranks(name, device, config.trainer.dist_timeout)


RESUME_MISSING = "DLRECIPES_RESUME_MISSING"  # =start: --resume of a run that is not there starts it (for scripts)


def check_run_exists(runs: Path, name: str) -> None:
    """Refuse to continue a run that is not there (a typo would otherwise start a new run quietly).  A script
    that resumes whatever a kill left (a requeued SLURM job, whose first start may have been stopped before it
    made its run directory) sets ``DLRECIPES_RESUME_MISSING=start``: such a run then starts, saying so."""
    if (runs / name).is_dir():
        return
    if os.environ.get(RESUME_MISSING) == "start":
        print(f"note: no run {name!r} in {runs} yet ({RESUME_MISSING}=start): starting it", file=sys.stderr)
        return
    names = sorted(p.parent.name for p in runs.glob(f"*/{RECIPE_FILE}")) if runs.is_dir() else []
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = (
        f"; the closest: {', '.join(close)}"
        if close
        else (f"; it holds {len(names)} run(s) (dlrecipes runs {runs} lists them)" if names else "")
    )
    raise RecipeError(
        f"run_name: --resume found no run {name!r} in {runs}{hint}. Without --resume a new run starts under that name"
    )


def continued_after_torchrun_restart(restart: bool) -> tuple[bool, bool]:
    """A job torchrun restarted (``--max-restarts``: a process or a node failed) resumes its run, or starts it if
    the failure came before the run existed: (resume, restart) for :func:`dlrecipes.api.train`, said in one line."""
    os.environ.setdefault(RESUME_MISSING, "start")
    if rank() == 0:
        count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        print(
            f"note: torchrun restarted the job (restart {count}){' (--restart ignored)' if restart else ''}: "
            "resuming the run from its last checkpoint",
            file=sys.stderr,
            flush=True,
        )
    return True, False


def _claim_new_name(runs: Path, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``...: the first whose directory this process creates (rank 0)."""
    for count in range(1, 1000):
        name = stem if count == 1 else f"{stem}-{count}"
        try:
            make_run_dir(runs / name, claim=True)
        except FileExistsError:
            continue
        return name
    raise UserError(f"runs_dir: {runs} already holds 999 runs named {stem}-*; choose a run_name")


FAILED = ("failed", "diverged")  # summary.json statuses of a run that cannot be continued as it was


def run_status(run_dir: Path) -> str | None:
    """``status`` from a run's summary.json (finished, pruned, stopped, diverged, failed), or None (none, or
    damaged: such a run is not set aside, and starting over it is then refused as for any run)."""
    try:
        summary = read_summary(run_dir)
    except DamagedRunFile:
        return None
    return summary.get("status") if summary else None


def set_aside_failed_run(run_dir: Path) -> Path | None:
    """A failed run's directory, renamed ``<name>.failed-<time>`` so that a new run can take the name (rank 0)."""
    status = run_status(run_dir)
    if rank() != 0 or status not in FAILED:
        return None
    aside = run_dir.with_name(f"{run_dir.name}.{status}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(aside)
    print(
        f"warning: {run_dir} held a run that {'diverged' if status == 'diverged' else 'failed'}; it was moved to "
        f"{aside} and this run starts afresh (pass --resume to continue it from its checkpoint instead)",
        file=sys.stderr,
    )
    return aside


def set_aside_for_restart(run_dir: Path) -> Path | None:
    """``--restart``: the run's directory renamed ``<name>.restarted-<time>`` (kept, with a warning) so that a
    new run starts under the name (rank 0); refused while another process trains in it."""
    from dlrecipes.records import run_lock

    if rank() != 0 or not run_dir.exists():
        return None
    lock = run_lock.acquire(run_dir)  # refuses, naming the holder, while a live process trains in it
    stem = f"{run_dir.name}.restarted-{time.strftime('%Y%m%d-%H%M%S')}"
    aside = next(
        p for p in (run_dir.with_name(stem if n == 1 else f"{stem}-{n}") for n in range(1, 1000)) if not p.exists()
    )
    run_dir.rename(aside)  # the lock goes with it, so no run can start in it meanwhile
    lock.path = aside / lock.path.name
    lock.release()
    print(
        f"warning: --restart: the run that was in {run_dir} is kept as {aside}; this run starts from the beginning",
        file=sys.stderr,
    )
    return aside


def find_resume_point(run_dir: Path, max_duration: str, trust: bool = False) -> Path | None:
    """Where ``--resume`` continues (rank 0): the newest checkpoint that loads, or None for a run that has
    nothing yet.  Refused, before anything is written, when the run has results but no checkpoint that loads
    (starting over would overwrite them), when ``max_duration`` is shorter than what the run has trained, and
    when the checkpoint holds Python objects beyond tensors (unless ``trust``: ``--trust-checkpoint``)."""
    run = RunDir(run_dir)
    folder = run.checkpoints
    point = resume_point(folder, trust=trust)
    if point is None:
        results = [p.name for p in damaged_checkpoints(folder)] + ([run.best.name] if run.best.exists() else [])
        if results:
            raise NoCheckpointToResume(
                run_dir, f"{folder} holds no periodic checkpoint that loads, only {', '.join(results[:4])}"
            )
        return None
    epochs, batches = periodic_progress(point)
    amount, unit = parse_duration(max_duration)
    done = {"ep": epochs, "ba": batches}.get(unit)
    if done is not None and amount < done:
        raise RecipeError(
            f"trainer.max_duration: {max_duration} is shorter than what {run_dir.name} has trained "
            f"({epochs} epochs, {batches} batches: {point.name}); give a longer max_duration to "
            f"continue it, or evaluate it as it is: dlrecipes eval {run_dir}"
        )
    return point


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run wrote a complete checkpoint (periodic or best; a copy of a run in a bucket: the bucket's
    pointer names one)."""
    folder = RunDir(run_dir).checkpoints
    return folder.is_dir() and any(
        (p.suffix == ".pt" or p.name == REMOTE_LATEST) and not p.is_symlink() for p in folder.iterdir()
    )


def discard_empty_run(run: RunDir, lock: HeldLock) -> bool:
    """A new run that failed before its first checkpoint leaves nothing behind (rank 0, holding ``lock``): its
    directory removed, the lock released first.  Returns whether it was removed."""
    import shutil

    if has_checkpoint(run.path):
        return False
    lock.release()
    shutil.rmtree(run.path, ignore_errors=True)
    return True


def make_run_dir(run_dir: Path | RunDir, claim: bool = False) -> RunDir:
    """Create the run directory (rank 0), or one line naming runs_dir and why it cannot be.  Once per run: by
    the fit stage, or, for a default name, by :func:`choose_run_name`, whose creating it is what claims the
    name (``claim``: it must not exist yet; FileExistsError when another process took it)."""
    run = RunDir(run_dir)
    make_writable_dir(run.path, "runs_dir", "run directory ", exist_ok=not claim)
    return run


def make_writable_dir(folder: Path, key: str = "--out", what: str = "", exist_ok: bool = True) -> Path:
    """``folder``, created if needed, or one line naming ``key`` and why it cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=exist_ok)
    except OSError as exc:
        if isinstance(exc, FileExistsError) and not exist_ok:
            raise
        raise UserError(f"{key}: cannot create {what}{folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK):
        raise UserError(f"{key}: {what}{folder} is not writable")
    return folder


def _recipe_body(text: str) -> str:
    """A run's recipe without its header and end line (a run recorded before they were written has neither)."""
    return text.removeprefix(RUN_RECIPE_HEADER).removesuffix(RUN_RECIPE_END)


def record_recipe(run_dir: Path | RunDir, recipe: dict[str, Any], resume: bool) -> None:
    """Write the resolved recipe (as plain data, secrets redacted) into the run directory (rank 0); one an
    earlier part of the run recorded with other settings is kept beside it.  Refused, without ``resume``, in
    a run that has checkpoints."""
    if rank() != 0:
        return
    run = RunDir(run_dir)
    resolved = run_recipe_text(redact(recipe))
    if run.recipe.exists() and not resume and run.checkpoints.exists():
        raise UserError(
            f"run_name: {run} already holds a run; pass --resume to continue it, --restart to train it again "
            "from the beginning (the old run is kept under another name), or choose another run_name"
        )
    if not run.recipe.exists() or _recipe_body(run.recipe.read_text()) != _recipe_body(resolved):
        if run.recipe.exists():
            run.recipe.rename(run.replaced_recipe(time.strftime("%Y%m%d-%H%M%S")))
        run.recipe.write_text(resolved)
