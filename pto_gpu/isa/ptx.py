"""`gpu_code`: the PTX of the CUDA code the backend loads for an instance of a kernel, made on
any machine (no GPU, no CuPy) by NVRTC with the options CuPy's RawModule uses (isa/nvrtc.py)."""

from __future__ import annotations

import re

import numpy as np

from ..backends import cuda_abi
from ..backends.cuda_abi import check_precision
from ..errors import ParamError, PTOError
from ..kernel import Kernel
from . import nvrtc
from .errors import ISAError


def gpu_code(kernel: Kernel, shapes, dtype, scalars: tuple = (), arch: str = "sm_90",
             precision: str = "exact") -> str:
    """The PTX of `kernel`'s CUDA code for a call with tensors of `shapes`, element type `dtype`
    and these `scalars` (those that pick a family's instance), for `arch` ("sm_80", "sm_90",
    ...): the instance a kernel family picks, compiled as the CUDA backend compiles it, for the
    virtual architecture (the cubin it loads is this PTX assembled). An H100 or H200 loads
    "sm_90a" code (products laid out for wgmma take it: docs/ISA.md) where that runs right. A
    kernel whose tasks run a library on a GPU (the matmuls' cuBLAS) gives the generated code it
    runs while capturing.
    `precision` as Runtime's: "tf32" gives a family's float32 instance its TF32 products."""
    match = re.fullmatch(r"sm_(\d+a?)", arch)
    if match is None:
        raise ParamError(f"gpu_code: arch={arch!r} is not a GPU architecture such as 'sm_80', 'sm_90' or "
                         "'sm_90a'")
    if not isinstance(kernel, Kernel) or kernel.cuda is None:
        name = getattr(kernel, "name", repr(kernel))
        raise PTOError(f"gpu_code: {name} has no CUDA code (a kernel family, a kernel compiled from a PTO "
                       "program, or one declared with cuda=pto.CudaCode(...) has)")
    code = kernel.cuda.code_for([tuple(s) for s in shapes], np.dtype(dtype), tuple(scalars),
                                check_precision(precision, "gpu_code") == "tf32",
                                _block_shared(arch))
    options = cuda_abi.nvrtc_options(code.source.parent, np.dtype(dtype), kernel.name)
    try:
        ok, log, ptx = nvrtc.compile_source(code.source.read_text(),
                                            nvrtc.cupy_options(options, match.group(1), ptx=True),
                                            code.source.name)
    except OSError as error:  # no libnvrtc, or no CUDA headers (FileNotFoundError)
        raise PTOError(f"gpu_code needs NVRTC: {error}") from error
    if not ok:
        raise ISAError(f"{kernel.name}: NVRTC could not compile its CUDA code for {arch}:\n{log}")
    return ptx.rstrip(b"\0").decode()


def _block_shared(arch: str) -> int | None:
    """What an instance's block may take on a GPU of `arch`, as the CUDA backend sizes it there
    (None where the table has no such GPU: any GPU with tensor cores)."""
    block_shared = cuda_abi.BLOCK_SHARED.get(arch.removesuffix("a"))
    return None if block_shared is None else cuda_abi.instance_shared(block_shared)
