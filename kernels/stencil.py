"""The three-point stencil of a 1-D chunk: the neighbours it needs come as halo params.

CPU only (numpy); a CUDA implementation would be a generated family like the other tiles'.
"""

import numpy as np

import pto_gpu as pto


@pto.kernel(worker=pto.VECTOR, shapes=("1", "n", "1", "n"))
def stencil3(left, mid, right, out):
    """out[i] = (x[i-1] + x[i] + x[i+1]) / 3 over the chunk `mid`, x extended by the halos."""
    x = np.concatenate([left, mid, right])
    out[:] = (x[:-2] + x[1:-1] + x[2:]) / 3
