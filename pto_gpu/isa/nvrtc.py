"""NVRTC through ctypes: the generated CUDA C compiled as CuPy's RawModule compiles it, to PTX or
to a cubin, on any machine (no GPU, no CuPy).

Owns finding libnvrtc and the CUDA headers in the NVIDIA wheels (nvidia-cuda-nvrtc-cu12 and
nvidia-cuda-runtime-cu12: the test extra's, and CuPy's `[ctk]` extra's), the options CuPy adds to
a RawModule's own, and one compile, returning NVRTC's log with the PTX or cubin.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

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
        raise OSError("no libnvrtc: the nvidia-cuda-nvrtc-cu12 wheel (the test extra, or CuPy's [ctk]) is "
                      "not installed")
    lib = ctypes.CDLL(str(found[0]))  # a CDLL call releases the GIL: compiles can run in threads
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


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
    raise FileNotFoundError("no cuda_fp16.h: the nvidia-cuda-runtime-cu12 wheel (the test extra, or CuPy's "
                            "[ctk]) is not installed")


def cupy_options(options: tuple[str, ...], arch: int | str, ptx: bool = False) -> tuple[str, ...]:
    """What cupy.RawModule(code=..., options=options) hands NVRTC on a device of compute
    capability `arch` (CuPy 14: cupy/_core/core.pyx assemble_cupy_compiler_options, and
    cupy/cuda/compiler.py _compile_with_cache_cuda and _compile_using_nvrtc_no_warning); with
    `ptx`, for the virtual architecture instead (the PTX that cubin is assembled from). An
    arch-specific target ("90a": wgmma's) is what CuPy would not pick itself.

    Left out: the -I of CuPy's own headers and of its bundled CCCL (cub, thrust, libcudacxx),
    which hold no header a source without #include <cupy/...> or CCCL includes can reach, and
    the --std=c++17 CuPy adds only to options that name no standard (the backend's do)."""
    return (*options, f"-I{cuda_include_dir()}", "-ftz=true",
            f"-arch={'compute' if ptx else 'sm'}_{arch}", "--device-as-default-execution-space")


def compile_source(source: str, options: tuple[str, ...], name: str = "kern.cu") -> tuple[bool, str, bytes]:
    """Compile `source` with `options` (an -arch among them): whether it compiled, the log, and
    the PTX (for -arch=compute_XX) or the cubin (sm_XX); empty where it did not compile."""
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
        if result != SUCCESS:
            return False, log.value.decode(errors="replace"), b""
        kind = "PTX" if any(o.startswith("-arch=compute_") for o in options) else "CUBIN"
        _check(getattr(lib, f"nvrtcGet{kind}Size")(program, ctypes.byref(size)), f"nvrtcGet{kind}Size")
        output = ctypes.create_string_buffer(size.value)
        _check(getattr(lib, f"nvrtcGet{kind}")(program, output), f"nvrtcGet{kind}")
        return True, log.value.decode(errors="replace"), output.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
