"""Generated CUDA code built for the host by g++ (pto_isa.cuh makes it plain C++) and called
with the arguments CudaBackend._launch would pass: how the tests run CUDA code without a GPU."""

import ctypes
import subprocess
from pathlib import Path

import numpy as np

from pto_gpu.backends import cuda_abi
from pto_gpu.backends.cuda_abi import MAX_BLOCKS, THREADS_PER_BLOCK
from pto_gpu.backends.emulated_device import HOST_FLAGS
from pto_gpu.kernel import CudaCode


def build(code: CudaCode, dtype, folder: Path, wgmma: bool = False) -> ctypes.CDLL:
    """The code's source compiled for the host, as a loaded library; with `wgmma`, as sm_90a runs
    it (PTO_HOST_WGMMA: the CUDA emulator's emulate="gpu-code-sm90a")."""
    library = folder / f"{code.source.stem}-{np.dtype(dtype)}{'-wgmma' if wgmma else ''}.so"
    return compile_source(code.source, dtype, library, wgmma)


def build_all(codes, dtype, folder: Path) -> ctypes.CDLL:
    """Several codes' sources pasted together into one library (one g++ run for them all)."""
    source = folder / "all.cpp"
    source.write_text("".join(code.source.read_text() for code in codes))
    return compile_source(source, dtype, folder / "all.so")


def compile_source(source: Path, dtype, library: Path, wgmma: bool = False) -> ctypes.CDLL:
    """Generated CUDA source (one kernel's, or several pasted together) built by g++ for
    `dtype` into `library` (a new path: dlopen caches by path), loaded; `wgmma` as build()'s."""
    options = (*HOST_FLAGS, "-Wall", "-Werror", *cuda_abi.COMPILE_OPTIONS[np.dtype(dtype)],
               *(("-DPTO_HOST_WGMMA",) if wgmma else ()))
    subprocess.run(["g++", "-x", "c++", *options, str(source), "-o", str(library)], check=True)
    return ctypes.CDLL(str(library))


def call(library: ctypes.CDLL, name: str, code: CudaCode, arrays, scalars) -> None:
    """pto_host_<name> over numpy arrays and scalars."""
    items = code.items([a.shape for a in arrays])
    args = [ctypes.c_longlong(min(MAX_BLOCKS, -(-items // THREADS_PER_BLOCK)))]
    for array in arrays:
        args.append(ctypes.c_void_p(array.ctypes.data))
        args += [ctypes.c_longlong(int(w)) for w in cuda_abi.tensor_words(array.shape, array.strides,
                                                                           array.itemsize)]
    for value, integer in zip(scalars, code.integer_scalars):
        word = cuda_abi.scalar_word(value, integer)
        integer = isinstance(word, np.int64)
        args.append(ctypes.c_longlong(int(word)) if integer else ctypes.c_double(float(word)))
    getattr(library, f"pto_host_{name}")(*args)
