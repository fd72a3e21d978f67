"""The native entry of generated CPU code: how a worker calls a kernel without the GIL.

An entry is a C function

    int64 entry(int64 *descs, int64 *kinds, int64 *ints, double *floats)

where `descs` are the task's tensor descriptors as compiled orchestrations write them
(jit/descriptor.py: DESC_WIDTH int64s each, in param order) and `kinds`, `ints`, `floats` its
scalar params as the argument tables hold them (jit/context.py). cpu_codegen.native_entry
writes one per kernel instance; its body makes each memref's view from its descriptor, as the
CPU backend's numpy views are, and calls the instance's generated function. It returns 0, or
RAISED when the kernel raised: a cfunc cannot pass an exception on, so the entry catches it
and the native worker reports the task as failed (executors/native.py).
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import threading
from pathlib import Path

import numpy as np
from numba import carray, cfunc, njit, types
from numpy.lib.stride_tricks import as_strided

from .core.address import void_pointer
from .first_calls import preparing
from .generated import cache_dir, load_source
from .jit import context, descriptor
from .jit.context import S_INT
from .jit.descriptor import D_BASE, D_ITEMSIZE, D_NDIM, D_OFFSET, D_SHAPE, D_STRIDE, DESC_WIDTH, MAX_JIT_DIMS

_I64P = types.CPointer(types.int64)
# The modules whose code an entry inlines besides the kernel's: this one and the layouts it reads.
_SOURCES = [Path(__file__), Path(context.__file__), Path(descriptor.__file__)]
ENTRY = types.int64(_I64P, _I64P, _I64P, types.CPointer(types.float64))
RAISED = 1  # what an entry returns when its kernel raised


@njit(inline="always")
def first_element(descs, p, dtype):
    """Tensor param p's element [0, ...] as a one-element array of `dtype`, to stride from."""
    d = p * DESC_WIDTH
    return carray(void_pointer(descs[d + D_BASE] + descs[d + D_OFFSET]), 1, dtype)


@njit(inline="always")
def tensor2(descs, p, dtype):
    """Tensor param p as a 2-d array of `dtype` (a memref of an unbatched instance)."""
    d = p * DESC_WIDTH
    size = descs[d + D_ITEMSIZE]
    base = first_element(descs, p, dtype)
    return as_strided(base, (descs[d + D_SHAPE], descs[d + D_SHAPE + 1]),
                      (descs[d + D_STRIDE] * size, descs[d + D_STRIDE + 1] * size))


@njit(inline="always")
def tensor3(descs, p, dtype):
    """Tensor param p as a 3-d array of `dtype` (a memref of a batched instance): a 2-d param
    is one window for every batch index, as family.py passes it."""
    d = p * DESC_WIDTH
    size = descs[d + D_ITEMSIZE]
    base = first_element(descs, p, dtype)
    if descs[d + D_NDIM] == 3:
        return as_strided(base, (descs[d + D_SHAPE], descs[d + D_SHAPE + 1], descs[d + D_SHAPE + 2]),
                          (descs[d + D_STRIDE] * size, descs[d + D_STRIDE + 1] * size,
                           descs[d + D_STRIDE + 2] * size))
    return as_strided(base, (1, descs[d + D_SHAPE], descs[d + D_SHAPE + 1]),
                      (0, descs[d + D_STRIDE] * size, descs[d + D_STRIDE + 1] * size))


@njit(inline="always")
def float_scalar(kinds, ints, floats, k):
    return float(ints[k]) if kinds[k] == S_INT else floats[k]


@njit(inline="always")
def int_scalar(kinds, ints, floats, k):
    return ints[k] if kinds[k] == S_INT else int(floats[k])


def entry_source(arguments: list[str]) -> list[str]:
    """The lines of an entry's definition: `run` called with the argument expressions (views
    and scalars made from descs, kinds, ints and floats), an exception turned into RAISED."""
    return ["def entry(descs, kinds, ints, floats):", "    try:", f"        run({', '.join(arguments)})",
            "    except Exception:", "        return RAISED", "    return 0", ""]


class NjitEntries:
    """NativeCode.entry of a hand-written numba kernel (`pto.kernel(..., njit=True)`), or of a
    kernel family's native library for the `dtypes` it takes (None: any): a cfunc per (dims of
    each tensor, dtype, kind of each scalar) of its calls. Scalars go in as the Python path
    passes them, int64 or float64, so both run the same specialisation save for read-only and
    contiguous views.

    A module-level numba function (the kernel library's) gets its entries from a generated
    module under the cache directory (given the function as `run`), so numba's cache keeps
    them across processes: made in each process, the panel matmul's three took 8 s of its first
    run. The module's name covers the function's module and qualified name and the sources of
    every module in its directory and of those whose helpers an entry inlines (`_SOURCES`), so
    an edit there makes a new one; an edit to a module elsewhere that the function calls does
    not (nor does it reach numba's own cache of the function). Other functions (a
    `pto.kernel`'s, a closure) get theirs made in this process."""

    def __init__(self, function, dtypes: tuple[type, ...] | None = None):
        self._function = function
        self._dtypes = None if dtypes is None else {np.dtype(d) for d in dtypes}
        self._entries: dict[tuple, object] = {}  # the cfuncs: their code lives while they do
        self._lock = threading.Lock()

    def __call__(self, shapes: tuple[tuple[int, ...], ...], dtype: np.dtype, scalars: tuple) -> int | None:
        ndims = tuple(len(shape) for shape in shapes)
        if not all(1 <= n <= MAX_JIT_DIMS for n in ndims) or (
                self._dtypes is not None and np.dtype(dtype) not in self._dtypes):
            return None
        kinds = tuple(isinstance(value, (int, np.integer)) for value in scalars)
        key = (ndims, np.dtype(dtype), kinds)
        with self._lock:
            if key not in self._entries:
                with preparing():  # compiling: a cost history leaves this call out
                    self._entries[key] = self._compile(*key)
            return self._entries[key].address

    def _compile(self, ndims: tuple[int, ...], dtype: np.dtype, kinds: tuple[bool, ...]):
        byte_strides = f"* descs[{{0}} + {D_ITEMSIZE}]"
        views = [f"as_strided(first_element(descs, {p}, np.{dtype.name}), {_dims(p, ndim, D_SHAPE)}, "
                 f"{_dims(p, ndim, D_STRIDE, byte_strides)})" for p, ndim in enumerate(ndims)]
        values = [f"{'int' if is_int else 'float'}_scalar(kinds, ints, floats, {k})"
                  for k, is_int in enumerate(kinds)]
        definition = entry_source(views + values)
        named = self._module_name()
        if named is None:
            namespace = dict(np=np, as_strided=as_strided, first_element=first_element, run=self._function,
                             int_scalar=int_scalar, float_scalar=float_scalar, RAISED=RAISED)
            exec("\n".join(definition), namespace)  # the text above: one view or scalar per param
            return cfunc(ENTRY)(namespace["entry"])
        text = "\n".join([
            f"# pto-gpu: a native entry of {'.'.join(named)} (sources {self._sources_digest()})",
            "import numpy as np", "from numba import cfunc", "from numpy.lib.stride_tricks import as_strided",
            "",
            "from pto_gpu.native_abi import ENTRY, RAISED, first_element, float_scalar, int_scalar",
            "",
            # Given, not imported: a worker thread importing the kernel's module could wait on
            # the import lock of a module that runs a runtime as it is imported.
            f"# run: {'.'.join(named)}, given by the loader", "", "",
            "@cfunc(ENTRY, cache=True)", *definition])
        digest = hashlib.sha256(text.encode()).hexdigest()[:24]
        return load_source(cache_dir() / f"njit_{digest}.py", text, digest, {"run": self._function}).entry

    def _module_name(self) -> tuple[str, str] | None:
        """The module and the name in it of the function, where it has them and a source file
        (what names its entries' module: a closure's name may stand for different code); else None."""
        module_name, name = self._function.py_func.__module__, self._function.py_func.__qualname__
        module = sys.modules.get(module_name)
        if module is None or module_name == "__main__" or getattr(module, name, None) is not self._function:
            return None
        return (module_name, name) if inspect.getsourcefile(self._function.py_func) else None

    def _sources_digest(self) -> str:
        """A digest of the modules in the function's directory and of `_SOURCES`."""
        directory = Path(inspect.getsourcefile(self._function.py_func)).parent
        digest = hashlib.sha256()
        for path in [*_SOURCES, *sorted(directory.glob("*.py"))]:
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]


def _dims(p: int, ndim: int, field: int, scale: str = "") -> str:
    """The source of a tuple of tensor param p's shape (field D_SHAPE) or byte strides."""
    d = p * DESC_WIDTH
    items = [f"descs[{d + field + k}]" + (" " + scale.format(d) if scale else "") for k in range(ndim)]
    return f"({', '.join(items)},)"
