"""Checkpoints that survive ``kill -9``, and loading that does not trust strangers.

Writing: every file goes to ``<name>-partial`` first, is fsynced, then renamed over its
final name (``os.replace`` is atomic on POSIX), and the directory is fsynced.  The
``latest-rank0.pt`` link is replaced the same way (a new link under a temporary name,
renamed over the old one), so at every instant it points at a complete file.  A file
under a final name is therefore always complete; a ``-partial`` file is garbage from an
interrupted save and is removed on the next resume.

Resuming: the newest checkpoint that loads wins.  ``latest`` is only a hint: after a
kill between the rename and the relink it may lag one save behind, and a file damaged
later (disk, copy) is renamed ``*.damaged`` and skipped with a warning.

Reading: a checkpoint never runs code.  Every checkpoint a command reads is loaded
tensors-only unless the user passes ``--trust-checkpoint``: see
:mod:`dlrecipes.records.checkpoint_safety`, whose one check every loader here goes through.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dlrecipes.core.distributed import lost_peer
from dlrecipes.errors import DataError, UserError, first_line
from dlrecipes.records.checkpoint_file import NOT_A_CHECKPOINT, file_problem
from dlrecipes.records.checkpoint_safety import (  # noqa: F401 - read from here too
    UnreadableCheckpoint,
    UntrustedCheckpoint,
    check_globals,
    check_trusted,
    load_file,
    read_checkpoint,
    unsafe_globals,
)
from dlrecipes.records.layout import (
    CHECKPOINT_DIR,
    PERIODIC_CHECKPOINT,
    is_periodic,
    latest_checkpoint_name,
    periodic_checkpoints_glob,
    periodic_progress,
)

PARTIAL_SUFFIX = "-partial"  # not ".partial": Composer reads "x.pt.<ext>" as a compressed file


class CheckpointSaveError(UserError):
    """A save failed (disk full, permissions); the previous checkpoint is intact."""


def fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries (a rename is durable once its folder is synced), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(partial: Path, final: Path) -> None:
    """Make a fully written ``partial`` file durable, then atomically give it its final name."""
    fsync(partial)
    os.replace(partial, final)
    fsync(final.parent)


def atomic_write(final: Path, write: Callable[[Any], None]) -> None:
    """``write(f)`` into ``final-partial``, then :func:`commit`; on failure the old ``final`` stays."""
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    try:
        with open(partial, "wb") as f:
            write(f)
        commit(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def relink(link: Path, target: Path) -> None:
    """Point the symlink ``link`` at ``target`` (relative) without a moment where it is missing."""
    tmp = link.with_name(link.name + ".new-link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)
    fsync(link.parent)


def checkpoint_batch(path: Path) -> int:
    return periodic_progress(path)[1] if is_periodic(path) else -1


def _save_failed(path: str, exc: BaseException, previous: str | None) -> CheckpointSaveError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
    kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
    return CheckpointSaveError(
        f"checkpoint.save: writing {path} failed ({reason}); {kept}. Training stopped: fix the cause "
        "(free space, permissions) and rerun the same command with --resume."
    )


def _count_earlier(saved: list[str], folder: Path, rank: int) -> None:
    """The periodic checkpoints of ``rank`` already in ``folder`` (a resumed run's), oldest first, put before those
    the saver has in ``saved``."""
    earlier = sorted(
        (p for p in folder.glob(periodic_checkpoints_glob(rank)) if not p.is_symlink()),
        key=lambda p: checkpoint_batch(p.with_name(p.name.replace(f"rank{rank}", "rank0"))),
    )
    known = set(saved)
    saved[:0] = [str(p) for p in earlier if str(p) not in known]


def make_saver(folder: Path, save_interval: str, keep: int):
    """A Composer CheckpointSaver whose local saves are atomic (see the module docstring)."""
    from composer.callbacks import CheckpointSaver
    from composer.utils import checkpoint as composer_checkpoint
    from composer.utils import dist

    class AtomicCheckpointSaver(CheckpointSaver):
        def fit_start(self, state, logger):
            """``keep`` counts the checkpoints a resumed run wrote before too (oldest first), so disk use
            does not grow with every preemption."""
            super().fit_start(state, logger)
            _count_earlier(self.saved_checkpoints, Path(folder), dist.get_global_rank())

        def _save_checkpoint(self, state, logger):
            if state.fsdp_sharded_state_dict_enabled or self.remote_file_name is not None:
                return super()._save_checkpoint(state, logger)  # directories / uploads: Composer's way
            self.last_checkpoint_batch = state.timestamp.batch
            pattern = self.filename.format(state, keep_placeholders=True)
            final = composer_checkpoint.get_save_filename(state, pattern)
            self.all_saved_checkpoints_to_timestamp[final] = state.timestamp
            partial = composer_checkpoint.PartialFilePath(pattern + PARTIAL_SUFFIX).format(state)
            previous = self.saved_checkpoints[-1] if self.saved_checkpoints else None
            try:
                written = composer_checkpoint.save_checkpoint(
                    state,
                    filename=pattern + PARTIAL_SUFFIX,
                    weights_only=self.weights_only,
                    ignore_keys=self.ignore_keys,
                )
                if not written:  # ranks other than 0 write nothing
                    return
                commit(Path(written), Path(final))
                if self.latest_filename is not None and self.num_checkpoints_to_keep != 0:
                    relink(Path(self.latest_filename.format(state)), Path(final))
            except (OSError, RuntimeError) as exc:  # torch's zip writer reports a full disk as RuntimeError
                Path(partial).unlink(missing_ok=True)
                if lost_peer(exc):  # the save's collective found another process gone: not a disk problem
                    raise
                raise _save_failed(final, exc, previous) from None
            self.saved_checkpoints.append(final)
            if self.num_checkpoints_to_keep >= 0:
                self._rotate_checkpoints(sharding_enabled=False)

    saver = AtomicCheckpointSaver(
        folder=str(folder),
        filename=PERIODIC_CHECKPOINT,
        remote_file_name=None,
        latest_filename=latest_checkpoint_name("{rank}"),
        latest_remote_file_name=None,
        save_interval=save_interval,
        num_checkpoints_to_keep=keep,
    )
    # Composer's saver makes a temporary folder for remote symlinks (ours has none) and leaves it to the garbage
    # collector, which warns (ResourceWarning) at whatever moment it runs: removed at once
    saver.tmp_dir_for_symlink.cleanup()
    return saver


def save_atomically(state, path: Path) -> None:
    """Composer's checkpoint of ``state`` at ``path`` (rank 0 writes), never half-written under that name."""
    from composer.utils import checkpoint as composer_checkpoint

    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        written = composer_checkpoint.save_checkpoint(state, filename=str(partial))
        if written:
            commit(Path(written), path)
    except (OSError, RuntimeError) as exc:
        partial.unlink(missing_ok=True)
        if lost_peer(exc):
            raise
        raise _save_failed(str(path), exc, str(path) if path.exists() else None) from None


# --- resuming ---------------------------------------------------------------------------


def describe_damage(path: Path) -> str | None:
    """What is wrong with ``path`` as a checkpoint file before unpickling it (None: nothing seen): missing, not a
    regular file, empty, another kind of file, a truncated archive, a record failing its checksum, a malformed
    pickle, a tensor record that does not match its declaration (:func:`~.checkpoint_safety.file_problem`)."""
    return file_problem(path, checksums=True)


def loadable(path: Path, trust: bool = False, key: str = "--checkpoint") -> str | None:
    """None if ``path`` loads as a Composer checkpoint, else why not (a load, tensors-only unless ``trust``: the only
    honest test).  A file that needs more than the allowlist of :mod:`dlrecipes.records.checkpoint_safety` is not
    damaged but refused (``UntrustedCheckpoint``), before anything of it is loaded."""
    problem = describe_damage(path)
    if problem is not None:
        return problem
    try:
        check_globals(path, trust, key)  # (UntrustedCheckpoint raised as it is)
    except UnreadableCheckpoint as exc:
        return exc.problem
    try:
        state = load_file(path, trust, key)
    except UntrustedCheckpoint:
        raise
    except Exception as exc:  # a bad pickle, a legacy file cut short, a RecursionError: all mean "not usable"
        first = first_line(exc, 200, "")
        return f"{NOT_A_CHECKPOINT} ({type(exc).__name__}{': ' + first if first else ''})"
    return _not_composer(state)


def _not_composer(loaded: Any) -> str | None:
    """Why ``loaded`` (what a checkpoint file holds) is not a Composer checkpoint whose model can be loaded, or None."""
    inner = loaded.get("state") if isinstance(loaded, dict) else None
    if not (isinstance(inner, dict) and "model" in inner):
        return f"{NOT_A_CHECKPOINT} (no state/model in it)"
    model = inner["model"]
    if not (isinstance(model, dict) and all(isinstance(k, str) for k in model)):
        return f"{NOT_A_CHECKPOINT} (its state/model is a {type(model).__name__}, not the model's tensors by name)"
    return None


def check_checkpoint(path: Path, trust: bool = False, key: str = "--checkpoint") -> None:
    """Refuse, in one line naming the file, a checkpoint that is missing, empty, truncated, not a Composer
    checkpoint, or (unless ``trust``) holding Python objects beyond tensors and plain data."""
    problem = loadable(path, trust, key)
    if problem is not None:
        raise DataError(
            f"{key}: {path} {problem}; nothing was changed. Use another checkpoint of the run "
            f"(--checkpoint best, latest or a file in its {CHECKPOINT_DIR}/ folder)"
        )


def damaged_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Checkpoints set aside as damaged (``*.damaged``) in ``checkpoint_dir``."""
    return sorted(checkpoint_dir.glob("*.damaged")) if checkpoint_dir.is_dir() else []


def resume_point(checkpoint_dir: Path, repair: bool = True, trust: bool = False, key: str = "--resume") -> Path | None:
    """The newest complete checkpoint in ``checkpoint_dir`` (``latest`` relinked to it), or None.

    Leftover ``-partial`` files of an interrupted save are removed; damaged checkpoints newer than the
    one that loads are renamed ``*.damaged`` (kept for inspection) with a warning.  When none loads,
    nothing is renamed and the error names every damaged file and the two ways on.  ``repair=False``
    (reading a run, not continuing it): the same answer, and nothing in the folder changes.  A checkpoint
    holding Python objects beyond tensors and plain data is refused (unless ``trust``), nothing renamed: it is
    not damaged, and continuing an older one would hide it.
    """
    if not checkpoint_dir.is_dir():
        return None
    if not repair:
        return newest_that_loads(checkpoint_dir, trust, key)[0]
    candidates = sorted(checkpoint_dir.glob(periodic_checkpoints_glob(0)), key=checkpoint_batch, reverse=True)
    latest = checkpoint_dir / latest_checkpoint_name(0)
    damaged: list[tuple[Path, str]] = []
    for candidate in candidates:
        problem = loadable(candidate, trust, key)
        if problem is not None:
            damaged.append((candidate, problem))
            continue
        # a checkpoint to continue from: now (not before) the leftovers go and the damaged ones are set aside
        for leftover in checkpoint_dir.glob(f"*{PARTIAL_SUFFIX}"):
            print(f"note: removing {leftover}, left by a save that was interrupted", file=sys.stderr)
            leftover.unlink()
        (latest.with_name(latest.name + ".new-link")).unlink(missing_ok=True)
        for path, why in damaged:
            kept = path.with_name(path.name + ".damaged")
            print(f"warning: checkpoint {path} {why}; it is now {kept.name}", file=sys.stderr)
            path.rename(kept)
        if damaged:
            print(f"warning: resuming from {candidate}, the newest checkpoint that loads", file=sys.stderr)
        if not (latest.is_symlink() and latest.resolve() == candidate.resolve()):
            relink(latest, candidate)
        return candidate
    if damaged:
        named = "; ".join(f"{path.name} {why}" for path, why in damaged[:3]) + (" ..." if len(damaged) > 3 else "")
        raise NoCheckpointToResume(checkpoint_dir.parent, f"no checkpoint in {checkpoint_dir} loads ({named})")
    return None


def newest_that_loads(
    checkpoint_dir: Path, trust: bool = False, key: str = "--checkpoint"
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest periodic checkpoint in ``checkpoint_dir`` that loads (None: none does, or there is none), and the
    newer ones that do not, each with why (:func:`loadable`); nothing in the folder changes.  One holding objects
    beyond tensors is refused (unless ``trust``), as :func:`resume_point` refuses it."""
    candidates = sorted(checkpoint_dir.glob(periodic_checkpoints_glob(0)), key=checkpoint_batch, reverse=True)
    skipped: list[tuple[Path, str]] = []
    for candidate in candidates:
        problem = loadable(candidate, trust, key)
        if problem is None:
            return candidate, skipped
        skipped.append((candidate, problem))
    return None, skipped


def none_loads(where: Any, skipped: list[tuple[Path, str]]) -> UserError:
    """The refusal of ``--checkpoint latest`` when no periodic checkpoint of the run at ``where`` loads: the ones
    tried, each with why."""
    named = "; ".join(f"{path.name} {why}" for path, why in skipped[:3]) + (" ..." if len(skipped) > 3 else "")
    return UserError(f"--checkpoint: no periodic checkpoint of {where} loads ({named}); use --checkpoint best")


def skipped_note(skipped: list[tuple[Path, str]], chosen: Path) -> str:
    """The line saying which newer checkpoints ``--checkpoint latest`` passed over, and why, and which it uses."""
    named = "; ".join(f"{CHECKPOINT_DIR}/{path.name} {why}" for path, why in skipped[:3])
    more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return f"note: {named}{more}; using {chosen.name}, the newest checkpoint that loads"


class NoCheckpointToResume(DataError):
    """``--resume`` found nothing to continue from in a run that has results: it refuses, changing nothing."""

    def __init__(self, run_dir: Path, why: str):
        super().__init__(
            f"--resume: {why}; nothing was changed. To train this run again from the start, pass "
            f"--restart run_name={run_dir.name} instead of --resume (the old run is kept, renamed "
            f"{run_dir.name}.restarted-<time>); "
            "or keep it as it is and train under another run_name"
        )
        self.run_dir = run_dir


# --- loading weights from a file (fine-tuning) --------------------------------------------


def model_weights(loaded: Any, path: Path, key: str = "checkpoint.load_path") -> dict[str, Any]:
    """The model's state dict inside a Composer checkpoint, a timm/torchvision file or a bare state dict."""
    import torch

    if isinstance(loaded, dict) and isinstance(loaded.get("state"), dict) and "model" in loaded["state"]:
        weights = loaded["state"]["model"]  # Composer: keys like "module.conv1.weight"
    elif isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        weights = loaded["state_dict"]
    elif isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        weights = loaded["model"]
    else:
        weights = loaded
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise DataError(f"{key}: {path} holds no model weights (expected a Composer checkpoint or a state dict)")
    return weights


def load_model_weights(
    model,
    weights: dict[str, Any],
    path: Path,
    ignore: Iterable[str] = (),
    strict: bool = True,
    key: str = "checkpoint.load_path",
) -> dict[str, list[str]]:
    """Copy ``weights`` into the Composer model ``model``; returns what was ignored or missing.

    Keys are matched as Composer names them (``module.<layer>``); a bare network's state
    dict (timm, torchvision, ``torch.save(net.state_dict())``) is matched under ``module.``.
    ``ignore`` holds glob patterns, written either as Composer's ``state/model/module.fc*``
    or as plain key globs (``module.fc*``, ``*head*``).  A shape mismatch that no pattern
    covers is an error naming the keys and the fix.
    """
    own = model.state_dict()
    if not any(k in own for k in weights) and any(f"module.{k}" in own for k in weights):
        weights = {f"module.{k}": v for k, v in weights.items()}
    patterns = [p.removeprefix("state/model/") for p in ignore]
    ignored = sorted(k for k in weights if any(fnmatch.fnmatchcase(k, p) for p in patterns))
    kept = {k: v for k, v in weights.items() if k not in ignored}
    mismatched = [
        f"{k} {tuple(v.shape)} vs the model's {tuple(own[k].shape)}"
        for k, v in kept.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    if mismatched:
        first_key = mismatched[0].split(" ")[0]
        raise UserError(
            f"{key}: {path} does not fit the model: {'; '.join(mismatched[:3])}"
            f"{' ...' if len(mismatched) > 3 else ''}. For a new head (another class count), skip those weights "
            f"with checkpoint.load_ignore_keys (e.g. ['{first_key.rsplit('.', 1)[0]}.*'])"
        )
    unexpected = sorted(k for k in kept if k not in own)
    missing = sorted(k for k in own if k not in kept and not any(fnmatch.fnmatchcase(k, p) for p in patterns))
    if strict and (unexpected or missing):
        what = []
        if missing:
            what.append(f"missing from the file: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
        if unexpected:
            what.append(f"not in the model: {', '.join(unexpected[:4])}{' ...' if len(unexpected) > 4 else ''}")
        raise UserError(
            f"{key}: {path} does not match the model ({'; '.join(what)}). Set checkpoint.load_strict=false to load "
            "what matches, or checkpoint.load_ignore_keys to skip keys"
        )
    model.load_state_dict(kept, strict=False)
    return {"ignored": ignored, "missing": missing, "unexpected": unexpected}
