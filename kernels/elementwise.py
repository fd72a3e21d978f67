"""Element-wise tiles (TADD, TSUB, TMUL, TDIV, TEXP, TLOG, TSQRT, TSILU) and scalar multiply."""

import numpy as np

import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
def add(a, b, out):
    np.add(a, b, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
def sub(a, b, out):
    np.subtract(a, b, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
def mul(a, b, out):
    np.multiply(a, b, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n", "m n"))
def div(a, b, out):
    np.divide(a, b, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"))
def scale(a, out, factor):
    np.multiply(a, factor, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"))
def exp(a, out):
    np.exp(a, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"))
def log(a, out):
    np.log(a, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"))
def sqrt(a, out):
    np.sqrt(a, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "m n"))
def silu(a, out):
    out[...] = a / (1 + np.exp(-a))
