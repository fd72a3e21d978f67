"""Element-wise tiles (TADD, TSUB, TMUL, TDIV, TEXP, TLOG, TSQRT, TSILU) and scalar multiply."""

import numpy as np
from pto_gpu.kernels import cuda, every_element

import pto_gpu as pto


def ufunc_kernel(name: str, ufunc: np.ufunc, shapes: tuple[str, ...], source: str) -> pto.Kernel:
    """A VECTOR kernel applying `ufunc` to its inputs into its last tensor param; its CUDA
    implementation `pto_<name>` in kernels/cuda/`source` does one output element per item."""

    def body(*views):
        ufunc(*views[:-1], out=views[-1])

    code = cuda(source, every_element(len(shapes) - 1))
    return pto.kernel(worker=pto.VECTOR, name=name, shapes=shapes, cuda=code)(body)


BINARY = ("m n", "m n", "m n")
UNARY = ("m n", "m n")

add = ufunc_kernel("add", np.add, BINARY, "elementwise.cu")
sub = ufunc_kernel("sub", np.subtract, BINARY, "elementwise.cu")
mul = ufunc_kernel("mul", np.multiply, BINARY, "elementwise.cu")
div = ufunc_kernel("div", np.divide, BINARY, "elementwise.cu")
exp = ufunc_kernel("exp", np.exp, UNARY, "elementwise.cu")
log = ufunc_kernel("log", np.log, UNARY, "elementwise.cu")
sqrt = ufunc_kernel("sqrt", np.sqrt, UNARY, "elementwise.cu")


@pto.kernel(worker=pto.VECTOR, shapes=UNARY, cuda=cuda("elementwise.cu", every_element(1)))
def scale(a, out, factor):
    np.multiply(a, factor, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=UNARY, cuda=cuda("elementwise.cu", every_element(1)))
def silu(a, out):
    out[...] = a / (1 + np.exp(-a))
