"""Data movement and matrix tiles (TLOAD/TSTORE, TMATMUL, TMATMUL_ACC).

On the GPU the matmuls call cuBLAS through CuPy. Their kernels in kernels/cuda/tiles.cu run
while a CUDA graph is being captured (Runtime.capture), where CuPy refuses cuBLAS.
"""

import numpy as np
from pto_gpu.kernels import cuda, every_element

import pto_gpu as pto


@pto.kernel(worker=pto.ACCELERATOR, shapes=("m n", "m n"), cuda=cuda("tiles.cu", every_element(1)))
def copy(src, dst):
    dst[...] = src


@pto.kernel(worker=pto.VECTOR, shapes=("m n",), cuda=cuda("tiles.cu", every_element(0)))
def zero(out):
    out[...] = 0


def _cublas_matmul(a, b, out):
    import cupy  # only the CUDA backend calls this, and only there is CuPy installed

    cupy.matmul(a, b, out=out)


def _cublas_matmul_acc(a, b, acc):
    acc += a @ b  # CuPy arrays: cuBLAS into a pooled temporary


@pto.kernel(worker=pto.CUBE, shapes=("m k", "k n", "m n"),
            cuda=cuda("tiles.cu", every_element(2), library=_cublas_matmul))
def matmul(a, b, out):
    np.matmul(a, b, out=out)


@pto.kernel(worker=pto.CUBE, shapes=("m k", "k n", "m n"),
            cuda=cuda("tiles.cu", every_element(2), library=_cublas_matmul_acc))
def matmul_acc(a, b, acc):
    """acc += a @ b (BLAS releases the GIL)."""
    acc += a @ b
