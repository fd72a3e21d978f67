"""`compile`: a verified module and a pto.Kernel for each of its InCore functions.

Each kernel's CPU implementation is the generated numba function (cpu_codegen) and its CUDA
implementation the generated source (cuda_codegen), both written under the cache directory.
The worker class is CUBE for a function that multiplies matrices (a TMATMUL or TMATMUL_ACC,
its inlined callees included), VECTOR otherwise. Kernels are created once, when the program is
compiled; compiling a module again declares new kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..dtypes import WorkerType
from ..kernel import Kernel, kernel
from . import cpu_codegen, cuda_codegen, orchestrate, orchestration_codegen
from .ir import Call, Module, Op, Statement, walk
from .ops import OPCODES, Form
from .verify import verify_module


class Program:
    """A compiled module: `kernels[name]` for each InCore function."""

    def __init__(self, module: Module, kernels: dict[str, Kernel], cache_dir: Path):
        self.module, self.kernels, self.cache_dir = module, kernels, cache_dir

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
        if compiled:
            return orchestration_codegen.orchestration(self, name)
        return orchestrate.orchestration(self, name)


def compile(module: Module) -> Program:  # noqa: A001 - the spec's name (../shared/design.md: isa.compile)
    """Verify `module` and generate a kernel per InCore function."""
    verify_module(module)
    directory = cpu_codegen.cache_dir()
    kernels = {}
    for function in module.functions.values():
        if not function.in_core:
            continue
        cube = _multiplies(module, function.body)
        # A task passes each memref a window of at most its declared shape (smaller: a tail).
        bounds = tuple(f"<={m.shape[0]} <={m.shape[1]}" for m in function.memrefs)
        # The CUDA code has one element type; a function over several runs on the CPU only.
        mixed = len({m.dtype for m in function.memrefs}) > 1
        declare = kernel(worker=WorkerType.CUBE if cube else WorkerType.VECTOR, name=function.name,
                         shapes=bounds, mixed_dtypes=mixed,
                         cuda=None if mixed else cuda_codegen.cuda_code(module, function.name, directory))
        kernels[function.name] = declare(cpu_codegen.cpu_function(module, function.name, directory))
    return Program(module, kernels, directory)


def _multiplies(module: Module, body: tuple[Statement, ...]) -> bool:
    for statement in walk(body):
        if isinstance(statement, Op) and OPCODES[statement.opcode].form is Form.MATMUL:
            return True
        if isinstance(statement, Call) and _multiplies(module, module.functions[statement.callee].body):
            return True
    return False
