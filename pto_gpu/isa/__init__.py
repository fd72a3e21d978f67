"""The PTO ISA compiler (spec 003 §1–3): one PTO program as the source of a kernel's CPU
and CUDA implementations.

    ir         the program as plain data: Module, Function, statements
    ops        the opcode table: one entry per instruction
    errors     ISAError
    builder    FunctionBuilder: the fluent way to write a function
    verify     the verifier (verify_function, verify_module) and inferred memref directions
    asm        the .pto assembly: print_module and parse
    pyize      to_python: builder code that rebuilds a module
    interpret  the numpy reference: run(module, name, *arrays_and_scalars)
    cpu_codegen   one generated numba function per InCore function (cached as .py files)
    cuda_codegen  one generated `extern "C" __global__` per InCore function (pto_isa.cuh)
    cuda_mma      its tensor-core products: mma.sync units over warps, fragments, lean steps
    cuda_lines    the text it writes and what its instructions' rules share
    column_blocks blocked(function, block): wide rows walked in blocks of columns, for CUDA

    nvrtc      NVRTC through ctypes, as CuPy's RawModule compiles (no GPU needed)
    ptx        gpu_code(kernel, shapes, dtype, scalars, arch): the PTX of a kernel instance
    program    compile(module) -> Program: a pto.Kernel per InCore function (library functions:
               the kernel their import path names)
    lowering   what both ways of running an Orchestration share: frees, the binary expansion,
               adaptive tiles and their variants
    orchestrate            Program.orchestration(name): the IR walked against the Python API
    orchestration_codegen  Program.orchestration(name, compiled=True): generated numba code
    family     @family: a kernel whose program is written for the sizes of each call
    optimize   IR-to-IR passes of InCore functions: tile reuse by liveness (reuse_tiles)

Docs: docs/ISA.md.
"""

from . import interpret
from .asm import parse, print_module
from .builder import FunctionBuilder
from .cuda_codegen import cuda_code, cuda_source
from .dataflow import directions
from .errors import ISAError
from .ir import (
    Alloc,
    Call,
    CallArg,
    Direction,
    For,
    Function,
    FunctionKind,
    If,
    MemRef,
    Module,
    Op,
    Predicate,
    Return,
    Scalar,
    Split,
    Tile,
    View,
)
from .ops import OPCODES, Form, OpSpec
from .program import Program, compile
from .ptx import gpu_code
from .pyize import to_python
from .verify import verify_function, verify_module

__all__ = ["Alloc", "Call", "CallArg", "Direction", "For", "Form", "Function", "FunctionBuilder",
           "FunctionKind", "ISAError", "If", "MemRef", "Module", "OPCODES", "Op", "OpSpec", "Predicate",
           "Program", "Return", "Scalar", "Split", "Tile", "View", "compile", "cuda_code", "cuda_source",
           "directions", "gpu_code", "interpret", "parse", "print_module", "to_python", "verify_function",
           "verify_module"]
