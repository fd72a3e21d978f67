"""NVRTC through ctypes, compiling as CuPy's RawModule does, for the tests (no GPU or CuPy needed).

Owns finding libnvrtc and the CUDA headers in the NVIDIA wheels of the test extra
(nvidia-cuda-nvrtc-cu12, nvidia-cuda-runtime-cu12), the options CuPy adds to a RawModule's own,
and compiling one source to a cubin, returning NVRTC's log.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
from functools import cache
from pathlib import Path

import pytest

SUCCESS = 0  # NVRTC_SUCCESS


def _wheel_dirs(package: str) -> list[Path]:
    """The folders named `package` in the `nvidia` namespace package the NVIDIA wheels install into."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) / package for p in spec.submodule_search_locations if (Path(p) / package).is_dir()]


@cache
def library() -> ctypes.CDLL:
    """libnvrtc of the nvidia-cuda-nvrtc-cu12 wheel; OSError where it is missing or does not load."""
    found = [lib for folder in _wheel_dirs("cuda_nvrtc") for lib in sorted(folder.glob("lib/libnvrtc.so.*"))]
    if not found:
        raise OSError("no libnvrtc: the nvidia-cuda-nvrtc-cu12 wheel (the test extra) is not installed")
    lib = ctypes.CDLL(str(found[0]))  # a CDLL call releases the GIL: compiles can run in threads
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


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


def _check(result: int, call: str) -> None:
    if result != SUCCESS:
        raise RuntimeError(f"{call}: {library().nvrtcGetErrorString(result).decode()}")


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def cuda_include_dir() -> Path:
    """The CUDA headers (cuda_fp16.h) CuPy hands NVRTC: cuda.pathfinder's
    find_nvidia_header_directory("cudart") finds this wheel folder first for CUDA 12."""
    for folder in _wheel_dirs("cuda_runtime"):
        if (folder / "include" / "cuda_fp16.h").is_file():
            return folder / "include"
    raise FileNotFoundError("no cuda_fp16.h: the nvidia-cuda-runtime-cu12 wheel (the test extra) is not "
                            "installed")


def cupy_options(options: tuple[str, ...], arch: int) -> tuple[str, ...]:
    """What cupy.RawModule(code=..., options=options) hands NVRTC on a device of compute
    capability `arch` (CuPy 14: cupy/_core/core.pyx assemble_cupy_compiler_options, and
    cupy/cuda/compiler.py _compile_with_cache_cuda and _compile_using_nvrtc_no_warning).

    Left out: the -I of CuPy's own headers and of its bundled CCCL (cub, thrust, libcudacxx),
    which hold no header a source without #include <cupy/...> or CCCL includes can reach, and
    the --std=c++17 CuPy adds only to options that name no standard (the backend's do)."""
    return (*options, f"-I{cuda_include_dir()}", "-ftz=true",
            f"-arch=sm_{arch}",  # a cubin, not PTX, while arch <= the newest NVRTC knows
            "--device-as-default-execution-space")


def compile_cubin(source: str, options: tuple[str, ...], name: str = "kern.cu") -> tuple[bool, str]:
    """Compile `source` with `options` (an -arch=sm_XX among them): whether it compiled, and the log."""
    lib = library()
    program = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in options]
        result = lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
        return result == SUCCESS, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
