"""InCore kernels (spec 003 §1.1): each declares its worker class and param shapes; its body
is the CPU implementation, written to the view it is given (outputs are never rebound), and
`cuda=` names its CUDA implementation in kernels/cuda/*.cu.

tiles        copy, fill, matmul, matmul-accumulate
elementwise  add, sub, mul, div, exp, log, sqrt, silu, scalar multiply
reduce       row sum, row max, column sum, row-broadcast sub / div / mul
llm          RMSNorm, rotary embedding, SwiGLU, flash-attention blocks
"""

import math
from collections.abc import Callable
from pathlib import Path

import pto_gpu as pto

CUDA_SOURCES = Path(__file__).parent / "cuda"
Items = Callable[[list[tuple[int, ...]]], int]


def cuda(source: str, items: Items, library: Callable | None = None) -> pto.CudaCode:
    """The CUDA implementation in kernels/cuda/`source`, walking `items(shapes)` work items."""
    return pto.CudaCode(CUDA_SOURCES / source, items, library)


def every_element(param: int) -> Items:
    return lambda shapes: math.prod(shapes[param])


def every_row(param: int) -> Items:
    return lambda shapes: math.prod(shapes[param][:-1])
