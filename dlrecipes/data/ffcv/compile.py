"""FFCV's numba-compiled pipelines, cached on disk so that only a machine's first run compiles them.

Every process that iterates an FFCV loader compiles its pipeline with numba on the first batch of
each loader: seconds on a CPU, 20-25 s for the train and eval pipelines of the flagship recipe on
the GPU machine, all of it inside the first epoch. Numba can cache compiled functions on disk, but
FFCV's pipelines defeated it for two reasons, both handled here:

- FFCV calls its C decoders through ``ctypes`` function pointers, which numba bakes into the
  machine code as addresses of this process ("dynamic globals": never cached). The replacements
  below call the same C functions by symbol name (numba ``ExternalFunction``; the symbol is
  registered with LLVM at import), which a cached function can link against in any process.
- FFCV's pipeline functions are closures over other compiled functions, and numba keys a cached
  closure on a pickle of its closure variables, which includes each compiled function's random
  per-process identifier. Here the key is a digest of the function's code, closure (recursively)
  and options instead, so the same pipeline has the same key in every process.

:func:`install` puts both into FFCV (``Compiler.compile`` and the decoders' module globals)
unless ``DLRECIPES_FFCV_COMPILE_CACHE=0``, and always replaces FFCV's OS-cache reader, whose
signature corrupted one of numba's shared types (:func:`_os_cache_reader`). The cache lives where
numba puts it: ``$NUMBA_CACHE_DIR`` when set, otherwise ``__pycache__`` beside the sources when
writable, otherwise ``~/.cache/numba``. Numba checks the source files' timestamps and the
machine's CPU, so upgrading FFCV or sharing a home directory across different nodes recompiles
rather than reusing stale code; where no location is writable it compiles without caching, as
FFCV does.
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import os
import types as types_module
from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from numba import njit, types
from numba.core import serialize, typeinfer
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher
from numba.core.typing.ctypes_utils import make_function_type

_SYMBOL_PREFIX = "dlrecipes_ffcv_"


def _external(name: str, cfunc: Any) -> types.ExternalFunction:
    """The ctypes function ``cfunc`` of libffcv, callable from numba by a registered symbol name."""
    symbol = _SYMBOL_PREFIX + name
    llvm.add_symbol(symbol, ctypes.cast(cfunc, ctypes.c_void_p).value)
    return types.ExternalFunction(symbol, make_function_type(cfunc).sig)


def _libffcv_functions() -> tuple[Any, Any, Any]:
    from ffcv import libffcv

    return (
        _external("imdecode", libffcv.ctypes_imdecode),
        _external("resize", libffcv.ctypes_resize),
        _external("my_memcpy", libffcv.ctypes_memcopy),
    )


_c_imdecode, _c_resize, _c_memcpy = _libffcv_functions()


# The three below take the arguments of their namesakes in ffcv.libffcv and call the same C code.
def imdecode(
    source,
    dst,
    source_height,
    source_width,
    crop_height=None,
    crop_width=None,
    offset_x=0,
    offset_y=0,
    scale_factor_num=1,
    scale_factor_denom=1,
    enable_crop=False,
    do_flip=False,
):
    return _c_imdecode(
        source.ctypes.data,
        source.size,
        source_height,
        source_width,
        dst.ctypes.data,
        crop_height,
        crop_width,
        offset_x,
        offset_y,
        scale_factor_num,
        scale_factor_denom,
        enable_crop,
        do_flip,
    )


def resize_crop(source, start_row, end_row, start_col, end_col, destination):
    _c_resize(
        0,
        source.ctypes.data,
        source.shape[0],
        source.shape[1],
        start_row,
        end_row,
        start_col,
        end_col,
        destination.ctypes.data,
        destination.shape[0],
        destination.shape[1],
    )


def memcpy(source, dest):
    return _c_memcpy(source.ctypes.data, dest.ctypes.data, source.size * source.itemsize)


def _os_cache_reader(manager: Any) -> Callable:
    """FFCV's ``OSCacheManager.compile_reader`` without its side effect on numba's types.

    FFCV builds the reader's signature by setting ``mutable = False`` on ``numba.uint8[::1]``,
    which is numba's one shared instance of that type: every writable uint8 buffer typed later in
    the process is then typed read-only, and dictionaries holding the type before the change can
    no longer find it (numba's ``Exception ignored in: <finalize ...> KeyError`` at exit). This is
    the same reader with the same read-only signature, built from a new type instead.
    """
    from ffcv.pipeline.compiler import Compiler

    def read(address, mem_state):
        size = mem_state[2][np.searchsorted(mem_state[1], address)]
        return mem_state[0][address : address + size]

    data = types.Array(types.uint8, 1, "C", readonly=True)
    return Compiler.compile(read, data(types.uint64, types.Tuple([data, types.uint64[::1], types.uint64[::1]])))


def _fingerprint(value: Any) -> str:
    """A digest of what code compiled from (or calling) ``value`` depends on, equal in every process.

    Functions: module, name, bytecode, constants, names, defaults, closure (recursively) and the
    numba types they read from module globals (an external C function's signature); dispatchers:
    their function, options and fixed signatures; anything else: its pickle (a value whose pickle
    varied would only cost a cache miss).
    """
    digest = hashlib.sha256()
    if isinstance(value, Dispatcher):
        fixed = [] if value._can_compile else sorted(str(args) for args in value.overloads)
        parts: tuple = ("dispatcher", _fingerprint(value.py_func), sorted(value.targetoptions.items()), fixed)
    elif inspect.isfunction(value):
        closure = [_fingerprint(cell.cell_contents) for cell in value.__closure__ or ()]
        parts = (
            "function",
            value.__module__,
            value.__qualname__,
            _code_digest(value.__code__),
            _fingerprint(value.__defaults__),
            closure,
            _global_types(value),
        )
    else:
        return hashlib.sha256(serialize.dumps(value)).hexdigest()
    digest.update(repr(parts).encode())
    return digest.hexdigest()


def _global_types(function: types_module.FunctionType) -> list[tuple[str, ...]]:
    found = []
    for name in function.__code__.co_names:
        value = function.__globals__.get(name)
        if isinstance(value, types.ExternalFunction):
            found.append((name, value.symbol, str(value.sig)))
        elif isinstance(value, types.Type):
            found.append((name, str(value)))
    return found


def _code_digest(code: types_module.CodeType) -> str:
    consts = [_code_digest(c) if isinstance(c, types_module.CodeType) else repr(c) for c in code.co_consts]
    return hashlib.sha256(repr((code.co_code, consts, code.co_names, code.co_varnames)).encode()).hexdigest()


class _ContentKeyedCache(FunctionCache):
    """Numba's on-disk function cache, keyed on :func:`_fingerprint` of the function.

    Numba's own key pickles the closure, and a pickled dispatcher carries a random per-process
    identifier and its signatures' interned type objects: FFCV's closures over compiled functions
    then never hit the cache.
    """

    def _index_key(self, sig: Any, codegen: Any) -> tuple:
        return (sig, codegen.magic_tuple(), _fingerprint(self._py_func))


def _compile(cls: Any, code: Callable, signature: Any | None = None) -> Callable:
    """FFCV's ``Compiler.compile`` (same options), with numba's on-disk cache."""
    if not cls.is_enabled:
        return code
    options = {
        "fastmath": True,
        "nogil": True,
        "error_model": "numpy",
        "parallel": bool(getattr(code, "is_parallel", False)) and cls.num_threads > 1,
    }
    compiled = njit(**options)(code)
    if not isinstance(compiled, Dispatcher):  # NUMBA_DISABLE_JIT: the Python function itself
        return compiled
    try:
        compiled._cache = _ContentKeyedCache(code)
    except RuntimeError:  # numba found no writable cache location: compile as FFCV does
        pass
    if signature is not None:  # compiled now and only for it, as njit(signature) does
        with typeinfer.register_dispatcher(compiled):
            compiled.compile(signature)
        compiled.disable_compile()
    return compiled


CACHE_SWITCH = "DLRECIPES_FFCV_COMPILE_CACHE"


def install() -> None:
    """Fix FFCV's OS-cache reader and, unless ``DLRECIPES_FFCV_COMPILE_CACHE=0``, make FFCV's
    compiled pipelines cacheable on disk (idempotent; see the module docstring)."""
    from ffcv.fields import bytes as bytes_field
    from ffcv.fields import ndarray, rgb_image
    from ffcv.memory_managers.os_cache import OSCacheManager
    from ffcv.pipeline.compiler import Compiler

    OSCacheManager.compile_reader = _os_cache_reader
    if os.environ.get(CACHE_SWITCH, "1") == "0":
        return
    rgb_image.imdecode, rgb_image.resize_crop, rgb_image.memcpy = imdecode, resize_crop, memcpy
    ndarray.memcpy = bytes_field.memcpy = memcpy
    Compiler.compile = classmethod(_compile)
