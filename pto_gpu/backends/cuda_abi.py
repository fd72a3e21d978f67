"""The argument and launch convention of the generated CUDA kernels (pto_gpu/isa/pto_isa.cuh).

Shared by the CUDA backend and by the host build the tests run the same sources through. A
tensor param becomes its data pointer followed by the sizes and element strides of three
dims (shapes padded with leading 1s); a float scalar becomes a double, an int or bool a long
long. The element type is fixed when a module is compiled: COMPILE_OPTIONS per numpy dtype.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from ..errors import PTOError

MAX_DIMS = 3
THREADS_PER_BLOCK = 256  # every launch's block: the generated kernels' warps and shared memory assume it
# A block's shared memory: its tiles are sized to SHARED_LIMIT (what a block gets without opting
# in); with the other buffers of loads ahead (cp.async) it may take up to SHARED_OPT_IN, twice
# that, which every GPU with tensor cores the generated code uses (sm_80 and later) gives a
# function opted in (cuFuncSetAttribute), with 3 KiB to spare for static shared memory. A kernel
# that holds an SM alone may take more where the GPU has it (cuda_codegen.Generator.tile_budget):
# BLOCK_SHARED is what a block may opt in to on each (cudaDevAttrMaxSharedMemoryPerBlockOptin).
SHARED_LIMIT = 48 * 1024
SHARED_OPT_IN = 2 * SHARED_LIMIT
BLOCK_SHARED = {"sm_80": 166_912, "sm_86": 101_376, "sm_87": 166_912, "sm_89": 101_376, "sm_90": 232_448,
                "sm_100": 232_448, "sm_120": 101_376}
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97  # the device attribute (CUdevice_attribute, cudaDeviceAttr)
# The persistent kernel's words after an instance's tiles (persistent_module.shared_bytes): the
# piece of its task a block runs and of how many (pto_persistent.cuh), padded.
PIECE_BYTES = 16
# What every generated source pastes at its top, and the persistent kernel's module once.
HEADER = Path(__file__).parent.parent / "isa" / "pto_isa.cuh"
# What a generated source with products laid out for wgmma pastes after it (sm_90a's products).
WGMMA_HEADER = HEADER.with_name("pto_wgmma.cuh")
MAX_BLOCKS = 4096  # kernels loop over their work items, so more blocks only add launch cost
COMPILE_OPTIONS = {
    np.dtype(np.float32): ("-DPTO_T=float",),
    np.dtype(np.float64): ("-DPTO_T=double",),
    np.dtype(np.float16): ("-DPTO_T=__half", "-DPTO_ACC=float", "-DPTO_HALF"),
    np.dtype(ml_dtypes.bfloat16): ("-DPTO_T=__nv_bfloat16", "-DPTO_ACC=float", "-DPTO_BF16"),
}


def instance_shared(block_shared: int) -> int:
    """The shared memory a generated instance's block may take on a GPU whose blocks may opt in
    to `block_shared` bytes: less the persistent kernel's words after its tiles, so that an
    instance runs on either executor."""
    return block_shared - PIECE_BYTES


# How a run's float32 tile products are computed in generated CUDA code: exactly (FMA), or on
# tensor cores as TF32 (Runtime(precision="tf32"); docs/ISA.md, "TF32, on request").
PRECISIONS = ("exact", "tf32")


def check_precision(precision: object, where: str) -> str:
    if precision not in PRECISIONS:
        raise PTOError(f"{where}: precision={precision!r}; choose one of {', '.join(map(repr, PRECISIONS))}")
    return precision


def symbol(kernel_name: str) -> str:
    return f"pto_{kernel_name}"


def compile_options(dtype: np.dtype | None, kernel_name: str) -> tuple[str, ...]:
    """The element type's options; none for dtype None, a source that defines its element types
    itself (the persistent kernel's module, whose instances may be of several)."""
    if dtype is None:
        return ()
    options = COMPILE_OPTIONS.get(np.dtype(dtype))
    if options is None:
        supported = ", ".join(str(d) for d in COMPILE_OPTIONS)
        raise PTOError(f"{kernel_name}: the CUDA kernels are built for {supported}, not {np.dtype(dtype)}")
    return options


def type_defines(dtype: np.dtype, kernel_name: str) -> list[str]:
    """The element type's compile options as the #define lines a source gives itself, PTO_ACC
    always among them (pto_isa.cuh makes it PTO_T where it is not defined)."""
    defines = {"PTO_ACC": "PTO_T"}
    for option in compile_options(dtype, kernel_name):
        name, _, value = option.removeprefix("-D").partition("=")
        defines[name] = value
    return [f"#define {name} {value}".rstrip() for name, value in defines.items()]


def nvrtc_options(source_dir: Path, dtype: np.dtype | None, kernel_name: str) -> tuple[str, ...]:
    """The options a kernel's source is compiled with (CuPy's RawModule, so NVRTC, adds its own)."""
    return ("-std=c++17", f"-I{source_dir}", *compile_options(dtype, kernel_name))


def tensor_words(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> list[np.int64]:
    """The six words after a tensor's pointer: three sizes, then three element strides."""
    if len(shape) > MAX_DIMS:
        raise PTOError(f"CUDA kernels take tensors of at most {MAX_DIMS} dims, not shape {shape}")
    pad = MAX_DIMS - len(shape)
    words = [1] * pad + list(shape) + [0] * pad + [stride // itemsize for stride in byte_strides]
    return [np.int64(w) for w in words]


def is_integer(value: object) -> bool:
    """Whether a scalar goes as long long when its kernel does not say which: from its type."""
    return isinstance(value, (bool, int, np.integer, np.bool_))


def scalar_kinds(declared: tuple[bool, ...] | None, scalars: tuple) -> tuple[bool, ...]:
    """Whether each scalar goes as long long (else double): as the kernel declares
    (CudaCode.integer_scalars), else from each value's type."""
    return declared if declared is not None else tuple(map(is_integer, scalars))


def scalar_word(value: object, integer: bool | None = None) -> np.int64 | np.float64:
    """A scalar's word: long long when `integer` (the kernel declares an integer), double when
    not; when the kernel does not say (None), from the value's Python type."""
    if integer is None:
        integer = is_integer(value)
    return np.int64(value) if integer else np.float64(value)
