"""Tile kernels for the matmul orchestration: zero, copy, matmul-accumulate."""


import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR)
def zero(out):
    out[...] = 0


@pto.kernel(worker=pto.VECTOR)
def copy(src, dst):
    dst[...] = src


@pto.kernel(worker=pto.CUBE)
def gemm_acc(a, b, c):
    """c += a @ b, computed into c's own memory (BLAS releases the GIL)."""
    c += a @ b
