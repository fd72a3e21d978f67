"""Whether a GPU's wgmma computes as pto_wgmma.cuh reads its layouts: pto_gpu/isa/wgmma_probe.cu
(D = A B of small integers through the swizzled panels, by m64n64k16 and m64n128k16, B MN-major:
the forms the generated products take) run once and held to numpy. The CUDA backend asks before
it builds generated code for sm_90a (an H100's or H200's wgmma); the tests and the benchmark of
the instruction run the same probe."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .cuda_abi import COMPILE_OPTIONS, HEADER, WGMMA_HEADER

PROBE = HEADER.with_name("wgmma_probe.cu")
K = 128  # the probe's k (its kernels' third parameter)
# The probe's kernels, by their N and B's major (MN-major: B as a row-major tile lies).
KERNELS = {"wgmma_n64_mn_major": 64, "wgmma_n128_mn_major": 128, "wgmma_n64_k_major": 64,
           "wgmma_n128_k_major": 128}
SM_90A = "-arch=sm_90a"  # NVRTC's option, which wins over the plain arch CuPy adds to a RawModule's


def source() -> str:
    """The probe's text: pto_isa.cuh, pto_wgmma.cuh and the probe."""
    return HEADER.read_text() + WGMMA_HEADER.read_text() + PROBE.read_text()


def options(dtype: np.dtype) -> tuple[str, ...]:
    """Its build options for 16-bit `dtype`, a block one warpgroup (NVRTC's arch left out)."""
    return (*COMPILE_OPTIONS[np.dtype(dtype)], "-DPTO_WARPS=4")


def module(cupy, dtype: np.dtype):
    """The probe built for sm_90a by CuPy's NVRTC, as the backend builds generated code there."""
    return cupy.RawModule(code=source(), options=("-std=c++17", *options(dtype), SM_90A))


def shared_bytes(n: int, dtype: np.dtype) -> int:
    """The dynamic shared memory a launch of the N = `n` kernel gives a block: A's and B's
    panels."""
    return (64 * K + K * n) * np.dtype(dtype).itemsize


def operands(n: int, dtype: np.dtype, seed: int, rounds: int = 1, blocks: int = 1):
    """A (64 x K), B (K x N) of small integers, and what the probe writes: each block's rounds x
    A B, numpy's in float64 (exact in float32)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 5, (64, K)).astype(dtype)
    b = rng.integers(-4, 5, (K, n)).astype(dtype)
    return a, b, np.tile(rounds * (a.astype(np.float64) @ b.astype(np.float64)), (blocks, 1))


def differences(got: np.ndarray, want: np.ndarray) -> str:
    """Where a result differs from numpy's: how many elements, and the first few."""
    rows, cols = np.nonzero(got != want)
    shown = ", ".join(f"({r}, {c}): {got[r, c]} not {want[r, c]}" for r, c in zip(rows[:6], cols[:6]))
    return f"{len(rows)} of {got.size} elements differ: {shown}"


def launch(cupy, function, n: int, dtype: np.dtype, a, b, rounds: int = 1, blocks: int = 1):
    """Kernel `function` (N = `n`) of the probe on the GPU over A and B: its D, on the device."""
    shared = shared_bytes(n, dtype)
    function.max_dynamic_shared_size_bytes = shared
    a_gpu, b_gpu = (cupy.asarray(x.view(np.uint16)) for x in (a, b))  # as bits: CuPy may have no bfloat16
    d_gpu = cupy.full((blocks * 64, n), np.nan, cupy.float32)
    function((blocks,), (128,), (a_gpu, b_gpu, d_gpu, np.int32(rounds)), shared_mem=shared)
    return d_gpu


def disagreement(cupy) -> str | None:
    """None where the current GPU's wgmma gives numpy's products through the layouts the
    generated code writes (float16 and bfloat16, N 64 and 128, B MN-major, operands from the
    dynamic shared memory's own alignment), else why not: a build NVRTC refuses, or the
    elements that differ. A launch that fails raises, as any kernel's fault would."""
    kernels = ("wgmma_n64_mn_major", "wgmma_n128_mn_major")
    for dtype in map(np.dtype, (np.float16, ml_dtypes.bfloat16)):
        try:
            built = module(cupy, dtype)
            functions = {kernel: built.get_function(kernel) for kernel in kernels}  # NVRTC runs here
        except Exception as error:  # noqa: BLE001 - whatever stops the build: no wgmma, nothing run
            return f"the probe does not build for sm_90a: {type(error).__name__}: {error}"
        for kernel, function in functions.items():
            n = KERNELS[kernel]
            a, b, want = operands(n, dtype, seed=n)
            got = cupy.asnumpy(launch(cupy, function, n, dtype, a, b))
            if not np.array_equal(got, want):
                return f"{kernel}, {dtype}: {differences(got, want)}"
    return None
