"""The CUDA kernel sources: they compile with nvcc for sm_90, and, built for the host, compute
what each kernel's CPU implementation computes.

The host build is possible because every kernel in kernels/cuda is a grid-stride loop without
thread synchronisation (pto.cuh): compiled by g++, one call walks every work item. It checks
the sources' arithmetic and indexing, and the argument convention of backends/cuda_abi.py,
on machines without a GPU; tests/test_cuda.py runs the same sources on a GPU.
"""

import ctypes
import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from kernel_samples import KERNELS, SCALARS, arrays, shapes
from pto_gpu.kernels import CUDA_SOURCES, llm

from pto_gpu.backends import cuda_abi

SOURCES = sorted(CUDA_SOURCES.glob("*.cu"))
TOLERANCE = {np.float32: dict(rtol=2e-6, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}


def test_every_kernel_has_a_cuda_implementation():
    assert len(KERNELS) == 27 and all(k.cuda is not None for k in KERNELS)
    assert {k.cuda.source for k in KERNELS} == set(SOURCES)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
def test_every_source_compiles_with_nvcc_for_sm_90(tmp_path):
    jobs = [(source, options) for source in SOURCES for options in cuda_abi.COMPILE_OPTIONS.values()]

    def compile_one(job):
        source, options = job
        out = tmp_path / f"{source.stem}{len(options)}{options[0][-6:]}.o"
        done = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Werror", "all-warnings", *options, "-c",
                               str(source), "-o", str(out)], capture_output=True, text=True)
        return source.name, options, done.returncode, done.stderr

    with ThreadPoolExecutor(2) as pool:
        failures = [(name, options, err) for name, options, rc, err in pool.map(compile_one, jobs) if rc]
    assert not failures, failures


@pytest.fixture(scope="module", params=[np.float32, np.float64], ids=["float32", "float64"])
def host_build(request, tmp_path_factory):
    """Every source compiled by g++ for the host, as one shared library per element type."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    dtype = np.dtype(request.param)
    folder = tmp_path_factory.mktemp(f"host-{dtype}")
    options = cuda_abi.COMPILE_OPTIONS[dtype]
    objects = []
    for source in SOURCES:
        obj = folder / f"{source.stem}.o"
        subprocess.run(["g++", "-x", "c++", "-std=c++17", "-O1", "-fPIC", "-Wall", "-Werror", *options, "-c",
                        str(source), "-o", str(obj)], check=True)
        objects.append(str(obj))
    library = folder / "kernels.so"
    subprocess.run(["g++", "-shared", "-o", str(library), *objects], check=True)
    return dtype, ctypes.CDLL(str(library))


def host_call(library, kernel, arrays, scalars):
    args = []
    for array in arrays:
        args.append(ctypes.c_void_p(array.ctypes.data))
        args += [ctypes.c_longlong(int(w)) for w in cuda_abi.tensor_words(array.shape, array.strides,
                                                                           array.itemsize)]
    for value in scalars:
        word = cuda_abi.scalar_word(value)
        is_int = isinstance(word, np.int64)
        args.append(ctypes.c_longlong(int(word)) if is_int else ctypes.c_double(float(word)))
    getattr(library, cuda_abi.symbol(kernel.name))(*args)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_host_build_matches_the_cpu_kernel(host_build, kernel):
    dtype, library = host_build
    cpu_arrays, cuda_arrays = arrays(kernel, dtype), arrays(kernel, dtype)
    scalars = SCALARS.get(kernel.name, ())
    kernel.cpu(*cpu_arrays, *scalars)
    host_call(library, kernel, cuda_arrays, scalars)
    assert kernel.cuda.items(shapes(kernel)) <= max(math.prod(s) for s in shapes(kernel))
    for cpu, gpu in zip(cpu_arrays, cuda_arrays):
        np.testing.assert_allclose(gpu, cpu, **TOLERANCE[dtype.type])


def test_scores_are_masked_after_each_query(host_build):
    dtype, library = host_build
    q, k = (np.ones((1, 4, 2), dtype) for _ in range(2))
    scores = np.zeros((1, 4, 4), dtype)
    host_call(library, llm.flash_scores, [q, k, scores], (0, 0, True))
    assert np.array_equal(np.isinf(scores[0]), np.triu(np.ones((4, 4), bool), k=1))
