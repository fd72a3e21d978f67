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
contraction for the GPU's shared memory and not for the CPU's BLAS.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..dtypes import DataType, WorkerType, as_dtype
from ..errors import ParamError
from ..kernel import CudaCode, CudaInstances, Kernel, kernel
from . import cpu_codegen, cuda_codegen
from .builder import FunctionBuilder
from .ir import Module

Builder = Callable[..., None]


class Family:
    """The instances of one family: (sizes, dtype, structural scalars) -> compiled module."""

    def __init__(self, name: str, build: Builder, shapes: tuple[str, ...], structural: tuple[str, ...],
                 scalar_names: tuple[str, ...]):
        self.name, self.build = name, build
        self.shapes = tuple(tuple(s.split()) for s in shapes)
        self.structural = tuple(scalar_names.index(s) for s in structural)
        self.structural_names = structural
        self.tensors = len(self.shapes)
        self.budgeted = "local_memory" in inspect.signature(build).parameters
        self._modules: dict[tuple, Module] = {}
        self._cpu: dict[tuple, Callable] = {}  # call signature -> ready-to-call CPU entry
        self._cuda: dict[tuple, CudaCode] = {}
        self._lock = threading.Lock()  # worker threads may meet a new shape together
        self.directory: Path = cpu_codegen.cache_dir()

    # --- instances ---------------------------------------------------------------------------
    def sizes(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[str, int], ...]:
        """The named sizes of a call (its batch words left out), in first-seen order."""
        sizes: dict[str, int] = {}
        for words, shape in zip(self.shapes, shapes):
            if len(words) == 3:
                words, shape = words[1:], shape[1:]
            for word, size in zip(words, shape):
                if not word.isdigit():
                    sizes.setdefault(word, int(size))
        return tuple(sizes.items())

    def module(self, sizes: tuple[tuple[str, int], ...], dtype: DataType, structural: tuple,
               local_memory: int | None = None) -> Module:
        budget = {"local_memory": local_memory} if self.budgeted else {}
        key = (sizes, dtype, structural, *budget.values())
        module = self._modules.get(key)
        if module is None:
            module = Module(f"{self.name}_" + "_".join(f"{w}{n}" for w, n in sizes))
            builder = FunctionBuilder(self.name, module=module).in_core()
            named = dict(zip(self.structural_names, structural))
            self.build(builder, dtype, **dict(sizes), **named, **budget)
            builder.build()
            self._modules[key] = module
        return module

    def cpu(self, *args) -> None:
        """The CPU implementation: the generated function of this call's instance."""
        tensors = args[:self.tensors]
        shapes = tuple(t.shape for t in tensors)
        structural = tuple(args[self.tensors + i] for i in self.structural)
        signature = (shapes, tensors[0].dtype, structural)
        run = self._cpu.get(signature)  # a dict read is atomic under the GIL
        if run is None:
            with self._lock:
                run = self._cpu.get(signature) or self._cpu_entry(shapes, tensors[0].dtype, structural)
                self._cpu[signature] = run
        run(*args)

    def _cpu_entry(self, shapes, dtype, structural) -> Callable:
        module = self.module(self.sizes(shapes), as_dtype(dtype), structural)
        if all(len(s) == 2 for s in shapes):
            return cpu_codegen.cpu_function(module, self.name, self.directory)
        batched = cpu_codegen.cpu_function(module, self.name, self.directory, batched=True)
        count = self.tensors

        def run(*args):
            batched(*(a if a.ndim == 3 else a[None] for a in args[:count]), *args[count:])

        return run

    def cuda(self, shapes: tuple[tuple[int, ...], ...], dtype: np.dtype, scalars: tuple) -> CudaCode:
        """The CUDA code of the instance for a call with these shapes and scalar values."""
        key = (self.sizes(shapes), as_dtype(dtype), tuple(scalars[i] for i in self.structural))
        code = self._cuda.get(key)
        if code is None:
            with self._lock:
                module = self.module(*key, local_memory=cuda_codegen.SHARED_LIMIT)
                code = self._cuda.get(key) or cuda_codegen.cuda_code(module, self.name, self.directory)
                self._cuda[key] = code
        return code

    def source(self, shapes: tuple[tuple[int, ...], ...], dtype: object, structural: tuple = (),
               local_memory: int | None = None) -> str:
        """The PTO assembly of the instance for these shapes (what the kernel runs), for a
        target with `local_memory` bytes for tiles read whole (None: the CPU's)."""
        return self.module(self.sizes(shapes), as_dtype(dtype), structural, local_memory).to_pto()


def family(*, worker: WorkerType, shapes: tuple[str, ...], scalars: tuple[str, ...] = (),
           structural: tuple[str, ...] = (), name: str | None = None,
           library: Callable | None = None) -> Callable[[Builder], Kernel]:
    """Declare a kernel family: the decorated function writes the InCore function for given sizes.

    `scalars` names the kernel's scalar params in order (the builder declares them with the same
    names); `structural` those among them whose value shapes the program; `library` a CuPy-level
    implementation the CUDA backend runs instead (as CudaCode.library: cuBLAS for the matmuls).
    """
    for word in (s.split()[0] for s in shapes if len(s.split()) == 3):
        if word.isdigit():
            raise ParamError(f"shapes={shapes!r}: the leading dim of a 3-d param is a batch, a name")
    unknown = set(structural) - set(scalars)
    if unknown:
        raise ParamError(f"structural={structural!r} names {sorted(unknown)}, not among scalars={scalars!r}")

    def declare(build: Builder) -> Kernel:
        instances = Family(name or build.__name__, build, shapes, structural, scalars)
        return kernel(worker=worker, name=instances.name, shapes=shapes,
                      cuda=CudaInstances(instances.cuda, library))(instances.cpu)

    return declare


def family_of(declared: Kernel) -> Family:
    """The Family behind a kernel declared with @family."""
    instances = getattr(declared.cpu, "__self__", None)
    if not isinstance(instances, Family):
        raise ParamError(f"{declared.name} is not a kernel family")
    return instances
