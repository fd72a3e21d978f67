"""Kernel declarations: an InCore function recorded as plain data.

`@pto.kernel(worker=..., shapes=(...), cuda=CudaCode(...))` turns a function into a `Kernel`
whose body is the CPU implementation and whose `cuda` names its CUDA implementation. Each
kernel gets a small integer id, which is what the numba core stores in the task table.

`shapes` declares the tensor params' shapes, one string per tensor param in order: each
word is a dim, either a number, a name that must be the same size wherever it appears
("m k", "k n", "m n" for a matmul), or `<=N`, at most N (the tile of a generated kernel,
whose tails are smaller). `submit` checks them, and that the tensor params share one dtype
unless `mixed_dtypes=True`, and names the param that is wrong.

`Kernel.sharing()` says which of a task's params may share memory with a param it writes
(docs/DESIGN.md, "Params that share memory"): any, for a kernel written as a function (its code
is the same on every backend, so it decides); the very view it writes, as an input, for
generated code that updates in place (isa/in_place.py); none for other generated code.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import numba
import numpy as np

from .dtypes import DataType, WorkerType, as_dtype
from .errors import ParamError
from .native_abi import NjitEntries
from .sharing import Sharing

_REGISTRY: list[Kernel] = []


@dataclasses.dataclass(frozen=True)
class CudaCode:
    """A kernel's CUDA implementation: the function `pto_<kernel name>` in a .cu source.

    It follows the argument convention of backends/cuda_abi.py (pto_gpu/isa/pto_isa.cuh)
    and walks `items(shapes)` work items, given its tensor params' shapes. `library`, when
    set, is a CuPy-level implementation (cuBLAS, say) taking the same views and scalars as
    the CPU one, which the CUDA backend runs instead of the .cu kernel, except while capturing
    a CUDA graph (Runtime.capture): CuPy refuses cuBLAS calls then, so the .cu kernel runs;
    nor in a TF32 run (CudaBackend.runs_library). `library_only`: there is no .cu kernel (a
    host function: a distributed run's transfers), so the library runs in every run.
    """

    source: Path
    items: Callable[[list[tuple[int, ...]]], int]
    library: Callable | None = None
    library_only: bool = False
    # Whether each scalar param is passed as long long (else double), when the source says so
    # (generated code); None: from each value's Python type.
    integer_scalars: tuple[bool, ...] | None = None
    # Whether the kernel walks its memrefs' leading dim as a batch of tiles, as generated code does:
    # tasks of one instance whose tensors each advance by one stride may then go out as one launch
    # (executors/driver_streams.py).
    batches: bool = False
    # The dynamic shared memory its launch gives a block (its tiles: PTO_SHARED in pto_isa.cuh),
    # where `source` is generated code; 0 for code that uses none.
    shared_bytes: int = 0

    def code_for(self, shapes: list[tuple[int, ...]], dtype: np.dtype, scalars: tuple,
                 tf32: bool = False, block_shared: int | None = None) -> CudaCode:
        """The code that runs a call with these tensor shapes, element type and scalar values,
        in a run that asks for TF32 products or not, on a GPU whose blocks may opt in to
        `block_shared` bytes of shared memory (None: any GPU with tensor cores): this one (made
        once, for any such GPU; a generated function's own `tf32` says how it multiplies)."""
        return self


@dataclasses.dataclass(frozen=True)
class CudaInstances:
    """CUDA code made for each call (a kernel family's, pto_gpu/isa/family.py):
    `instance(shapes, dtype, scalars, tf32, block_shared)` gives the CudaCode of that call's
    instance (with `tf32`, its float32 products as TF32: Runtime(precision="tf32"); for a GPU
    whose blocks may opt in to `block_shared` bytes of shared memory, None: any GPU with tensor
    cores). `library` as CudaCode's. `structural`: the positions of the scalars whose values pick the instance
    (None: every scalar's), so that launches of one instance share their preparation.
    `gemm`: the family's tasks are the product c = a @ b + gemm * c of their params (a, b, c),
    which the CUDA backend makes one cuBLAS call (backends/cublas.py) wherever their layout is
    cuBLAS's; None: not a product."""

    instance: Callable[[tuple[tuple[int, ...], ...], np.dtype, tuple, bool, int | None], CudaCode]
    library: Callable | None = None
    structural: tuple[int, ...] | None = None
    gemm: float | None = None
    batches = True  # generated code (or a strided-batched GEMM): see CudaCode.batches
    library_only = False  # see CudaCode's

    def code_for(self, shapes: list[tuple[int, ...]], dtype: np.dtype, scalars: tuple,
                 tf32: bool = False, block_shared: int | None = None) -> CudaCode:
        return self.instance(tuple(shapes), np.dtype(dtype), scalars, tf32, block_shared)


@dataclasses.dataclass(frozen=True)
class NativeCode:
    """A kernel's CPU code that workers call without the GIL (executors/native.py).

    `entry(shapes, dtype, scalars)` gives the address of the native entry (native_abi.py)
    that runs a call with these tensor shapes, element type and scalar values, or None where
    that call has none (it runs the Python way); `scalars` is how many scalar params the kernel
    takes, and `structural` the positions of those whose value picks the entry (shapes and
    dtype always do). `may_raise`: user code (a hand-written njit kernel), of whose exceptions a
    native entry can report only that one was raised; Python submits of it run the Python way,
    whose TaskError carries the exception. `transfer` (SEND, RECEIVE): a distributed run's
    transfer, which native workers post through MPI themselves (executors/native.py) instead
    of calling an entry: its region, then the scalars (index, peer, tag, datatype, comm).
    """

    entry: Callable[[tuple[tuple[int, ...], ...], np.dtype, tuple], int | None]
    scalars: int
    structural: tuple[int, ...] = ()
    may_raise: bool = False
    transfer: int = 0


SEND, RECEIVE = 1, 2  # NativeCode.transfer


class _ArrayParam(NamedTuple):
    """What Kernel's checks read of a tensor param, for an array called with directly."""

    shape: tuple[int, ...]
    ndim: int
    dtype: DataType


@dataclasses.dataclass(eq=False)
class Kernel:
    name: str
    worker: WorkerType
    cpu: Callable
    cuda: CudaCode | CudaInstances | None = None
    shapes: tuple[tuple[str, ...], ...] | None = None
    mixed_dtypes: bool = False
    # Each tensor param's element type (None: any), as a compiled PTO function's memrefs fix
    # them, and its name for errors.
    dtypes: tuple[DataType, ...] | None = None
    names: tuple[str, ...] | None = None
    id: int = -1
    # Seconds a call takes, from its params (tensor descriptors, then scalars): the cost model
    # the simulator (executor="sim") and critical-path schedules use; per worker class where
    # the kernel runs on several.
    cost: Callable[..., float] | Mapping[WorkerType, Callable[..., float]] | None = None
    # Every worker class it can run on (`worker` first, the class its tasks are recorded with);
    # with more than one, the sim and thread executors place each task by earliest finish.
    workers: tuple[WorkerType, ...] = ()
    native: NativeCode | None = None  # generated kernels' code for workers without the GIL
    # Judges, once, what params sharing memory with a written one may be (generated code);
    # None: Sharing.ANY.
    sharing_rule: Callable[[], Sharing] | None = None
    _sharing: Sharing | None = dataclasses.field(default=None, repr=False)
    # Shape-and-dtype signatures already checked: tiles repeat, so most submits hit this.
    _accepted: set = dataclasses.field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.workers = self.workers or (self.worker,)

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.worker.name})"

    def sharing(self) -> Sharing:
        """What a param sharing memory with one this kernel's task writes may be (judged once)."""
        if self._sharing is None:
            self._sharing = Sharing.ANY if self.sharing_rule is None else self.sharing_rule()
        return self._sharing

    def __call__(self, *args: object) -> None:
        """Run the kernel's CPU code on numpy arrays, its tensor params in order and then its
        scalars, as a task would, after the checks a submit makes of the arrays' shapes and
        element types (a window larger than a compiled function's memref would be half done)."""
        count = len(self.shapes) if self.shapes is not None else \
            next((i for i, a in enumerate(args) if not isinstance(a, np.ndarray)), len(args))
        arrays = args[:count]
        for index, array in enumerate(arrays):
            if not isinstance(array, np.ndarray):
                raise ParamError(f"{self.name}: {self.param_name(index)} must be a numpy array, got "
                                 f"{type(array).__name__}")
        self._check_signature([_ArrayParam(a.shape, a.ndim, as_dtype(a.dtype)) for a in arrays])
        self.cpu(*args)

    def check(self, tensors: list, signature: tuple | None = None) -> None:
        """Check the tensor params (descriptors, in order) against the declaration. `signature`
        is theirs, tuple((t.repeats, t.dtype) for t in tensors), if the caller has built it."""
        if signature is None:
            signature = tuple((t.repeats, t.dtype) for t in tensors)
        if signature in self._accepted:
            return
        self._check_signature(tensors)
        if len(self._accepted) < 4096:
            self._accepted.add(signature)

    def _check_signature(self, tensors: list) -> None:
        if self.shapes is not None:
            if len(tensors) != len(self.shapes):
                raise ParamError(f"{self.name} takes {len(self.shapes)} tensor params, got {len(tensors)}")
            sizes: dict[str, tuple[int, int]] = {}
            for index, (dims, tensor) in enumerate(zip(self.shapes, tensors)):
                if len(dims) != tensor.ndim:
                    raise ParamError(f"{self.name}: {self.param_name(index)} must be {len(dims)}-d "
                                     f"({' '.join(dims)}), got shape {tensor.shape}")
                for dim, (word, size) in enumerate(zip(dims, tensor.shape)):
                    if word.startswith("<="):
                        if size > int(word[2:]):
                            raise ParamError(f"{self.name}: {self.param_name(index)} dim {dim} must be at "
                                             f"most {word[2:]}, got shape {tensor.shape}")
                    elif word.isdigit():
                        if int(word) != size:
                            raise ParamError(f"{self.name}: {self.param_name(index)} dim {dim} must be "
                                             f"{word}, got shape {tensor.shape}")
                    elif word in sizes and sizes[word][0] != size:
                        first, where = sizes[word]
                        raise ParamError(f"{self.name}: {self.param_name(index)} dim {dim} ({word}) is "
                                         f"{size} but {self.param_name(where)} has {word}={first}")
                    else:
                        sizes.setdefault(word, (size, index))
        if self.dtypes is not None:
            for index, (dtype, tensor) in enumerate(zip(self.dtypes, tensors)):
                if tensor.dtype != dtype:
                    raise ParamError(f"{self.name}: {self.param_name(index)} must be {dtype.name}, got "
                                     f"{tensor.dtype.name}")
        elif not self.mixed_dtypes and tensors:
            first = tensors[0].dtype
            for index, tensor in enumerate(tensors):
                if tensor.dtype != first:
                    raise ParamError(f"{self.name}: {self.param_name(index)} is {tensor.dtype.name} but "
                                     f"{self.param_name(0)} is {first.name}")

    def param_name(self, index: int) -> str:
        """Tensor param `index` in an error: its name too where the kernel has names."""
        return f"tensor param {index}" + (f" ({self.names[index]})" if self.names else "")


def registered() -> list[Kernel]:
    """Every kernel declared so far, indexed by id."""
    return _REGISTRY


def _worker_classes(worker: object) -> tuple[WorkerType, ...]:
    classes = worker if isinstance(worker, tuple) else (worker,)
    try:
        workers = tuple(WorkerType(w) for w in classes)
    except ValueError:
        workers = ()
    if not workers or len(set(workers)) != len(workers):
        raise ParamError(f"worker={worker!r}: a worker class (pto.CUBE, pto.VECTOR, ...) or a tuple of "
                         "different ones")
    return workers


def _compiled(function: Callable, tensors: int, name: str) -> tuple[Callable, NativeCode]:
    """A hand-written kernel compiled with numba, and its NativeCode."""
    params = [p for p in inspect.signature(function).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) < tensors:
        raise ParamError(f"{name}: shapes= declares {tensors} tensor params, but it takes {len(params)}")
    compiled = numba.njit(nogil=True)(function)
    return compiled, NativeCode(NjitEntries(compiled), len(params) - tensors, may_raise=True)


def transfer_kernel(name: str, function: Callable, kind: int, cuda: CudaCode) -> Kernel:
    """Declare a distributed run's transfer kernel (distributed/placement.py) of `kind` SEND
    or RECEIVE, which native workers post through MPI themselves (NativeCode.transfer);
    `function` is its Python way, for tasks whose arguments are not in the run's tables."""
    declared = Kernel(name, WorkerType.ACCELERATOR, function, cuda=cuda, mixed_dtypes=True, id=len(_REGISTRY),
                      native=NativeCode(lambda shapes, dtype, scalars: None, scalars=5, transfer=kind))
    _REGISTRY.append(declared)
    return declared


def multi_class() -> bool:
    """Whether any kernel declared so far runs on more than one worker class."""
    return any(len(k.workers) > 1 for k in _REGISTRY)


def kernel(worker: WorkerType | tuple[WorkerType, ...] = WorkerType.VECTOR, name: str | None = None,
           shapes: tuple[str, ...] | None = None, mixed_dtypes: bool = False,
           cuda: CudaCode | CudaInstances | None = None,
           cost: Callable[..., float] | Mapping[WorkerType, Callable[..., float]] | None = None,
           njit: bool = False) -> Callable[[Callable], Kernel]:
    """Declare an InCore kernel; the decorated function is its CPU implementation.

    It receives one array view per tensor param and the scalar values, in param order.
    `njit=True` compiles it with numba (nogil), and compiled orchestrations' tasks of it then
    run on native workers (executors/native.py); it needs `shapes=`, which says how many of
    the params are tensors, and one dtype for them all.
    `cost(*params)` (tensor descriptors, then scalars) gives a call's seconds, for the
    simulator and critical-path schedules. `worker=(pto.CUBE, pto.VECTOR)`: it may run on
    either class, and each task goes where it would finish earliest (HEFT), from its cost on
    each (`cost={pto.CUBE: f, pto.VECTOR: g}`, or a history measured per class).
    """
    workers = _worker_classes(worker)
    if isinstance(cost, Mapping):
        problems = [f"none for {w.name}" for w in workers if not callable(cost.get(w))]
        problems += [f"{getattr(w, 'name', repr(w))} is not one" for w in cost if w not in workers]
        if problems:
            raise ParamError(f"cost={{...}} gives a function per worker class the kernel runs on "
                             f"({', '.join(w.name for w in workers)}): {'; '.join(problems)}")
    elif cost is not None and not callable(cost):
        raise ParamError(f"cost={cost!r}: a function of the params that gives seconds")
    parsed = None if shapes is None else tuple(tuple(s.split()) for s in shapes)
    for word in (w for dims in parsed or () for w in dims):
        bound = word[2:] if word.startswith("<=") else ""
        if not (word.isdigit() or word.isidentifier() or (bound.isdigit() and int(bound) > 0)):
            raise ParamError(f"shape word {word!r} in shapes={shapes!r}: a dim is a number, a name, or <=N "
                             "with N a positive number")

    if njit and (parsed is None or mixed_dtypes):
        raise ParamError("njit=True needs shapes=(...) (which of the params are tensors) and one dtype for "
                         "them all (not mixed_dtypes=True)")

    def declare(function: Callable) -> Kernel:
        kernel_name, native = name or function.__name__, None
        if njit:
            function, native = _compiled(function, len(parsed), kernel_name)
        declared = Kernel(kernel_name, workers[0], function, cuda=cuda, shapes=parsed,
                          mixed_dtypes=mixed_dtypes, id=len(_REGISTRY), cost=cost, workers=workers,
                          native=native)
        _REGISTRY.append(declared)
        return declared

    return declare

