"""The generated CUDA code compiles under NVRTC as the CUDA backend has CuPy compile it.

nvcc (test_isa_cuda.py) is not what runs on a GPU machine: cupy.RawModule hands the source to
NVRTC, which has no <cmath>, its own builtin headers and include search, and options CuPy adds
(tests/nvrtc.py). Every function of test_isa_cuda.FUNCTIONS, in one translation unit, is
compiled to a cubin for sm_80 and sm_90 per element type with the backend's options
(pto_gpu/backends/cuda.py, CudaBackend._function) plus CuPy's, and must compile with an empty
log bar ptxas' report, which must show no spills and (sin and cos aside) no stack frame; so
must attention's two products at 128-row tiles, for sm_90.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import nvrtc
import pytest
from pto_gpu.kernels.llm import flash_pv, flash_scores
from test_isa_cuda import FUNCTIONS, LOOP_STATE_SPILLS, _source

from pto_gpu.backends import cuda_abi

DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16}
ARCHS = [80, 90]
CASES = [(label, arch) for label in DTYPES for arch in ARCHS]


@pytest.fixture(scope="module")
def nvrtc_logs(tmp_path_factory):
    """NVRTC's result and log per (element type, architecture), two compiles at a time."""
    nvrtc.library_or_skip()
    folder = tmp_path_factory.mktemp("nvrtc")
    source = folder / "generated.cu"
    source.write_text(_source(np.float32))  # the text does not depend on the element type

    def compile_one(case):
        label, arch = case
        dtype = np.dtype(DTYPES[label])
        backend = cuda_abi.nvrtc_options(source.parent, dtype, "generated")
        options = (*nvrtc.cupy_options(backend, arch), "--ptxas-options=-v")
        return case, nvrtc.compile_cubin(source.read_text(), options, source.name)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(compile_one, CASES))


@pytest.mark.parametrize(("label", "arch"), CASES, ids=[f"{label}-sm_{arch}" for label, arch in CASES])
def test_nvrtc_compiles_without_warnings_spills_or_local_memory(nvrtc_logs, label, arch):
    ok, log = nvrtc_logs[label, arch]
    assert ok, (f"NVRTC {nvrtc.version()}", log)
    diagnostics = [line for line in log.splitlines() if line.strip() and not line.startswith("ptxas")]
    assert not diagnostics, log
    functions = re.findall(r"Compiling entry function '(\w+)' for 'sm_\d+'\n.*?Function properties for \1\n"
                           r".*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                           log)
    assert sorted(name for name, *_ in functions) == sorted(f"pto_{n}" for n in FUNCTIONS), log
    for name, stack, stores, loads in functions:
        assert (stores, loads) == ("0", "0") or name in LOOP_STATE_SPILLS, (name, log)
        # sin and cos keep an array for their argument reduction (as under nvcc), not a tile
        assert stack == "0" or name == "pto_unary" or name in LOOP_STATE_SPILLS, (name, log)


# The products at attention's 128-row tiles, as the demo and bench/test_gpu.py launch them.
# Unrolled whole, their inner k loops took NVRTC 12 s (with spills) and 72 s.
ATTENTION_PRODUCTS = [(flash_scores, ((8, 128, 64), (8, 128, 64), (8, 128, 128)), (0, 0, 1)),
                      (flash_pv, ((8, 128, 128), (8, 128, 64), (8, 128, 1), (8, 128, 64)), ())]


@pytest.mark.parametrize(("kernel", "shapes", "scalars"), ATTENTION_PRODUCTS,
                         ids=[kernel.name for kernel, *_ in ATTENTION_PRODUCTS])
def test_attention_products_at_128_row_tiles_compile_without_spills(kernel, shapes, scalars):
    nvrtc.library_or_skip()
    source = kernel.cuda.code_for(list(shapes), np.float32, scalars, False).source
    options = (*nvrtc.cupy_options(cuda_abi.nvrtc_options(source.parent, np.float32, kernel.name), 90),
               "--ptxas-options=-v")
    ok, log = nvrtc.compile_cubin(source.read_text(), options, source.name)
    assert ok, log
    assert re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      log) == [("0", "0", "0")], log
