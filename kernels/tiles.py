"""Data movement and matrix tiles (TLOAD/TSTORE, TMATMUL, TMATMUL_ACC)."""

import numpy as np

import pto_gpu as pto


@pto.kernel(worker=pto.ACCELERATOR, shapes=("m n", "m n"))
def copy(src, dst):
    dst[...] = src


@pto.kernel(worker=pto.VECTOR, shapes=("m n",))
def zero(out):
    out[...] = 0


@pto.kernel(worker=pto.CUBE, shapes=("m k", "k n", "m n"))
def matmul(a, b, out):
    np.matmul(a, b, out=out)


@pto.kernel(worker=pto.CUBE, shapes=("m k", "k n", "m n"))
def matmul_acc(a, b, acc):
    """acc += a @ b (BLAS releases the GIL)."""
    acc += a @ b
