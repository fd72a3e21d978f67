"""Element-wise tiles (TADD, TSUB, TMUL, TDIV, TEXP, TLOG, TSQRT, TSILU) and scalar multiply."""

import numpy as np

import pto_gpu as pto


def ufunc_kernel(name: str, ufunc: np.ufunc, shapes: tuple[str, ...]) -> pto.Kernel:
    """A VECTOR kernel applying `ufunc` to its inputs into its last tensor param."""

    def body(*views):
        ufunc(*views[:-1], out=views[-1])

    return pto.kernel(worker=pto.VECTOR, name=name, shapes=shapes)(body)


BINARY = ("m n", "m n", "m n")
UNARY = ("m n", "m n")

add = ufunc_kernel("add", np.add, BINARY)
sub = ufunc_kernel("sub", np.subtract, BINARY)
mul = ufunc_kernel("mul", np.multiply, BINARY)
div = ufunc_kernel("div", np.divide, BINARY)
exp = ufunc_kernel("exp", np.exp, UNARY)
log = ufunc_kernel("log", np.log, UNARY)
sqrt = ufunc_kernel("sqrt", np.sqrt, UNARY)


@pto.kernel(worker=pto.VECTOR, shapes=UNARY)
def scale(a, out, factor):
    np.multiply(a, factor, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=UNARY)
def silu(a, out):
    out[...] = a / (1 + np.exp(-a))
