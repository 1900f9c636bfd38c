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
:func:`file_problem` reads the file as torch would find it, without unpickling anything: a regular file (not a
folder, a FIFO or a dangling link), a zip archive laid out as ``torch.save`` writes it, a pickle that parses and
nests no deeper than :data:`MAX_PICKLE_DEPTH`, and each tensor storage the pickle declares (``('storage', type,
key, location, numel)``, the argument of its BINPERSID instructions) backed by the archive's record
``<archive>/data/<key>`` of exactly ``numel`` times the type's element size bytes.  torch checks none of that
last: a 707-byte file declaring a 1 TiB storage loads as a 1 TiB tensor, and a record cut short is read past its
end (an evaluation on stray memory).  A file that fails is refused in one line naming it
(:class:`UnreadableCheckpoint`, exit code 2): "is damaged (...)" for a record that does not match, "is not a
dlrecipes/Composer checkpoint (...)" for anything else.  The reading costs about a millisecond per hundred
tensors (measured in ``tests/test_checkpoint_safety.py``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from pathlib import Path
from typing import Any, Iterator, Optional

from dlrecipes.errors import DataError, UserError

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
        "numpy._core.multiarray._reconstruct": _reconstruct, "numpy.core.multiarray._reconstruct": _reconstruct,
        "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype, "numpy.dtypes.UInt32DType": type(np.dtype(np.uint32)),
        "torch.torch_version.TorchVersion": TorchVersion, "datetime.timedelta": datetime.timedelta,
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


NOT_A_CHECKPOINT = "is not a dlrecipes/Composer checkpoint"
# How deep a checkpoint's pickle may nest (a container in a container ...).  A Composer checkpoint nests 10 levels
# (the tiny tests' run and a ResNet-50's alike: state / optimizers / SGD / state / parameter / momentum_buffer / the
# tensor's rebuild, its arguments and its storage); code that walks a loaded state recursively (Composer's, torch's)
# meets Python's recursion limit (1,000 frames) at a few hundred levels.
MAX_PICKLE_DEPTH = 100


def not_a_file(path: Path) -> Optional[str]:
    """What ``path`` is when it is not a regular file (a checkpoint's name on something else), or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    kind = next((name for test, name in kinds if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")
    return None if kind is None else f"is {kind}, not a checkpoint file"


def file_problem(path: Path, checksums: bool = False) -> Optional[str]:
    """What is wrong with ``path`` as a checkpoint, read without unpickling anything (None: nothing seen): see the
    module docstring.  ``checksums``: every record's CRC checked too (reads the whole file; resuming and the
    commands after training do, to tell a damaged file from an older one that loads)."""
    import zipfile

    problem = not_a_file(path)
    if problem is not None:
        return problem
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:1] == b"\x80":  # torch's legacy format (a pickle, its storages after it): torch reads their sizes
        return None
    if not head.startswith(b"PK"):  # torch.save's zip format
        return f"{NOT_A_CHECKPOINT} ({_kind_of(head)}, {size:,} bytes)"
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip() if checksums else None
            if broken:
                return f"is damaged (its entry {broken} fails its checksum)"
            return _archive_problem(archive)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zipfile.LargeZipFile):
        # ValueError: a flipped byte in the central directory can make a member's name invalid UTF-8;
        # NotImplementedError: or its compression method one zipfile does not know
        return f"is truncated or damaged (an incomplete zip archive of {size:,} bytes)"


def _kind_of(head: bytes) -> str:
    known = {b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image",
             b"%PDF": "a PDF document", b"\x1f\x8b": "a gzip file", b"\x08": "an ONNX or protobuf file"}
    for magic, kind in known.items():
        if head.startswith(magic):
            return kind
    try:
        head.decode("utf-8")
        return "text"
    except UnicodeDecodeError:
        return "unknown binary data"


def _archive_problem(archive: Any) -> Optional[str]:
    """A torch.save archive's pickle read statically, and each storage it declares against its record."""
    names = archive.namelist()
    folder = names[0].split("/", 1)[0] if names and "/" in names[0] else None
    if folder is None:  # torch takes the first entry's folder for the archive's
        return f"{NOT_A_CHECKPOINT} (a zip archive not laid out as torch.save writes one)"
    if f"{folder}/data.pkl" not in names:
        why = "a TorchScript model, not a checkpoint" if f"{folder}/constants.pkl" in names else "no data.pkl in it"
        return f"{NOT_A_CHECKPOINT} ({why})"
    try:
        storages = declared_storages(archive.read(f"{folder}/data.pkl"))
    except _Malformed as exc:
        return f"{NOT_A_CHECKPOINT} ({exc})"
    sizes = {info.filename: info.file_size for info in archive.infolist()}
    for key, nbytes in storages:
        record = f"{folder}/data/{key}"
        if record not in sizes:
            return f"is damaged (its pickle declares the tensor record data/{key}, which the archive lacks)"
        if sizes[record] != nbytes:
            return (f"is damaged (its tensor record data/{key} holds {sizes[record]:,} bytes where its pickle "
                    f"declares {nbytes:,}: a truncated or altered file)")
    return None


class _Malformed(Exception):
    """The pickle cannot be what torch.save wrote (the reason, for the line that refuses it)."""


class _Node:
    """A value the pickle builds, as far as its reading needs: how deep it nests."""

    __slots__ = ("depth",)

    def __init__(self, depth: int):
        self.depth = depth


class _Tuple(tuple):
    """A tuple the pickle builds, its items kept (a storage's declaration is one)."""

    depth = 1


class _Global(tuple):
    """(module, name) of a GLOBAL instruction."""


def _depth(value: Any) -> int:
    return getattr(value, "depth", 0)


_LITERALS = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING", "SHORT_BINSTRING",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
    "BINUNICODE8", "FLOAT", "BINFLOAT"})
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_FILLS = frozenset({"APPENDS", "SETITEMS", "ADDITEMS"})  # items since the mark, into the container below it
_MADE_FROM_MARK = frozenset({"LIST", "DICT", "FROZENSET", "INST", "OBJ"})  # a new object of the items since the mark


def declared_storages(pickled: bytes) -> list[tuple[str, int]]:
    """(record key, bytes) of each tensor storage a ``torch.save`` pickle declares, read with
    :func:`pickletools.genops` (nothing is unpickled); raises :class:`_Malformed` for a pickle that does not parse,
    nests deeper than :data:`MAX_PICKLE_DEPTH`, or declares a storage in a form torch does not write."""
    import pickletools

    stack: list = []
    marks: list[list] = []
    memo: dict = {}
    declared: list = []
    deepest = 0

    def pop_mark() -> list:
        nonlocal stack
        items, stack = stack, marks.pop()
        return items

    def nests(depth: int) -> int:
        nonlocal deepest
        if depth > deepest:
            deepest = depth
            if deepest > MAX_PICKLE_DEPTH:
                raise _Malformed(f"its pickle nests more than {MAX_PICKLE_DEPTH} levels deep")
        return depth

    def grown(node: Any, items: Any) -> _Node:
        """``node`` (a new object when it is not a container) holding ``items`` too."""
        depth = nests(1 + max(map(_depth, items), default=0))
        if isinstance(node, _Node):
            node.depth = max(node.depth, depth)
            return node
        return _Node(depth)

    def made_tuple(items: list) -> _Tuple:
        made = _Tuple(items)
        made.depth = nests(1 + max(map(_depth, items), default=0))
        return made

    try:
        for opcode, arg, _ in pickletools.genops(pickled):
            name = opcode.name
            if name in _LITERALS:
                stack.append(arg)
            elif name in _PUTS:
                memo[arg] = stack[-1]
            elif name in _GETS:
                stack.append(memo[arg])
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
                stack.append(_Node(1))
            elif name == "EMPTY_TUPLE":
                stack.append(made_tuple([]))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                if len(stack) < count:
                    raise IndexError("the stack holds fewer items than the tuple takes")
                items = stack[-count:]
                del stack[-count:]
                stack.append(made_tuple(items))
            elif name == "TUPLE":
                items = pop_mark()
                stack.append(made_tuple(items))
            elif name == "APPEND":
                item = stack.pop()
                stack[-1] = grown(stack[-1], [item])
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                stack[-1] = grown(stack[-1], [key, value])
            elif name in _FILLS:
                items = pop_mark()
                stack[-1] = grown(stack[-1], items)
            elif name in _MADE_FROM_MARK:
                stack.append(grown(None, pop_mark()))
            elif name in ("REDUCE", "NEWOBJ", "BUILD"):  # callable/class/object, then its arguments/state
                items = [stack.pop()]
                stack[-1] = grown(stack[-1] if name == "BUILD" else None, items)
            elif name == "NEWOBJ_EX":
                items = [stack.pop(), stack.pop()]
                stack[-1] = grown(None, items)
            elif name == "BINPERSID":
                declared.append(stack.pop())
                stack.append(_Node(1))
            elif name == "GLOBAL":
                module, _, qualified = arg.partition(" ")
                stack.append(_Global((module, qualified)))
            elif name == "STACK_GLOBAL":
                qualified, module = stack.pop(), stack.pop()
                stack.append(_Global((module, qualified)))
            elif name in _CONSTANTS:
                stack.append(_CONSTANTS[name])
            elif name == "POP":
                stack.pop() if stack else pop_mark()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "STOP":
                break
            elif name in ("PROTO", "FRAME", "READONLY_BUFFER"):
                continue
            elif name == "PERSID":  # protocol 0's: torch.save never writes it
                raise _Malformed("its pickle refers to an object outside it in a form torch.save does not write")
            else:  # EXT1/2/4, NEXT_BUFFER: an object from outside the pickle
                stack.append(_Node(1))
    except _Malformed:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as exc:  # genops: a bad opcode or argument; else the stack
        detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise _Malformed(f"its pickle is malformed: {detail}") from None
    return [_storage_bytes(pid) for pid in declared]


def _storage_bytes(pid: Any) -> tuple[str, int]:
    """(key, bytes) of a storage's persistent id ``('storage', torch.<Type>Storage, key, location, numel)``."""
    shape_ok = isinstance(pid, _Tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")
    kind, key, location, numel = pid[1:] if shape_ok else (None, None, None, None)
    size = _element_size(kind) if isinstance(kind, _Global) else None
    if (size is None or not isinstance(key, str) or not isinstance(location, (str, bytes))
            or not isinstance(numel, int) or isinstance(numel, bool) or numel < 0):
        shown = repr(tuple(pid) if isinstance(pid, tuple) else pid)
        raise _Malformed(f"its pickle declares a tensor storage torch.save does not write: "
                         f"{shown[:100]}{'...' if len(shown) > 100 else ''}")
    return key, numel * size


@functools.lru_cache(maxsize=None)
def _element_size(kind: tuple[str, str]) -> Optional[int]:
    """Bytes per element of the storage class a pickle names (``('torch', 'FloatStorage')``), or None: not one."""
    import warnings

    import torch

    module, name = kind
    if module != "torch" or not name.endswith("Storage") or "." in name:
        return None
    if name == "UntypedStorage":
        return 1
    storage_class = getattr(torch, name, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "TypedStorage is deprecated": the class is what old and new files name
        dtype = getattr(storage_class, "dtype", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None


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
    if trust:
        return
    try:
        risky = unsafe_globals(path)
    except Exception as exc:
        raise UnreadableCheckpoint(path, f"{NOT_A_CHECKPOINT} ({type(exc).__name__}: {_first_line(exc)})", key) \
            from None
    if risky:
        raise UntrustedCheckpoint(path, risky, key)


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:200]


def _refused(exc: BaseException, path: Path, key: str) -> Optional[UntrustedCheckpoint]:
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
def tensors_only(path: Optional[Path | str], trust: bool = False, key: str = "--resume") -> Iterator[None]:
    """Every ``torch.load`` inside tensors-only, with :data:`ALLOWED_GLOBALS`, unless ``trust`` (or no ``path``).

    For Composer's loader, which reads ``path`` when the Trainer is built and always asks torch for a full
    unpickle: torch's own switch (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, read at each load) turns that into a
    tensors-only load for as long as the block runs.  The caller checked the file first
    (:func:`check_trusted`, one line); a global torch refuses here all the same is refused the same way.
    """
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
        raise UnreadableCheckpoint(path, f"{NOT_A_CHECKPOINT} ({type(exc).__name__}: {_first_line(exc)})", key) \
            from None
