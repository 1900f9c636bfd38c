"""A checkpoint never runs code: every checkpoint read tensors-only, unless the user trusts the file.

Unpickling a file can run any command the file asks for, and a file can be replaced after it
was written, so where a file lies (a run's own folder, a bucket) is no reason to trust it.  Every
checkpoint a command reads (``eval``, ``predict``, ``export``, ``--resume``,
``checkpoint.load_path``, a distillation teacher, a file pulled from a bucket) is loaded with
``torch.load(..., weights_only=True)``, which builds tensors and plain data and nothing else,
plus the few globals of :data:`ALLOWED_GLOBALS` (what Composer writes besides tensors: NumPy's
RNG state, the torch version, durations).  :func:`check_trusted` lists the globals a file's
pickle names before anything is loaded and refuses, in one line naming the file and them
(:class:`UntrustedCheckpoint`, exit code 2), one that needs anything else.
``--trust-checkpoint`` (``trust_checkpoint=True``) is the user saying the file is theirs: it is
then unpickled fully.  Composer's own loader (resuming, evaluating, ``load_weights_only: false``)
asks torch for a full unpickle; :func:`tensors_only` makes that load tensors-only too.  The
listing is read statically and a pickle could hide a global from it: the tensors-only load
behind it refuses such a one all the same, in the same line.

Before any of that, whatever ``--trust-checkpoint`` says (trusting a file's code does not make its bytes whole),
the file itself is checked without unpickling anything (:func:`dlrecipes.records.checkpoint_file.file_problem`: a
regular file, a torch archive, a pickle that parses and does not nest too deep, each tensor record as long as its
pickle declares): one that fails is refused in one line naming it (:class:`UnreadableCheckpoint`, exit code 2).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlrecipes.errors import DataError, UserError, first_line
from dlrecipes.records.checkpoint_file import NOT_A_CHECKPOINT, file_problem

# What a checkpoint dlrecipes writes holds besides tensors and plain containers (which torch's tensors-only loader
# builds by itself), found in the checkpoints (periodic and best) of real runs with each registered optimizer,
# scheduler, algorithm, callback and metric, a task's several outputs, a finetune section, a teacher and a resumed
# run: the globals their pickles name (``torch.serialization.get_unsafe_globals_in_checkpoint``), the same five every
# time, and the one class a tensors-only load of them still asked for (a dtype's class, which no pickle names: it
# is built as the dtype's state is set).  Nothing else (tests/test_checkpoint_safety.py checks a run with the
# algorithms and callbacks that keep state).  Each builds plain data and calls nothing else.  The key is the name a
# pickle says, or the class's own name.
ALLOWED_GLOBALS: dict[str, str] = {
    # Composer's "rng" entry holds np.random.get_state(): a tuple with the Mersenne Twister key, a uint32 array
    "numpy._core.multiarray._reconstruct": "NumPy's array rebuild, as NumPy 2 names it",
    "numpy.core.multiarray._reconstruct": "the same, as NumPy 1 (1.26, which dlrecipes supports) names it",
    "numpy.ndarray": "the array it rebuilds",
    "numpy.dtype": "the array's dtype",
    "numpy.dtypes.UInt32DType": "the class of that dtype (uint32), built as the dtype's state is set",
    # Composer's "metadata" holds torch.__version__, a str subclass
    "torch.torch_version.TorchVersion": "the torch version the checkpoint was written with",
    # Composer's "timestamp" (and its CheckpointSaver's record of each saved checkpoint's time)
    "datetime.timedelta": "a Timestamp's wall-clock times (total_wct, epoch_wct, batch_wct)",
}


def _allowed_globals() -> list[tuple[Any, str]]:
    """:data:`ALLOWED_GLOBALS` as ``torch.serialization.safe_globals`` takes them: (object, the name a pickle says)."""
    import datetime

    import numpy as np
    from torch.torch_version import TorchVersion

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    objects = {
        "numpy._core.multiarray._reconstruct": _reconstruct,
        "numpy.core.multiarray._reconstruct": _reconstruct,
        "numpy.ndarray": np.ndarray,
        "numpy.dtype": np.dtype,
        "numpy.dtypes.UInt32DType": type(np.dtype(np.uint32)),
        "torch.torch_version.TorchVersion": TorchVersion,
        "datetime.timedelta": datetime.timedelta,
    }
    assert objects.keys() == ALLOWED_GLOBALS.keys()
    return [(obj, name) for name, obj in objects.items()]


class UntrustedCheckpoint(UserError):
    """A checkpoint needs Python objects beyond tensors and :data:`ALLOWED_GLOBALS`: unpickling it could run
    arbitrary code, so it is not loaded unless the user passes ``--trust-checkpoint``."""

    def __init__(self, path: Path, found: list[str], key: str):
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        super().__init__(
            f"{key}: {path} holds Python objects beyond tensors ({shown}); loading it means a full unpickle, which "
            "can run arbitrary code, so nothing was loaded (a checkpoint dlrecipes writes holds only tensors and "
            "plain data). If you trust the file, pass --trust-checkpoint"
        )
        self.path, self.found = path, found


class UnreadableCheckpoint(DataError):
    """A checkpoint file refused before anything of it is loaded, with or without ``--trust-checkpoint``: not a
    regular file, not a torch archive, a pickle that does not parse or nests too deep, or a tensor record that does
    not match what the pickle declares (:func:`file_problem`)."""

    def __init__(self, path: Path, problem: str, key: str):
        super().__init__(f"{key}: {path} {problem}")
        self.path, self.problem = path, problem


def unsafe_globals(path: Path) -> list[str]:
    """The globals a checkpoint's pickle names beyond what a tensors-only load allows (empty: it loads so)."""
    import zipfile

    import torch

    if not zipfile.is_zipfile(path):  # torch's legacy format cannot be listed: the tensors-only load still refuses
        return []
    return sorted(g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in ALLOWED_GLOBALS)


def check_trusted(path: Path, trust: bool = False, key: str = "checkpoint.load_path") -> None:
    """Refuse a checkpoint that needs a full unpickle (:class:`UntrustedCheckpoint`) unless ``trust`` is set, and,
    trusted or not, one that is no checkpoint or whose tensor records do not match its pickle
    (:class:`UnreadableCheckpoint`, :func:`file_problem`).

    Nothing of the file is unpickled: its pickle is read as instructions.  A file is never trusted for where
    it lies (a run's own folder, a bucket): a file can be replaced after it was written.
    """
    if not path.exists() and not path.is_symlink():
        raise DataError(f"{key}: no checkpoint file at {path}")
    problem = file_problem(path)  # whatever ``trust`` says: trusting a file's code does not make its records whole
    if problem is not None:
        raise UnreadableCheckpoint(path, problem, key)
    check_globals(path, trust, key)


def check_globals(path: Path, trust: bool, key: str) -> None:
    """The one decision whether a checkpoint may be unpickled: refused (:class:`UntrustedCheckpoint`) when its pickle
    names globals beyond :data:`ALLOWED_GLOBALS`, unless ``trust``; a pickle that cannot be read as instructions is
    :class:`UnreadableCheckpoint`. Every load goes through it: :func:`check_trusted` (so :func:`read_checkpoint` and
    :func:`tensors_only`, Composer's loads) and :func:`dlrecipes.records.checkpoints.loadable`."""
    if trust:
        return
    try:
        risky = unsafe_globals(path)
    except Exception as exc:
        raise UnreadableCheckpoint(
            path, f"{NOT_A_CHECKPOINT} ({type(exc).__name__}: {_first_line(exc)})", key
        ) from None
    if risky:
        raise UntrustedCheckpoint(path, risky, key)


def _first_line(exc: BaseException) -> str:
    return first_line(exc, 200, "")


def _refused(exc: BaseException, path: Path, key: str) -> UntrustedCheckpoint | None:
    """The refusal for a tensors-only load that torch stopped at a global the listing did not see (a pickle
    can hide one from a static reading), or None for another failure."""
    import pickle
    import re

    if not isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" not in str(exc):
        return None
    if "Unsupported operand" in str(exc):  # a byte that is no pickle instruction: a malformed file, not a refusal
        return None
    names = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    return UntrustedCheckpoint(path, names or ["an object torch's tensors-only loader refused"], key)


def load_file(path: Path, trust: bool = False, key: str = "--checkpoint") -> Any:
    """``torch.load`` of ``path`` on the CPU: tensors-only with :data:`ALLOWED_GLOBALS`, or, with ``trust``, in full."""
    import torch

    if trust:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        refused = _refused(exc, path, key)
        if refused is not None:
            raise refused from None
        raise


_FORCE, _NO_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextlib.contextmanager
def tensors_only(path: Path | str | None, trust: bool = False, key: str = "--resume") -> Iterator[None]:
    """Every ``torch.load`` inside tensors-only, with :data:`ALLOWED_GLOBALS`, unless ``trust`` (or no ``path``).

    For Composer's loader, which reads ``path`` when the Trainer is built and always asks torch for a full
    unpickle: torch's own switch (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, read at each load) turns that into a
    tensors-only load for as long as the block runs.  The file is checked first (:func:`check_trusted`, one line,
    trusted or not); a global torch refuses here all the same is refused the same way.
    """
    if path:
        check_trusted(Path(path), trust, key)
    if trust or not path:
        yield
        return
    import torch

    saved = {name: os.environ.pop(name, None) for name in (_FORCE, _NO_FORCE)}
    os.environ[_FORCE] = "1"
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            yield
    except Exception as exc:
        refused = _refused(exc, Path(path), key)
        if refused is not None:
            raise refused from None
        raise
    finally:
        os.environ.pop(_FORCE, None)
        os.environ.update({name: value for name, value in saved.items() if value is not None})


def read_checkpoint(path: Path, trust: bool = False, key: str = "checkpoint.load_path"):
    """``torch.load`` a checkpoint tensors-only (with :data:`ALLOWED_GLOBALS`), or, with ``trust``, in full."""
    check_trusted(path, trust, key)
    try:
        return load_file(path, trust, key)
    except UserError:
        raise
    except Exception as exc:  # RecursionError included: a file torch cannot read is no checkpoint of ours
        raise UnreadableCheckpoint(
            path, f"{NOT_A_CHECKPOINT} ({type(exc).__name__}: {_first_line(exc)})", key
        ) from None
