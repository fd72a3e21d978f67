"""Element-wise tiles (TADD, TSUB, TMUL, TDIV, TEXP, TLOG, TSQRT, TSILU) and scalar multiply."""

from pto_gpu.kernels.tiles import column_blocks

import pto_gpu as pto
from pto_gpu.dtypes import DataType
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.family import family

BINARY = ("m n", "m n", "m n")
UNARY = ("m n", "m n")


def binary(instruction: str, name: str) -> pto.Kernel:
    """out = `instruction`(a, b), element by element."""

    def build(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
        f.memref("a", dtype, (m, n)).memref("b", dtype, (m, n)).memref("out", dtype, (m, n))
        with column_blocks(f, n, local_memory) as (cols, j):
            f.tile("x", m, cols, dtype).tile("y", m, cols, dtype).load("x", "a", 0, j).load("y", "b", 0, j)
            getattr(f, instruction)("x", "x", "y")
            f.store("out", "x", 0, j)

    return family(worker=pto.VECTOR, shapes=BINARY, name=name)(build)


def unary(instruction: str) -> pto.Kernel:
    """out = `instruction`(a), element by element."""

    def build(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
        f.memref("a", dtype, (m, n)).memref("out", dtype, (m, n))
        with column_blocks(f, n, local_memory) as (cols, j):
            getattr(f.tile("x", m, cols, dtype).load("x", "a", 0, j), instruction)("x", "x")
            f.store("out", "x", 0, j)

    return family(worker=pto.VECTOR, shapes=UNARY, name=instruction)(build)


add, sub, mul, div = (binary(op, op) for op in ("add", "sub", "mul", "div"))
exp, log, sqrt, silu = (unary(op) for op in ("exp", "log", "sqrt", "silu"))


@family(worker=pto.VECTOR, shapes=UNARY, scalars=("factor",))
def scale(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
    """out = a * factor."""
    f.memref("a", dtype, (m, n)).memref("out", dtype, (m, n)).scalar("factor", pto.FLOAT64)
    with column_blocks(f, n, local_memory) as (cols, j):
        f.tile("x", m, cols, dtype).load("x", "a", 0, j).muls("x", "x", "factor").store("out", "x", 0, j)
