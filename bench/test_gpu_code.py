"""Cold compiles of the CUDA instances the GPU benchmarks launch (bench/test_gpu.py): NVRTC, as
CuPy's RawModule runs it, to an sm_90 cubin, on this machine, no GPU needed. Target (issue
41): at most 2 s an instance cold (a warm one is CuPy's disk cache, or the emulator's).

Where nvcc is installed, ptxas's report of the float16 ones and of their float32 ones as TF32
(the matmul in both band heights bench/test_gpu.py compares, and the LLaMA-7B MLP's matmul_acc
in column blocks): extra_info["registers"] a thread and ["shared_bytes"], the dynamic shared
memory a launch gives a block (CudaCode.shared_bytes: ptxas counts only static shared memory);
no spills asserted."""

import re
import shutil
import subprocess

import numpy as np
import pytest
from pto_gpu.kernels import llm, tiles

import pto_gpu as pto
from pto_gpu.backends import cuda_abi
from pto_gpu.isa import nvrtc
from pto_gpu.isa.family import SPLIT_ROWS, family, family_of


def matmul_in_bands(band: int, fresh: bool = False):
    """The matmul family, or, for a band of other than its TENSOR_BAND rows on tensor cores (or
    `fresh`: instances made anew, not those made before), its builder declared again with
    tensor_band=band."""
    if band == tiles.TENSOR_BAND and not fresh:
        return family_of(tiles.matmul)
    return family_of(family(worker=pto.CUBE, split="m", tensor_band=band, shapes=("m k", "k n", "m n"),
                            name="matmul")(family_of(tiles.matmul).build))

INSTANCES = {
    "matmul-1024x8192x128": (tiles.matmul, ((1024, 8192), (8192, 128), (1024, 128)), ()),
    "flash_scores-128-d128": (llm.flash_scores, ((32, 128, 128), (32, 128, 128), (32, 128, 128)), (0, 0, 1)),
    "flash_pv-128-d128": (llm.flash_pv, ((32, 128, 128), (32, 128, 128), (32, 128, 1), (32, 128, 128)), ()),
    "flash_pv-128-d64": (llm.flash_pv, ((32, 128, 128), (32, 128, 64), (32, 128, 1), (32, 128, 64)), ()),
    "flash_attention_tile-64-d128": (llm.flash_attention_tile, ((32, 64, 128), (32, 4096, 128),
                                                                (32, 4096, 128), (32, 64, 128)), (0, 1)),
    "flash_attention_tile-64-d64": (llm.flash_attention_tile, ((32, 64, 64), (32, 4096, 64), (32, 4096, 64),
                                                               (32, 64, 64)), (0, 1)),
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


MLP_SHAPES = ((128, 4096), (4096, 11008), (128, 11008))
REPORTED = {**{name: (family_of(kernel), shapes, scalars)
               for name, (kernel, shapes, scalars) in INSTANCES.items()},
            "matmul-1024x8192x128-band32": (matmul_in_bands(SPLIT_ROWS), INSTANCES["matmul-1024x8192x128"][1],
                                            ()),
            "matmul_acc-128x4096x11008": (family_of(tiles.matmul_acc), MLP_SHAPES, ())}


@pytest.mark.benchmark(group="cuda-ptxas")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
@pytest.mark.parametrize("dtype, tf32", [(np.float16, False), (np.float32, True)],
                         ids=["float16", "float32-tf32"])
@pytest.mark.parametrize("name", REPORTED)
def test_ptxas_report(benchmark, name, dtype, tf32, tmp_path):
    instances, shapes, scalars = REPORTED[name]
    code = instances.cuda(shapes, np.dtype(dtype), scalars, tf32=tf32)
    source = code.source
    command = ["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v",
               *cuda_abi.COMPILE_OPTIONS[np.dtype(dtype)], str(source), "-o", str(tmp_path / "k.cubin")]
    done = benchmark.pedantic(subprocess.run, (command,), dict(capture_output=True, text=True), rounds=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\b0 bytes spill stores", done.stderr), done.stderr  # not "20 bytes"
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    benchmark.extra_info.update(registers=registers, shared_bytes=code.shared_bytes)
