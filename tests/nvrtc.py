"""NVRTC for the tests: pto_gpu.isa.nvrtc (the package's binding), and a way to need it that
skips where the wheel is not installed and fails where it is installed and does not load."""

from __future__ import annotations

import ctypes
import importlib.metadata

import pytest

from pto_gpu.isa.nvrtc import compile_source, cuda_include_dir, cupy_options, library, version

__all__ = ["compile_cubin", "cuda_include_dir", "cupy_options", "library", "library_or_skip", "version"]


def library_or_skip() -> ctypes.CDLL:
    """`library()` for a test: skipped where the wheel is not installed (NVRTC is optional),
    failed where it is installed and libnvrtc does not load (a packaging break, not a reason)."""
    try:
        return library()
    except OSError as error:
        if _installed("nvidia-cuda-nvrtc-cu12"):
            pytest.fail(f"the nvidia-cuda-nvrtc-cu12 wheel is installed and libnvrtc does not load: {error}")
        pytest.skip(f"libnvrtc cannot be loaded: {error}")


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def compile_cubin(source: str, options: tuple[str, ...], name: str = "kern.cu") -> tuple[bool, str]:
    """Compile `source` with `options` (an -arch=sm_XX among them): whether it compiled, and the log."""
    ok, log, _ = compile_source(source, options, name)
    return ok, log
