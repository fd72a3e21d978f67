"""Reductions (TROWSUM, TROWMAX, TCOLSUM) and row broadcasts (TROWEXPANDSUB/DIV/MUL).

Row results are (m, 1) columns, so they broadcast back over their rows.
"""

import numpy as np

import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1"))
def row_sum(a, out):
    np.sum(a, axis=1, keepdims=True, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1"))
def row_max(a, out):
    np.max(a, axis=1, keepdims=True, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "1 n"))
def col_sum(a, out):
    np.sum(a, axis=0, keepdims=True, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1", "m n"))
def row_expand_sub(a, row, out):
    np.subtract(a, row, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1", "m n"))
def row_expand_div(a, row, out):
    np.divide(a, row, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m 1", "m n"))
def row_expand_mul(a, row, out):
    np.multiply(a, row, out=out)
