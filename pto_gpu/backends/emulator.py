"""The CUDA driver emulator (cuda_emulator.c): the driver functions the stream executor calls,
with the real driver's C signatures, run by host threads, for backend="cuda-emulated".

This module owns building and loading that library (compiled once per source text into a cache
folder, under the text's hash; its driver functions are typed by driver.Driver, as libcuda's
are) and the emulator's own functions: making kernels of host functions, and fault injection.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from .. import generated
from ..errors import PTOError
from .driver import Driver

SOURCE = Path(__file__).with_name("cuda_emulator.c")
COMPILE = ("cc", "-std=c11", "-O2", "-fPIC", "-shared", "-pthread")

_int, _uint = ctypes.c_int, ctypes.c_uint

# A kernel's entry, as the emulator calls it on a stream's thread: (grid[3], block[3], shared
# bytes, params: pointers to the emulator's copies of the argument values, the function's
# context) -> 0, or non-zero for a kernel that faulted.
ENTRY = ctypes.CFUNCTYPE(_int, ctypes.POINTER(_uint), ctypes.POINTER(_uint), _uint,
                         ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def cache_dir() -> Path:
    """Where built emulators and the host builds of kernels live: beside the generated sources."""
    return generated.cache_dir() / "emulator"


def build(source: str, folder: Path, name: str = "cuda_emulator",
          user: str = 'backend="cuda-emulated"', what: str = "its CUDA driver emulator") -> Path:
    """The shared library of C source text `source` (the emulator's, unless `name` says which)
    in `folder`, compiled unless a build of the same text (named by its hash) is there already;
    without a compiler, an error that says `user` needs one to build `what`."""
    stem = f"{name}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    path = folder / f"{stem}.so"
    if path.exists():
        return path
    if shutil.which(COMPILE[0]) is None:
        raise PTOError(f"{user} needs a C compiler (`{COMPILE[0]}`) to build {what}, and there is none "
                       "on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    # Temporary names of this process and thread, then os.replace: two processes building at
    # once never load a half-written library, and the .c stays beside it to rebuild by hand.
    partial = f"{os.getpid()}.{threading.get_ident()}.tmp"
    c_file, partial_c, partial_so = (folder / f"{stem}.c", folder / f"{stem}.c.{partial}",
                                     folder / f"{stem}.so.{partial}")
    partial_c.write_text(source)
    os.replace(partial_c, c_file)
    command = [*COMPILE, str(c_file), "-o", str(partial_so)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        partial_so.unlink(missing_ok=True)
        raise PTOError(f"building {name} failed: {' '.join(command)}\n{result.stderr}")
    os.replace(partial_so, path)
    return path


_loading = threading.Lock()
_library: ctypes.CDLL | None = None
_driver: Driver | None = None


def library() -> ctypes.CDLL:
    """The emulator, built once per source text and loaded once per process."""
    global _library
    with _loading:
        if _library is None:
            loaded = ctypes.CDLL(str(build(SOURCE.read_text(), cache_dir())))
            _declare(loaded)
            _library = loaded
        return _library


def _declare(cdll: ctypes.CDLL) -> None:
    """The emulator's own functions' prototypes (the driver's are driver.Driver's)."""
    cdll.pto_emu_function.restype = _int
    cdll.pto_emu_function.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
                                      _int, ctypes.POINTER(ctypes.c_ulonglong))
    for name in ("pto_emu_fail_launch", "pto_emu_fault_kernel", "pto_emu_lose_event"):
        getattr(cdll, name).restype = None
        getattr(cdll, name).argtypes = (ctypes.c_longlong,)
    cdll.pto_emu_reset.restype = None
    cdll.pto_emu_reset.argtypes = ()
    cdll.pto_emu_launches.restype = ctypes.c_longlong
    cdll.pto_emu_launches.argtypes = ()
    cdll.pto_emu_event_wait.restype = _int
    cdll.pto_emu_event_wait.argtypes = (ctypes.c_void_p, ctypes.c_longlong)


def driver() -> Driver:
    """The emulator's driver functions, typed, initialised (cuInit)."""
    global _driver
    cdll = library()
    with _loading:
        if _driver is None:
            _driver = Driver(cdll, "the CUDA emulator")
            _driver.call("cuInit", 0)
        return _driver


def check(result: int, call: str) -> None:
    """PTOError("<call> failed: CUDA_ERROR_... (code)") for a non-zero result of the emulator."""
    driver().check(result, call)


def function(entry: ctypes._CFuncPtr | int, sizes: Sequence[int], context: int = 0) -> int:
    """A CUfunction of `entry` (an ENTRY, or the address of a C function of its signature),
    called with `context`, whose parameter i is sizes[i] bytes. The caller keeps both alive
    while launches of it may run. The emulator is initialised first (cuInit): like the driver,
    it refuses a function before."""
    address = entry if isinstance(entry, int) else ctypes.cast(entry, ctypes.c_void_p).value
    handle = ctypes.c_void_p()
    driver()
    check(library().pto_emu_function(ctypes.byref(handle), address, context or None, len(sizes),
                                     (ctypes.c_ulonglong * len(sizes))(*sizes)), "pto_emu_function")
    return handle.value


def fail_launch(n: int) -> None:
    """The n-th cuLaunchKernel from now (n >= 1; 0 disarms) returns CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    and enqueues nothing."""
    library().pto_emu_fail_launch(n)


def fault_kernel(n: int) -> None:
    """The kernel of the n-th cuLaunchKernel from now faults instead of running: the sticky
    CUDA_ERROR_ILLEGAL_ADDRESS."""
    library().pto_emu_fault_kernel(n)


def lose_event(n: int) -> None:
    """The n-th cuEventRecord from now is never reached: its stream stalls there until `reset`."""
    library().pto_emu_lose_event(n)


def reset() -> None:
    """A fresh context: the sticky error cleared, faults disarmed, queued work dropped unrun."""
    library().pto_emu_reset()


def launches() -> int:
    """Kernels the emulator has run in this process."""
    return library().pto_emu_launches()
