"""Reductions (TROWSUM, TROWMAX, TCOLSUM) and row broadcasts (TROWEXPANDSUB/DIV/MUL).

Row results are (m, 1) columns, so they broadcast back over their rows.
"""

import pto_gpu as pto
from pto_gpu.dtypes import DataType
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.family import family


def row_reduce(instruction: str, name: str) -> pto.Kernel:
    def build(f: FunctionBuilder, dtype: DataType, m: int, n: int) -> None:
        f.memref("a", dtype, (m, n)).memref("out", dtype, (m, 1))
        f.tile("x", m, n, dtype).tile("r", m, 1, dtype)
        getattr(f.load("x", "a"), instruction)("r", "x")
        f.store("out", "r")

    return family(worker=pto.VECTOR, shapes=("m n", "m 1"), name=name)(build)


row_sum = row_reduce("rowsum", "row_sum")
row_max = row_reduce("rowmax", "row_max")


@family(worker=pto.VECTOR, shapes=("m n", "1 n"))
def col_sum(f: FunctionBuilder, dtype: DataType, m: int, n: int) -> None:
    f.memref("a", dtype, (m, n)).memref("out", dtype, (1, n)).tile("x", m, n, dtype).tile("c", 1, n, dtype)
    f.load("x", "a").colsum("c", "x").store("out", "c")


def row_expand(instruction: str, name: str) -> pto.Kernel:
    """out = `instruction`(a, b broadcast along each row)."""

    def build(f: FunctionBuilder, dtype: DataType, m: int, n: int) -> None:
        f.memref("a", dtype, (m, n)).memref("b", dtype, (m, 1)).memref("out", dtype, (m, n))
        f.tile("x", m, n, dtype).tile("r", m, 1, dtype).load("x", "a").load("r", "b")
        getattr(f, instruction)("x", "x", "r")
        f.store("out", "x")

    return family(worker=pto.VECTOR, shapes=("m n", "m 1", "m n"), name=name)(build)


row_expand_sub = row_expand("rowexpandsub", "row_expand_sub")
row_expand_div = row_expand("rowexpanddiv", "row_expand_div")
row_expand_mul = row_expand("rowexpandmul", "row_expand_mul")
