"""Reductions (TROWSUM, TROWMAX, TCOLSUM) and row broadcasts (TROWEXPANDSUB/DIV/MUL).

Row results are (m, 1) columns, so they broadcast back over their rows.
"""

import numpy as np
from pto_gpu.kernels import cuda, every_row
from pto_gpu.kernels.elementwise import ufunc_kernel

import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1"), cuda=cuda("reduce.cu", every_row(0)))
def row_sum(a, out):
    np.sum(a, axis=1, keepdims=True, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1"), cuda=cuda("reduce.cu", every_row(0)))
def row_max(a, out):
    np.max(a, axis=1, keepdims=True, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "1 n"), cuda=cuda("reduce.cu", lambda shapes: shapes[0][1]))
def col_sum(a, out):
    np.sum(a, axis=0, keepdims=True, out=out)


ROW_BROADCAST = ("m n", "m 1", "m n")

row_expand_sub = ufunc_kernel("row_expand_sub", np.subtract, ROW_BROADCAST, "reduce.cu")
row_expand_div = ufunc_kernel("row_expand_div", np.divide, ROW_BROADCAST, "reduce.cu")
row_expand_mul = ufunc_kernel("row_expand_mul", np.multiply, ROW_BROADCAST, "reduce.cu")
