"""`compile`: a verified module and a pto.Kernel for each of its InCore functions.

Each kernel's CPU implementation is the generated numba function (cpu_codegen) and its CUDA
implementation the generated source (cuda_codegen), both written under the cache directory.
The worker class is CUBE for a function that multiplies matrices (a TMATMUL or TMATMUL_ACC,
its inlined callees included), VECTOR otherwise. Kernels are created once, when the program is
compiled; compiling a module again declares new kernels. A library function's kernel is the
one its import path names (checked to take the tensors and scalars it declares), and the
variants adaptive loops need that the module does not define (lowering.variants) are
compiled beside its functions. InCore functions go through optimize.py's tile reuse first.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from pathlib import Path

from .. import generated
from ..dtypes import DataType, WorkerType
from ..errors import ParamError
from ..first_calls import preparing
from ..kernel import Kernel, NativeCode, kernel
from . import cpu_codegen, cuda_codegen, in_place, lowering, optimize, orchestrate, orchestration_codegen
from .dataflow import directions
from .errors import ISAError
from .family import family_of
from .ir import Call, Function, Module, Op, Statement, walk
from .ops import OPCODES, Form
from .verify import verify_function, verify_module


class Program:
    """A compiled module: `kernels[name]` for each InCore function and made variant."""

    def __init__(self, module: Module, variants: dict[str, Function], kernels: dict[str, Kernel],
                 cache_dir: Path):
        self.module, self.variants, self.kernels, self.cache_dir = module, variants, kernels, cache_dir
        self._orchestrations: dict[tuple[str, bool], Callable[..., None]] = {}

    def function(self, name: str) -> Function:
        """A function of the module, or a variant the compiler made."""
        function = self.module.functions.get(name) or self.variants.get(name)
        if function is None:
            raise ISAError(f"module {self.module.name}: unknown function @{name}")
        return function

    def __repr__(self) -> str:
        return f"Program({self.module.name}: {', '.join(self.kernels)})"

    def cuda_source(self, name: str) -> str:
        """The generated CUDA C of InCore function `name`."""
        return cuda_codegen.cuda_source(self.module, name)

    def cpu_source(self, name: str) -> str:
        """The generated Python (numba) source of InCore function `name`."""
        return cpu_codegen.cpu_source(self.module, name)

    def orchestration(self, name: str, compiled: bool = False) -> Callable[..., None]:
        """Orchestration function `name` as `fn(o, *arrays, *scalars)` for `rt.run`, each CALL
        of an InCore function a task: its body run against the Python orchestrator API
        (orchestrate.py), or with `compiled=True` as generated numba code over pto_gpu.jit
        (orchestration_codegen.py); the same tasks and edges either way."""
        key = (name, compiled)
        if key not in self._orchestrations:  # generated once: a run is then just the calls
            make = orchestration_codegen.orchestration if compiled else orchestrate.orchestration
            self._orchestrations[key] = make(self, name)
        return self._orchestrations[key]


def compile(module: Module) -> Program:  # noqa: A001 - the spec's name (docs/DESIGN.md: isa.compile)
    """Verify `module` and generate a kernel per InCore function."""
    verify_module(module)
    module = optimize.optimize_module(module)  # tile reuse by liveness: same results, less tile memory
    made = lowering.variants(module)
    expanded = Module(module.name, {**module.functions, **made})
    for variant in made.values():
        verify_function(variant, expanded)
    directory = generated.cache_dir()
    kernels = {}
    for function in expanded.functions.values():
        if not function.in_core:
            continue
        if function.library is not None:
            kernels[function.name] = _library_kernel(function)
            continue
        cube = _multiplies(module, function.body)
        # A task passes each memref a window of at most its declared shape (fewer rows: a tail),
        # of its declared width unless the function takes column tails.
        column = "<=" if function.column_tails else ""
        bounds = tuple(f"<={m.shape[0]} {column}{m.shape[1]}" for m in function.memrefs)
        # The CUDA code has one element type; a function over several runs on the CPU only.
        mixed = len({m.dtype for m in function.memrefs}) > 1
        declare = kernel(worker=WorkerType.CUBE if cube else WorkerType.VECTOR, name=function.name,
                         shapes=bounds, mixed_dtypes=mixed,
                         cuda=None if mixed else cuda_codegen.cuda_code(expanded, function.name, directory))
        declared = declare(cpu_codegen.cpu_function(expanded, function.name, directory))
        declared.dtypes = tuple(m.dtype for m in function.memrefs)
        declared.names = tuple(m.name for m in function.memrefs)
        declared.sharing_rule = functools.partial(in_place.sharing, function)
        declared.native = NativeCode(_NativeEntry(expanded, function.name, directory),
                                     sum(1 for s in function.scalars if s.param))
        kernels[function.name] = declared
    return Program(module, made, kernels, directory)


class _NativeEntry:
    """NativeCode.entry of a compiled InCore function: its generated code's one native entry
    (the memrefs fix the element types and bound the shapes, which submit checks)."""

    def __init__(self, module: Module, name: str, directory: Path):
        self._module, self._name, self._directory = module, name, directory
        self._made = False  # by the first call, under the lock: worker threads may race to it
        self._address: int | None = None  # None: no entry (half precision runs the Python way)
        self._lock = threading.Lock()

    def __call__(self, shapes: tuple[tuple[int, ...], ...], dtype: object, scalars: tuple) -> int | None:
        with self._lock:
            if not self._made:
                with preparing():  # compiling: a cost history leaves this call out
                    self._address = cpu_codegen.native_entry(self._module, self._name, self._directory)
                self._made = True
            return self._address


def _library_kernel(function: Function) -> Kernel:
    """The kernel a library function names, checked against its declaration."""
    path, _, attribute = function.library.rpartition(".")
    where = f"@{function.name} (library {function.library})"
    try:
        declared = getattr(importlib.import_module(path), attribute)
    except (ImportError, AttributeError) as error:
        raise ISAError(f"{where}: cannot import it: {error}") from None
    if not isinstance(declared, Kernel):
        raise ISAError(f"{where}: is a {type(declared).__name__}, not a pto.Kernel")
    try:
        family = family_of(declared)
    except ParamError:
        return declared  # a hand-written kernel: its own checks run at submit
    scalars = tuple(s.name for s in function.scalars)
    if len(function.memrefs) != family.tensors or scalars != family.scalar_names:
        raise ISAError(f"{where}: declares {len(function.memrefs)} memrefs and scalars "
                       f"({', '.join(scalars)}), but the kernel takes {family.tensors} tensors and scalars "
                       f"({', '.join(family.scalar_names)})")
    declared_flows, flows = [m.direction for m in function.memrefs], _family_directions(family)
    if declared_flows != flows:
        raise ISAError(f"{where}: declares directions ({', '.join(d.value for d in declared_flows)}), "
                       f"but the kernel's are ({', '.join(d.value for d in flows)}): a wrong one loses "
                       "dependencies")
    return declared


def _family_directions(family) -> list:
    """The memref directions of a family's program, from an instance at probe sizes (16 for
    every size, 2 for a batch, 1 for a structural scalar): directions do not depend on sizes."""
    shapes = tuple(tuple(2 if len(words) == 3 and i == 0 else int(w) if w.isdigit() else 16
                         for i, w in enumerate(words)) for words in family.shapes)
    instance = family.module(family.sizes(shapes), DataType.FLOAT32, (1,) * len(family.structural))
    return list(directions(instance.functions[family.name], instance).values())


def _multiplies(module: Module, body: tuple[Statement, ...]) -> bool:
    for statement in walk(body):
        if isinstance(statement, Op) and OPCODES[statement.opcode].form is Form.MATMUL:
            return True
        if isinstance(statement, Call) and _multiplies(module, module.functions[statement.callee].body):
            return True
    return False
