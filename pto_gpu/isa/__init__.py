"""The PTO ISA compiler (spec 003 §1–3): one PTO program as the source of a kernel's CPU
and CUDA implementations.

    ir         the program as plain data: Module, Function, statements
    ops        the opcode table: one entry per instruction
    errors     ISAError
    builder    FunctionBuilder: the fluent way to write a function
    verify     the verifier (verify_function, verify_module) and inferred memref directions
    asm        the .pto assembly: print_module (Module.to_pto) and parse
    pyize      to_python (Module.to_python): builder code that rebuilds a module
"""

from .asm import parse, print_module
from .builder import FunctionBuilder
from .errors import ISAError
from .ir import (
    Call,
    CallArg,
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
    Tile,
)
from .ops import OPCODES, Form, OpSpec
from .verify import Direction, directions, verify_function, verify_module

__all__ = ["Call", "CallArg", "Direction", "For", "Form", "Function", "FunctionBuilder", "FunctionKind",
           "ISAError", "If", "MemRef", "Module", "OPCODES", "Op", "OpSpec", "Predicate", "Return", "Scalar",
           "Tile", "directions", "parse", "print_module", "verify_function", "verify_module"]
