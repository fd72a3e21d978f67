"""Reductions (TROWSUM, TROWMAX, TCOLSUM) and row broadcasts (TROWEXPANDSUB/DIV/MUL).

Row results are (m, 1) columns, so they broadcast back over their rows.
"""

import math

from pto_gpu.kernels.tiles import COLUMN_BLOCK, column_blocks

import pto_gpu as pto
from pto_gpu.dtypes import DataType
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.family import family


def row_reduce(instruction: str, combine: str, identity: float, name: str) -> pto.Kernel:
    """out = `instruction` over each row; in column blocks on CUDA, each block's result
    `combine`d into a running one that starts at `identity`."""

    def build(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
        f.memref("a", dtype, (m, n)).memref("out", dtype, (m, 1)).tile("r", m, 1, dtype)
        blocked = local_memory is not None and n > COLUMN_BLOCK
        if blocked:
            f.tile("part", m, 1, dtype).fill("r", identity)
        with column_blocks(f, n, local_memory) as (cols, j):
            f.tile("x", m, cols, dtype).load("x", "a", 0, j)
            if blocked:
                getattr(getattr(f, instruction)("part", "x"), combine)("r", "part", "r")
            else:
                getattr(f, instruction)("r", "x")
        f.store("out", "r")

    return family(worker=pto.VECTOR, shapes=("m n", "m 1"), name=name)(build)


row_sum = row_reduce("rowsum", "add", 0.0, "row_sum")
row_max = row_reduce("rowmax", "max", -math.inf, "row_max")


@family(worker=pto.VECTOR, shapes=("m n", "1 n"))
def col_sum(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
    """out = the sum of each column. The CUDA code reads a column sum's tile whole from shared
    memory: in column blocks, and in blocks of rows that fit it, summed."""
    f.memref("a", dtype, (m, n)).memref("out", dtype, (1, n))
    with column_blocks(f, n, local_memory) as (cols, j):
        rows = m if local_memory is None else max(1, min(m, local_memory // (8 * cols)))
        f.tile("x", rows, cols, dtype).tile("c", 1, cols, dtype)
        if rows == m:
            f.load("x", "a", 0, j).colsum("c", "x")
        else:
            f.tile("part", 1, cols, dtype).fill("c", 0.0).for_loop("i", 0, m, rows)
            f.load("x", "a", "i", j).colsum("part", "x").add("c", "part", "c").end_for()
        f.store("out", "c", 0, j)


def row_expand(instruction: str, name: str) -> pto.Kernel:
    """out = `instruction`(a, b broadcast along each row)."""

    def build(f: FunctionBuilder, dtype: DataType, m: int, n: int, local_memory: int | None) -> None:
        f.memref("a", dtype, (m, n)).memref("b", dtype, (m, 1)).memref("out", dtype, (m, n))
        f.tile("r", m, 1, dtype).load("r", "b")
        with column_blocks(f, n, local_memory) as (cols, j):
            f.tile("x", m, cols, dtype).load("x", "a", 0, j)
            getattr(f, instruction)("x", "x", "r")
            f.store("out", "x", 0, j)

    return family(worker=pto.VECTOR, shapes=("m n", "m 1", "m n"), name=name)(build)


row_expand_sub = row_expand("rowexpandsub", "row_expand_sub")
row_expand_div = row_expand("rowexpanddiv", "row_expand_div")
row_expand_mul = row_expand("rowexpandmul", "row_expand_mul")
