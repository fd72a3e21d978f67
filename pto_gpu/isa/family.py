"""Kernel families: a pto.Kernel whose PTO program is built for the shapes it is called with.

The kernel library (pto_gpu.kernels) is written this way: a kernel takes tiles of any size, so
its one source is a Python function that writes the InCore function for given sizes,

    @family(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
    def add(f: FunctionBuilder, dtype: DataType, m: int, n: int) -> None:
        f.memref("a", dtype, (m, n)).memref("b", dtype, (m, n)).memref("out", dtype, (m, n))
        ...

and the family compiles an instance per (named sizes, dtype, `structural` scalars): its CPU
implementation on the first call with those shapes (cpu_codegen, cached on disk across
processes), its CUDA one when the CUDA backend first launches it (cuda_codegen). Sizes are the
named words of `shapes`; the leading word of a 3-d param is a **batch**: not a size of the
program, the generated code runs it once per index (so one task covers every head of an
attention tile), and a 2-d param is the same window for every index.

`structural` names scalar params whose value shapes the program (rope's head count); they are
passed to the builder by name and their value is part of the instance key. A builder that
takes a `local_memory` keyword is told the target's budget for tiles read whole, in bytes:
None on the CPU (no limit), cuda_codegen.SHARED_LIMIT for CUDA code; so it can chunk a
contraction for the GPU's shared memory and not for the CPU's BLAS. `first_fitting` lets it
try sizes against the generator itself (the fused attention's passes, key blocks and chunks);
one that takes a `block_shared` keyword is told what a block may opt in to on the GPU the
instance is for (not on the CPU), which first_fitting passes on: a kernel that holds an SM
may take more than SHARED_LIMIT where the GPU has it (cuda_codegen.Generator.tile_budget), so
its instances are per GPU.

`split` names a size whose rows the CUDA code spreads over blocks of SPLIT_ROWS: a call with
more is the instance for SPLIT_ROWS of them, run over bands of rows by blocks side by side
(cuda_codegen.Generator), so a product of 128-row tiles fills four SMs where it filled one
(two, in 64-row bands). A family whose products' results live in registers on tensor cores
may take taller bands there (`tensor_band`): each chunk of b a block reads then serves more
rows. The family vouches that the rows of its params whose rows are that size depend only on the
same rows of each other (a product's a and result; attention's query rows).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from .. import generated
from ..dtypes import DataType, WorkerType, as_dtype
from ..errors import ParamError
from ..first_calls import preparing
from ..kernel import CudaCode, CudaInstances, Kernel, NativeCode, kernel
from ..sharing import Sharing
from . import cpu_codegen, cuda_codegen, in_place, optimize
from .asm import print_module
from .builder import FunctionBuilder
from .cuda_mma import TENSOR_CORE_DTYPES
from .dataflow import directions
from .errors import ISAError
from .ir import Direction, Function, Module

Builder = Callable[..., None]
T = TypeVar("T")
SPLIT_ROWS = 32  # a band: two units of 16 rows on tensor cores, four rows a warp on FMA
# Family.sharing's sizes: a tile of one warp's rows, and one past kernels/tiles.py's column
# block of 256 with a tail.
JUDGED_SIZES = (16, 320)


class Family:
    """The instances of one family: (sizes, dtype, structural scalars) -> compiled module."""

    def __init__(self, name: str, build: Builder, shapes: tuple[str, ...], structural: tuple[str, ...],
                 scalar_names: tuple[str, ...], library_cpu: Callable | None, split: str | None = None,
                 tensor_band: int = SPLIT_ROWS):
        self.name, self.build, self.library_cpu, self.split = name, build, library_cpu, split
        self.tensor_band = tensor_band
        self.shapes = tuple(tuple(s.split()) for s in shapes)
        self.scalar_names = scalar_names
        self.structural = tuple(scalar_names.index(s) for s in structural)
        self.structural_names = structural
        self.tensors = len(self.shapes)
        self.batched = any(len(words) == 3 for words in self.shapes)
        parameters = inspect.signature(build).parameters
        self.budgeted = "local_memory" in parameters
        self.sized_to_gpu = "block_shared" in parameters
        self._modules: dict[tuple, Module] = {}
        self._cpu: dict[tuple, Callable] = {}  # call signature -> ready-to-call CPU entry
        self._cuda: dict[tuple, CudaCode] = {}
        self._native: dict[tuple, int | None] = {}  # (instance key, batched) -> native entry address
        self._lock = threading.RLock()  # worker threads may meet a new shape together

    # --- instances ---------------------------------------------------------------------------
    def sizes(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[str, int], ...]:
        """The named sizes of a call (its batch words left out), in first-seen order. A call
        with a param of the wrong rank, batches that differ, or an empty tile is refused."""
        sizes: dict[str, int] = {}
        batches = set()
        for index, (words, shape) in enumerate(zip(self.shapes, shapes)):
            if len(shape) != len(words):
                raise ParamError(f"{self.name}: tensor param {index} must be {len(words)}-d "
                                 f"({' '.join(words)}), got shape {shape}")
            if len(words) == 3:
                batches.add(shape[0])
                words, shape = words[1:], shape[1:]
            for word, size in zip(words, shape):
                if not word.isdigit():
                    sizes.setdefault(word, int(size))
        if len(batches) > 1:
            raise ParamError(f"{self.name}: the leading (batch) dims of the 3-d params differ: "
                             f"{sorted(batches)}")
        empty = [word for word, size in sizes.items() if size == 0]
        if empty:
            raise ParamError(f"{self.name}: {', '.join(empty)} = 0 in shapes {list(shapes)}: a kernel "
                             "family's tiles are never empty; skip the call")
        return tuple(sizes.items())

    def module(self, sizes: tuple[tuple[str, int], ...], dtype: DataType, structural: tuple,
               local_memory: int | None = None, tf32: bool = False,
               block_shared: int | None = None) -> Module:
        """The instance's module; with `tf32` (float32 only), its function says tf32.
        `local_memory` and `block_shared` reach a builder that takes them (the module's doc)."""
        budget = {"local_memory": local_memory} if self.budgeted else {}
        if self.sized_to_gpu and block_shared is not None:
            budget["block_shared"] = block_shared
        key = (sizes, dtype, structural, tf32, *budget.values())
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                module = Module(f"{self.name}_" + "_".join(f"{w}{n}" for w, n in sizes))
                builder = FunctionBuilder(self.name, module=module).in_core()
                if tf32:
                    builder.tf32()
                named = dict(zip(self.structural_names, structural))
                self.build(builder, dtype, **dict(sizes), **named, **budget)
                self._check(builder.build(), module)
                module = optimize.optimize_module(module)  # tile reuse by liveness
                self._modules[key] = module
        return module

    def sharing(self) -> Sharing:
        """SAME_VIEW when the family's function updates in place (isa/in_place.py) for the CPU
        and within CUDA's budget, judged on the instances of float32 tiles whose every named
        size is one of JUDGED_SIZES, a batch of 2; else NONE. A family with structural scalars,
        or whose builder cannot build those instances, is NONE. So a builder must write one
        structure for every size (the library's do: one pass, in column blocks past 256)."""
        if self.structural:
            return Sharing.NONE
        budgets = (None, cuda_codegen.SHARED_LIMIT) if self.budgeted else (None,)
        functions = []
        for size in JUDGED_SIZES:
            shapes = tuple(tuple(2 if len(words) == 3 and d == 0 else int(w) if w.isdigit() else size
                                 for d, w in enumerate(words)) for words in self.shapes)
            try:
                sizes = self.sizes(shapes)
                modules = [self.module(sizes, DataType.FLOAT32, (), budget,
                                       block_shared=None if budget is None else cuda_codegen.SHARED_OPT_IN)
                           for budget in budgets]
            except Exception:  # noqa: BLE001 - whatever a builder raises: not judged, so not shared
                return Sharing.NONE
            functions += [module.functions[self.name] for module in modules]
        return in_place.sharing(*functions)

    def _check(self, function: Function, module: Module) -> None:
        """Params bind by position: the builder must declare them as the family says."""
        params = tuple(s.name for s in function.scalars if s.param)
        if len(function.memrefs) != self.tensors or params != self.scalar_names:
            memrefs = ", ".join(m.name for m in function.memrefs)
            raise ParamError(f"{self.name}: the builder declares memrefs ({memrefs}) and scalars "
                             f"({', '.join(params)}), but the family has {self.tensors} tensor params and "
                             f"scalars={self.scalar_names!r}, in that order")
        if self.batched:  # a 2-d param is one window for every index: writing it would race
            flows = directions(function, module)
            for words, memref in zip(self.shapes, function.memrefs):
                if len(words) == 2 and flows[memref.name] != Direction.INPUT:
                    raise ParamError(f"{self.name}: %{memref.name} is 2-d in a batched family, so every "
                                     "batch index shares it; it can only be read")

    def cpu(self, *args) -> None:
        """The CPU implementation: the generated function of this call's instance (or the
        family's CPU library, where it has one)."""
        tensors = args[:self.tensors]
        shapes = tuple(t.shape for t in tensors)
        structural = tuple(args[self.tensors + i] for i in self.structural)
        signature = (shapes, tensors[0].dtype, structural)
        run = self._cpu.get(signature)  # a dict read is atomic under the GIL
        if run is None:
            with preparing(), self._lock:  # compiling, or waiting for the thread that is
                run = self._cpu.get(signature)
                if run is None:
                    run = self._cpu_entry(shapes, tensors[0].dtype, structural)
                    # The first call of generated code compiles it (or loads it from the
                    # cache): made before publishing, so no thread meets that unflagged.
                    run(*args)
                    self._cpu[signature] = run
                    return
        run(*args)

    def generated_cpu(self, *args) -> None:
        """The generated CPU code of this call's instance, library or not (what tests check)."""
        tensors = args[:self.tensors]
        shapes = tuple(t.shape for t in tensors)
        structural = tuple(args[self.tensors + i] for i in self.structural)
        self._generated_entry(shapes, tensors[0].dtype, structural)(*args)

    def _cpu_entry(self, shapes, dtype, structural) -> Callable:
        if self.library_cpu is not None:
            self.sizes(shapes)  # the same refusals as the generated code's
            return self.library_cpu
        return self._generated_entry(shapes, dtype, structural)

    def _generated_entry(self, shapes, dtype, structural) -> Callable:
        module = self.module(self.sizes(shapes), as_dtype(dtype), structural)
        directory = generated.cache_dir()
        if all(len(s) == 2 for s in shapes):
            return cpu_codegen.cpu_function(module, self.name, directory)
        if next(s[0] for s in shapes if len(s) == 3) == 0:
            return lambda *args: None  # an empty batch: nothing to run (so the CUDA code launches none)
        batched = cpu_codegen.cpu_function(module, self.name, directory, batched=True)
        count = self.tensors

        def run(*args):
            batched(*(a if a.ndim == 3 else a[None] for a in args[:count]), *args[count:])

        return run

    def native_entry(self, shapes: tuple[tuple[int, ...], ...], dtype: np.dtype,
                     scalars: tuple) -> int | None:
        """The address of the native entry of the instance for a call with these shapes and
        scalar values (NativeCode.entry), or None: an empty batch runs nothing. (A family with
        a CPU library runs its `library_native` instead.)"""
        structural = tuple(scalars[i] for i in self.structural)
        key = (self.sizes(shapes), as_dtype(dtype), structural)
        batched = not all(len(s) == 2 for s in shapes)
        if batched and next(s[0] for s in shapes if len(s) == 3) == 0:
            return None  # an empty batch: nothing to run, as `cpu` runs nothing
        with self._lock:
            if (key, batched) not in self._native:
                with preparing():
                    module = self.module(*key)
                    self._native[key, batched] = cpu_codegen.native_entry(
                        module, self.name, generated.cache_dir(), batched)
            return self._native[key, batched]

    def cuda(self, shapes: tuple[tuple[int, ...], ...], dtype: np.dtype, scalars: tuple,
             tf32: bool = False, block_shared: int | None = None) -> CudaCode:
        """The CUDA code of the instance for a call with these shapes and scalar values; with
        `tf32`, its float32 products on tensor cores as TF32 (docs/ISA.md; other element types
        are as they are); for a GPU whose blocks may opt in to `block_shared` bytes of shared
        memory (None: SHARED_OPT_IN, what every GPU with tensor cores gives)."""
        tf32 = tf32 and as_dtype(dtype) == DataType.FLOAT32
        if block_shared is None:
            block_shared = cuda_codegen.SHARED_OPT_IN
        sizes = self.sizes(shapes)
        banded = self._banded(sizes, as_dtype(dtype))
        instance = (banded, as_dtype(dtype), tuple(scalars[i] for i in self.structural))
        key = (*instance, tf32, banded != sizes, block_shared)  # banded: a band of a taller call
        code = self._cuda.get(key)
        if code is None:
            with preparing(), self._lock:
                code = self._cuda.get(key)
                if code is None:
                    module = self.module(*instance, local_memory=cuda_codegen.SHARED_LIMIT, tf32=tf32,
                                         block_shared=block_shared)
                    split = self._split_memrefs(module) if banded != sizes else ()
                    directory = generated.cache_dir()
                    code = self._cuda[key] = cuda_codegen.cuda_code(module, self.name, directory, split,
                                                                    block_shared)
        return code

    def band(self, dtype: DataType) -> int:
        """The rows of a band of the split size: `tensor_band` for 16-bit instances (whose
        products run on tensor cores with their result in registers, which the families size
        for 16-bit types only), SPLIT_ROWS for others (TF32 ones included)."""
        return self.tensor_band if dtype in TENSOR_CORE_DTYPES else SPLIT_ROWS

    def _banded(self, sizes: tuple[tuple[str, int], ...], dtype: DataType) -> tuple[tuple[str, int], ...]:
        """The sizes of the CUDA instance for a call of `sizes`: a band's rows of the split
        size where the call has more (the instance is then a band of it), else the call's own."""
        rows = self.band(dtype)
        if self.split is None or dict(sizes)[self.split] <= rows:
            return sizes
        return tuple((word, rows if word == self.split else size) for word, size in sizes)

    def _split_memrefs(self, module: Module) -> tuple[str, ...]:
        """The memrefs whose rows are the split size, which a band's blocks take in bands."""
        memrefs = module.functions[self.name].memrefs
        return tuple(memref.name for words, memref in zip(self.shapes, memrefs)
                     if len(words) >= 2 and words[-2] == self.split)

    def source(self, shapes: tuple[tuple[int, ...], ...], dtype: object, structural: tuple = (),
               local_memory: int | None = None) -> str:
        """The PTO assembly of the instance for these shapes (what the kernel runs), for a
        target with `local_memory` bytes for tiles read whole (None: the CPU's)."""
        return print_module(self.module(self.sizes(shapes), as_dtype(dtype), structural, local_memory))


def first_fitting(f: FunctionBuilder, candidates: Sequence[T], write: Callable[[FunctionBuilder, T], None],
                  block_shared: int = cuda_codegen.SHARED_OPT_IN) -> T:
    """The first of `candidates` (a family's sizes for its tiles, most preferred first) with
    which `write` writes a function whose CUDA code, after tile reuse, is laid out as first
    tried on a GPU whose blocks may opt in to `block_shared` bytes (cuda_codegen.fits): each
    written into a sibling of `f` (its name and precision). None fitting is an ISAError naming
    the function and the last candidate."""
    name = "?"
    for candidate in candidates:
        trial = f.sibling()
        write(trial, candidate)
        module = Module("trial")
        module.add(function := trial.build())
        name = function.name
        if cuda_codegen.fits(optimize.optimize_module(module), name, block_shared):
            return candidate
    tried = f"the smallest tried: {candidates[-1]}" if candidates else "no size to try"
    raise ISAError(f"@{name}: no size of its tiles fits a CUDA block's shared memory and registers ({tried})")


def family(*, worker: WorkerType, shapes: tuple[str, ...], scalars: tuple[str, ...] = (),
           structural: tuple[str, ...] = (), name: str | None = None, library: Callable | None = None,
           library_cpu: Callable | None = None, library_native: Callable | None = None,
           split: str | None = None, tensor_band: int = SPLIT_ROWS,
           gemm: float | None = None) -> Callable[[Builder], Kernel]:
    """Declare a kernel family: the decorated function writes the InCore function for given sizes.

    `scalars` names the kernel's scalar params in order (the builder declares them with the same
    names); `structural` those among them whose value shapes the program; `library` a CuPy-level
    implementation the CUDA backend runs instead (as CudaCode.library: cuBLAS for the matmuls),
    and `library_cpu` a numpy one the CPU runs instead (BLAS on the views, for the matmuls, where
    the tile model's copies of whole weight matrices would cost more than the product), and
    `library_native` the NativeCode.entry that runs that library without the GIL (native_abi's
    NjitEntries over an njit function that library_cpu calls too, so both give the same bits).
    Generated code stays the kernel's definition: tests check the libraries against it.
    `split` names the size whose rows CUDA code spreads over blocks (see the module's doc), in
    bands of SPLIT_ROWS, or of `tensor_band` rows where the products run on tensor cores.
    `gemm`, for a product c = a @ b + gemm * c of params (a, b, c): the CUDA backend runs it as
    one cuBLAS call where the tiles' layout allows (CudaInstances.gemm).
    """
    for word in (s.split()[0] for s in shapes if len(s.split()) == 3):
        if word.isdigit():
            raise ParamError(f"shapes={shapes!r}: the leading dim of a 3-d param is a batch, a name")
    unknown = set(structural) - set(scalars)
    if unknown:
        raise ParamError(f"structural={structural!r} names {sorted(unknown)}, not among scalars={scalars!r}")
    if split is not None and split not in {s.split()[-2] for s in shapes if len(s.split()) >= 2}:
        raise ParamError(f"split={split!r} is not the rows of any of shapes={shapes!r}")

    def declare(build: Builder) -> Kernel:
        instances = Family(name or build.__name__, build, shapes, structural, scalars, library_cpu, split,
                           tensor_band)
        cuda = CudaInstances(instances.cuda, library, instances.structural, gemm)
        declared = kernel(worker=worker, name=instances.name, shapes=shapes, cuda=cuda)(instances.cpu)
        if library_cpu is None:
            declared.native = NativeCode(instances.native_entry, len(scalars), instances.structural)
        elif library_native is not None:  # else its tasks go to Python workers
            declared.native = NativeCode(library_native, len(scalars), instances.structural)
        # A library (cuBLAS, BLAS) reads and writes in an order the function does not say.
        declared.sharing_rule = _no_sharing if library or library_cpu else instances.sharing
        return declared

    return declare


def _no_sharing() -> Sharing:
    return Sharing.NONE


def family_of(declared: Kernel) -> Family:
    """The Family behind a kernel declared with @family."""
    instances = getattr(declared.cpu, "__self__", None)
    if not isinstance(instances, Family):
        raise ParamError(f"{declared.name} is not a kernel family")
    return instances
