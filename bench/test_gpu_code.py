"""Cold compiles of the CUDA instances the GPU benchmarks launch (bench/test_gpu.py): NVRTC, as
CuPy's RawModule runs it, to an sm_90 cubin, on this machine, no GPU needed. Target (issue
41): at most 2 s an instance cold (a warm one is CuPy's disk cache, or the emulator's)."""

import numpy as np
import pytest
from pto_gpu.kernels import llm, tiles

from pto_gpu.backends import cuda_abi
from pto_gpu.isa import nvrtc
from pto_gpu.isa.family import family_of

INSTANCES = {
    "matmul-1024x8192x128": (tiles.matmul, ((1024, 8192), (8192, 128), (1024, 128)), ()),
    "flash_scores-128-d128": (llm.flash_scores, ((32, 128, 128), (32, 128, 128), (32, 128, 128)), (0, 0, 1)),
    "flash_pv-128-d128": (llm.flash_pv, ((32, 128, 128), (32, 128, 128), (32, 128, 1), (32, 128, 128)), ()),
    "flash_pv-128-d64": (llm.flash_pv, ((32, 128, 128), (32, 128, 64), (32, 128, 1), (32, 128, 64)), ()),
}


@pytest.fixture(autouse=True)
def needs_nvrtc():
    try:
        nvrtc.library()
    except OSError as error:
        pytest.skip(str(error))


@pytest.mark.benchmark(group="cuda-cold-compile")
@pytest.mark.parametrize("dtype, tf32", [(np.float16, False), (np.float32, False), (np.float32, True)],
                         ids=["float16", "float32", "float32-tf32"])
@pytest.mark.parametrize("name", INSTANCES)
def test_cold_compile(benchmark, name, dtype, tf32):
    kernel, shapes, scalars = INSTANCES[name]
    code = family_of(kernel).cuda(shapes, np.dtype(dtype), scalars, tf32=tf32)
    options = nvrtc.cupy_options(cuda_abi.nvrtc_options(code.source.parent, np.dtype(dtype), kernel.name), 90)
    source = code.source.read_text()
    ok, log, cubin = benchmark.pedantic(nvrtc.compile_source, (source, options, code.source.name), rounds=3)
    assert ok and cubin, log
