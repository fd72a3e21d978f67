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

# What the CUDA backend sizes instances to on an H100 or H200 (the cubins here are sm_90's).
H100 = cuda_abi.instance_shared(cuda_abi.BLOCK_SHARED["sm_90"])


def band_code(shapes, dtype, band: int = tiles.TENSOR_BAND, chunk_k: int = tiles.TENSOR_CHUNK_K,
              result_floats: int = tiles.BAND_RESULT_FLOATS, tf32: bool = False) -> pto.CudaCode:
    """The matmul family's CUDA code for `shapes`, on tensor cores in bands of `band` rows, with
    chunks of k of at most `chunk_k` (tiles.TENSOR_CHUNK_K: which sets how many buffers the
    chunks ahead take) and a band's result in registers of at most `result_floats` a lane
    (tiles.BAND_RESULT_FLOATS: which sets its columns a block): the family's own instance where
    all three are the family's, else its builder declared again with tensor_band=band and made
    with the module's constants set to the others."""
    if (band, chunk_k, result_floats) == (tiles.TENSOR_BAND, tiles.TENSOR_CHUNK_K, tiles.BAND_RESULT_FLOATS):
        return family_of(tiles.matmul).cuda(shapes, np.dtype(dtype), (), tf32=tf32, block_shared=H100)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiles, "TENSOR_CHUNK_K", chunk_k)
        patch.setattr(tiles, "BAND_RESULT_FLOATS", result_floats)
        declared = family(worker=pto.CUBE, split="m", tensor_band=band, shapes=("m k", "k n", "m n"),
                          name="matmul")
        instances = family_of(declared(family_of(tiles.matmul).build))
        return instances.cuda(shapes, np.dtype(dtype), (), tf32=tf32, block_shared=H100)


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
    code = family_of(kernel).cuda(shapes, np.dtype(dtype), scalars, tf32=tf32, block_shared=H100)
    options = nvrtc.cupy_options(cuda_abi.nvrtc_options(code.source.parent, np.dtype(dtype), kernel.name), 90)
    source = code.source.read_text()
    ok, log, cubin = benchmark.pedantic(nvrtc.compile_source, (source, options, code.source.name), rounds=3)
    assert ok and cubin, log


# The generated GEMM tile's forms bench/test_gpu.py -k generated_tiles measures (band_code's rows
# a band, widest chunk of k, a band's result floats a lane): the family's, a 32-row band, chunks
# of 96 and 48 (2 and 4 buffers at 64 rows, to the family's 3), a 128 x 128 band (a block an SM;
# chunks of 64 and of 32, each in 4 buffers on an H100).
BAND_FORMS = {"band64": (tiles.TENSOR_BAND, tiles.TENSOR_CHUNK_K, tiles.BAND_RESULT_FLOATS),
              "band32": (SPLIT_ROWS, tiles.TENSOR_CHUNK_K, tiles.BAND_RESULT_FLOATS),
              "band64-chunk96": (tiles.TENSOR_BAND, 96, tiles.BAND_RESULT_FLOATS),
              "band64-chunk48": (tiles.TENSOR_BAND, 48, tiles.BAND_RESULT_FLOATS),
              "band128": (128, tiles.TENSOR_CHUNK_K, 2 * tiles.BAND_RESULT_FLOATS),
              "band128-chunk32": (128, 32, 2 * tiles.BAND_RESULT_FLOATS)}
GEMM_TILE = INSTANCES["matmul-1024x8192x128"][1]
MLP_SHAPES = ((128, 4096), (4096, 11008), (128, 11008))


def _family_code(kernel, shapes, scalars=()):
    return lambda dtype, tf32: family_of(kernel).cuda(shapes, np.dtype(dtype), scalars, tf32=tf32,
                                                      block_shared=H100)


def _band_code(form: str):
    return lambda dtype, tf32: band_code(GEMM_TILE, dtype, *BAND_FORMS[form], tf32=tf32)


REPORTED = {**{name: _family_code(*instance) for name, instance in INSTANCES.items()},
            **{f"matmul-1024x8192x128-{form}": _band_code(form)
               for form in ("band32", "band128", "band128-chunk32")},
            "matmul_acc-128x4096x11008": _family_code(tiles.matmul_acc, MLP_SHAPES)}


@pytest.mark.benchmark(group="cuda-ptxas")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
@pytest.mark.parametrize("dtype, tf32", [(np.float16, False), (np.float32, True)],
                         ids=["float16", "float32-tf32"])
@pytest.mark.parametrize("name", REPORTED)
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])  # sm_90a: an H100's build, wgmma where laid out for it
def test_ptxas_report(benchmark, name, dtype, tf32, arch, tmp_path):
    code = REPORTED[name](dtype, tf32)
    source = code.source
    if arch == "sm_90a" and "PTO_WGMMA_CUH" not in source.read_text():
        pytest.skip("no product laid out for wgmma: the sm_90 build's code")
    target = ["-arch=sm_90"] if arch == "sm_90" else ["-gencode", "arch=compute_90a,code=sm_90a"]
    command = ["nvcc", "-cubin", *target, "-std=c++17", "-Xptxas", "-v",
               *cuda_abi.COMPILE_OPTIONS[np.dtype(dtype)], str(source), "-o", str(tmp_path / "k.cubin")]
    done = benchmark.pedantic(subprocess.run, (command,), dict(capture_output=True, text=True), rounds=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"\b0 bytes spill stores", done.stderr), done.stderr  # not "20 bytes"
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    benchmark.extra_info.update(registers=registers, shared_bytes=code.shared_bytes)
