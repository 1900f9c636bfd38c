"""A checkpoint file read as torch would find it, without unpickling anything: what is wrong with it, if anything.

:func:`file_problem` says, before any load and whatever ``--trust-checkpoint`` says (trusting a file's code does not
make its bytes whole), whether a file is a regular file (not a folder, a FIFO or a dangling link), a zip archive laid
out as ``torch.save`` writes one, with a pickle that parses and nests no deeper than :data:`MAX_PICKLE_DEPTH`, and each
tensor storage the pickle declares (``('storage', type, key, location, numel)``, the argument of its BINPERSID
instructions) backed by the archive's record ``<archive>/data/<key>`` of exactly ``numel`` times the type's element size
bytes.  torch checks none of that last: a file of a few hundred bytes declaring a 1 TiB storage loads as a 1 TiB tensor,
and a record cut short is read past its end (an evaluation on stray memory).  The answer is a phrase for the line that
refuses the file: "is damaged (...)" for a record that does not match, "is not a dlrecipes/Composer checkpoint (...)"
for anything else (:mod:`dlrecipes.records.checkpoint_safety` raises it,
:mod:`dlrecipes.records.checkpoints` passes over such a file when resuming).  The pickle is read with
:func:`pickletools.genops`, as instructions: about 15 ms for a ResNet-50 with its optimizer's state (640 tensors;
``tests/test_checkpoint_safety.py`` measures it), 1.5 ms for the tests' tiny runs.  A legacy (pre-zip) file is
left to torch, which reads its storages' sizes from the file itself.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path
from typing import Any

from dlrecipes.errors import first_line

NOT_A_CHECKPOINT = "is not a dlrecipes/Composer checkpoint"
# How deep a checkpoint's pickle may nest (a container in a container ...).  A Composer checkpoint nests 10 levels
# (the tiny tests' run and a ResNet-50's alike: state / optimizers / SGD / state / parameter / momentum_buffer / the
# tensor's rebuild, its arguments and its storage); code that walks a loaded state recursively (Composer's, torch's)
# meets Python's recursion limit (1,000 frames) at a few hundred levels.
MAX_PICKLE_DEPTH = 100


def not_a_file(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file (a checkpoint's name on something else), or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    kind = next((name for test, name in kinds if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")
    return None if kind is None else f"is {kind}, not a checkpoint file"


def file_problem(path: Path, checksums: bool = False) -> str | None:
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
    known = {
        b"\x89PNG": "a PNG image",
        b"\xff\xd8\xff": "a JPEG image",
        b"GIF8": "a GIF image",
        b"%PDF": "a PDF document",
        b"\x1f\x8b": "a gzip file",
        b"\x08": "an ONNX or protobuf file",
    }
    for magic, kind in known.items():
        if head.startswith(magic):
            return kind
    try:
        head.decode("utf-8")
        return "text"
    except UnicodeDecodeError:
        return "unknown binary data"


def _archive_problem(archive: Any) -> str | None:
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
            return (
                f"is damaged (its tensor record data/{key} holds {sizes[record]:,} bytes where its pickle "
                f"declares {nbytes:,}: a truncated or altered file)"
            )
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


class _Reading:
    """The values a pickle's instructions build, as far as :func:`declared_storages` needs them: strings, numbers,
    globals and tuples as they are (a storage's declaration is made of them), anything else a :class:`_Node` that
    only knows how deep it nests.  One method per kind of instruction (:data:`_STEPS`)."""

    def __init__(self) -> None:
        self.stack: list = []
        self.marks: list[list] = []  # the stacks under each open MARK
        self.memo: dict = {}
        self.declared: list = []  # the argument of each BINPERSID
        self.deepest = 0

    def pop_mark(self) -> list:
        items, self.stack = self.stack, self.marks.pop()
        return items

    def nests(self, items: list) -> int:
        """The depth of a container holding ``items``; refused past :data:`MAX_PICKLE_DEPTH`."""
        depth = 1 + max(map(_depth, items), default=0)
        if depth > self.deepest:
            self.deepest = depth
            if depth > MAX_PICKLE_DEPTH:
                raise _Malformed(f"its pickle nests more than {MAX_PICKLE_DEPTH} levels deep")
        return depth

    def grown(self, node: Any, items: list) -> _Node:
        """``node`` (a new object when it is not a container) holding ``items`` too."""
        depth = self.nests(items)
        if isinstance(node, _Node):
            node.depth = max(node.depth, depth)
            return node
        return _Node(depth)

    def literal(self, name: str, arg: Any) -> None:
        self.stack.append(_CONSTANTS[name] if name in _CONSTANTS else arg)

    def memo_put(self, name: str, arg: Any) -> None:
        self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.stack[-1]

    def memo_get(self, name: str, arg: Any) -> None:
        self.stack.append(self.memo[arg])

    def mark(self, name: str, arg: Any) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def empty(self, name: str, arg: Any) -> None:
        self.stack.append(_Node(1))

    def make_tuple(self, name: str, arg: Any) -> None:
        count = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}.get(name)
        if count is None:
            items = self.pop_mark()
        elif len(self.stack) < count:
            raise IndexError("the stack holds fewer items than the tuple takes")
        else:
            items = self.stack[len(self.stack) - count :]
            del self.stack[len(self.stack) - count :]
        made = _Tuple(items)
        made.depth = self.nests(items)
        self.stack.append(made)

    def fill(self, name: str, arg: Any) -> None:  # APPEND, SETITEM: the items above it; the others: since the mark
        items = {"APPEND": 1, "SETITEM": 2}.get(name)
        if items is None:
            added = self.pop_mark()
        else:
            added = [self.stack.pop() for _ in range(items)]
        self.stack[-1] = self.grown(self.stack[-1], added)

    def from_mark(self, name: str, arg: Any) -> None:  # LIST, DICT, FROZENSET, INST, OBJ: a new object of them
        self.stack.append(self.grown(None, self.pop_mark()))

    def call(self, name: str, arg: Any) -> None:  # a callable, class or object below its arguments or state
        items = [self.stack.pop() for _ in range(2 if name == "NEWOBJ_EX" else 1)]
        self.stack[-1] = self.grown(self.stack[-1] if name == "BUILD" else None, items)

    def persistent(self, name: str, arg: Any) -> None:
        if name == "PERSID":  # protocol 0's: torch.save never writes it
            raise _Malformed("its pickle refers to an object outside it in a form torch.save does not write")
        self.declared.append(self.stack.pop())
        self.stack.append(_Node(1))

    def global_(self, name: str, arg: Any) -> None:
        if name == "GLOBAL":
            module, _, qualified = arg.partition(" ")
        else:
            qualified, module = self.stack.pop(), self.stack.pop()
        self.stack.append(_Global((module, qualified)))

    def pop(self, name: str, arg: Any) -> None:
        if name == "DUP":
            self.stack.append(self.stack[-1])
        elif name == "POP" and self.stack:
            self.stack.pop()
        else:  # POP_MARK, or POP with nothing above the mark (as pickle's own loader does)
            self.pop_mark()

    def outside(self, name: str, arg: Any) -> None:  # EXT1/2/4, NEXT_BUFFER: an object from outside the pickle
        self.stack.append(_Node(1))

    def nothing(self, name: str, arg: Any) -> None:  # PROTO, FRAME, READONLY_BUFFER
        pass


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_STEPS = {
    **dict.fromkeys(
        [
            "INT",
            "BININT",
            "BININT1",
            "BININT2",
            "LONG",
            "LONG1",
            "LONG4",
            "STRING",
            "BINSTRING",
            "SHORT_BINSTRING",
            "BINBYTES",
            "SHORT_BINBYTES",
            "BINBYTES8",
            "BYTEARRAY8",
            "UNICODE",
            "SHORT_BINUNICODE",
            "BINUNICODE",
            "BINUNICODE8",
            "FLOAT",
            "BINFLOAT",
            *_CONSTANTS,
        ],
        _Reading.literal,
    ),
    **dict.fromkeys(["PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"], _Reading.memo_put),
    **dict.fromkeys(["GET", "BINGET", "LONG_BINGET"], _Reading.memo_get),
    "MARK": _Reading.mark,
    **dict.fromkeys(["EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"], _Reading.empty),
    **dict.fromkeys(["EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE"], _Reading.make_tuple),
    **dict.fromkeys(["APPEND", "SETITEM", "APPENDS", "SETITEMS", "ADDITEMS"], _Reading.fill),
    **dict.fromkeys(["LIST", "DICT", "FROZENSET", "INST", "OBJ"], _Reading.from_mark),
    **dict.fromkeys(["REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"], _Reading.call),
    **dict.fromkeys(["BINPERSID", "PERSID"], _Reading.persistent),
    **dict.fromkeys(["GLOBAL", "STACK_GLOBAL"], _Reading.global_),
    **dict.fromkeys(["POP", "POP_MARK", "DUP"], _Reading.pop),
    **dict.fromkeys(["EXT1", "EXT2", "EXT4", "NEXT_BUFFER"], _Reading.outside),
    **dict.fromkeys(["PROTO", "FRAME", "READONLY_BUFFER"], _Reading.nothing),
}


def declared_storages(pickled: bytes) -> list[tuple[str, int]]:
    """(record key, bytes) of each tensor storage a ``torch.save`` pickle declares, read with
    :func:`pickletools.genops` (nothing is unpickled); raises :class:`_Malformed` for a pickle that does not parse,
    nests deeper than :data:`MAX_PICKLE_DEPTH`, or declares a storage in a form torch does not write."""
    import pickletools

    reading = _Reading()
    try:
        for opcode, arg, _ in pickletools.genops(pickled):
            if opcode.name == "STOP":
                break
            _STEPS[opcode.name](reading, opcode.name, arg)
    except _Malformed:
        raise
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:  # genops: a bad opcode or argument
        detail = first_line(exc, 120)
        raise _Malformed(f"its pickle is malformed: {detail}") from None
    return [_storage_bytes(pid) for pid in reading.declared]


def _storage_bytes(pid: Any) -> tuple[str, int]:
    """(key, bytes) of a storage's persistent id ``('storage', torch.<Type>Storage, key, location, numel)``."""
    shape_ok = isinstance(pid, _Tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")
    kind, key, location, numel = pid[1:] if shape_ok else (None, None, None, None)
    size = _element_size(kind) if isinstance(kind, _Global) else None
    if (
        size is None
        or not isinstance(key, str)
        or not isinstance(location, (str, bytes))
        or not isinstance(numel, int)
        or isinstance(numel, bool)
        or numel < 0
    ):
        shown = repr(tuple(pid) if isinstance(pid, tuple) else pid)
        raise _Malformed(
            f"its pickle declares a tensor storage torch.save does not write: "
            f"{shown[:100]}{'...' if len(shown) > 100 else ''}"
        )
    return key, numel * size


@functools.cache
def _element_size(kind: tuple[str, str]) -> int | None:
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


__all__ = ["MAX_PICKLE_DEPTH", "NOT_A_CHECKPOINT", "declared_storages", "file_problem", "not_a_file"]
