"""Sample arguments for every kernel in kernels/: strided positive arrays of its declared shapes
and its scalars. Shared by the kernel tests (test_kernels.py) and those of the CUDA backend."""

import numpy as np
from pto_gpu.kernels import elementwise, llm, reduce, tiles

import pto_gpu as pto

MODULES = (tiles, elementwise, reduce, llm)
KERNELS = sorted({k for m in MODULES for k in vars(m).values() if isinstance(k, pto.Kernel)},
                 key=lambda k: k.name)
SIZES = {"m": 5, "n": 8, "k": 3, "h": 2, "d": 4, "p": 3, "b": 2}  # rope: n = 2 heads of 4
SCALARS = {"scale": (1.5,), "rmsnorm": (1e-6,), "rope": (7, 2), "flash_scores": (3, 1, True),
           "flash_attention_tile": (3, True)}


def shapes(kernel: pto.Kernel, sizes: dict[str, int] = SIZES) -> list[tuple[int, ...]]:
    return [tuple(int(w) if w.isdigit() else sizes[w] for w in dims) for dims in kernel.shapes]


def strided(shape: tuple[int, ...], dtype, rng: np.random.Generator) -> np.ndarray:
    """Positive values (log, sqrt and div need them) in a view with a gap after every element."""
    padded = np.zeros((*shape[:-1], 2 * shape[-1] + 1), dtype)
    view = padded[..., 1::2]
    view[...] = rng.uniform(0.5, 2.0, shape)
    return view


def arrays(kernel: pto.Kernel, dtype, sizes: dict[str, int] = SIZES) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, kernel.name)))
    return [strided(shape, dtype, rng) for shape in shapes(kernel, sizes)]
