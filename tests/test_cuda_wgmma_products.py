"""The generated products that take wgmma where the build does (docs/ISA.md, "wgmma in the
generated code"): a 16-bit product whose result is kept in registers as a 64 x 128, 64 x 256,
128 x 64 or 128 x 128 tile, its operands packed tiles of whole 64s of rows and columns.

Each is built two ways from one source: as sm_90a runs it (PTO_WGMMA: swizzled operands,
wgmma, the warpgroups' units) and as every other GPU does (mma.sync). On the host build both
equal numpy bit for bit (small integers: every sum exact), over bands, chunks of k, column
blocks and the tails of every dim; a descriptor moved in the text makes the first wrong and
leaves the second, so it is wgmma that ran. Through the runtime, the CUDA emulator's
emulate="gpu-code-sm90a" runs a program's kernel so, equal to the serial CPU executor. NVRTC's
sm_90a code holds the instructions with no spill and no serialized wgmma; sm_90's has none.
"""

from __future__ import annotations

import re
import shutil

import host_cuda
import ml_dtypes
import numpy as np
import pytest
from nvrtc import compile_source, cupy_options, library_or_skip
from pto_gpu.kernels import llm, tiles

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.backends import cuda_abi
from pto_gpu.isa.family import family, family_of

DTYPES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def band_family(band: int):
    """The matmul family declared with bands of `band` rows (tests/test_kernels.py's BAND_FORMS:
    a 128-row band is bench/test_gpu.py's)."""
    declared = family(worker=pto.CUBE, split="m", tensor_band=band, shapes=("m k", "k n", "m n"),
                      name="matmul")
    return family_of(declared(family_of(tiles.matmul).build))


def small_integers(shape, dtype, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-3, 4, shape).astype(dtype)


# (kernel, m, k, n): bands with a partial last one, chunks of k with a tail within a step of 16
# (k 200: the last chunk's 8) and one of a whole step (k 208), column blocks with a tail.
SIZES = [("matmul", 64, 256, 128), ("matmul", 200, 200, 300), ("matmul_acc", 130, 208, 128),
         ("matmul_acc", 64, 72 + 128, 256)]


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.name)
@pytest.mark.parametrize("name, m, k, n", SIZES, ids=["x".join(map(str, size)) for size in SIZES])
def test_the_family_products_on_wgmma_equal_numpy_and_mma_sync(name, m, k, n, dtype, tmp_path):
    kernel = getattr(tiles, name)
    a, b = small_integers((m, k), dtype, 1), small_integers((k, n), dtype, 2)
    start = small_integers((m, n), dtype, 3) if name == "matmul_acc" else np.zeros((m, n), dtype)
    want = a.astype(np.float64) @ b.astype(np.float64) + start
    code = family_of(kernel).cuda(((m, k), (k, n), (m, n)), dtype, ())
    assert "pto_wgmma<64, true>(pto_d" in code.source.read_text()
    for wgmma in (True, False):
        got = start.copy()
        host_cuda.call(host_cuda.build(code, dtype, tmp_path, wgmma), name, code, [a, b, got], ())
        assert np.array_equal(got.astype(np.float64), want.astype(dtype).astype(np.float64)), wgmma


@needs_gxx
@pytest.mark.parametrize("band, n, instruction_n", [(128, 128, 128), (128, 64, 64), (64, 256, 128)])
def test_wider_results_split_over_the_warpgroups(band, n, instruction_n, tmp_path, monkeypatch):
    """Results of 64 floats a lane (the family's allowed twice its own): a 128-row band by rows
    (each warpgroup 64 rows, m64nNk16 with N the band's columns), a 64 x 256 one by columns
    (each warpgroup 128 of them). The result's units lie as the instruction's accumulators in
    every instruction touching them."""
    monkeypatch.setattr(tiles, "BAND_RESULT_FLOATS", 2 * tiles.BAND_RESULT_FLOATS)
    dtype = DTYPES[0]
    m, k = band + 40, 3 * 64 + 16
    a, b = small_integers((m, k), dtype, 4), small_integers((k, n), dtype, 5)
    code = band_family(band).cuda(((m, k), (k, n), (m, n)), dtype, ())
    assert f"pto_wgmma<{instruction_n}, true>(pto_d" in code.source.read_text()
    got = np.zeros((m, n), dtype)
    host_cuda.call(host_cuda.build(code, dtype, tmp_path, wgmma=True), "matmul", code, [a, b, got], ())
    assert np.array_equal(got.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64))


@needs_gxx
def test_a_moved_descriptor_changes_the_sm_90a_build_only(tmp_path):
    """So the tests above run wgmma: the same source with a's descriptors 32 bytes on (the next
    step of k) is wrong as sm_90a runs it, and still right as other GPUs run it."""
    dtype, (m, k, n) = DTYPES[0], (64, 256, 128)
    a, b = small_integers((m, k), dtype, 6), small_integers((k, n), dtype, 7)
    want = a.astype(np.float64) @ b.astype(np.float64)
    code = family_of(tiles.matmul).cuda(((m, k), (k, n), (m, n)), dtype, ())
    text = code.source.read_text()
    assert text.count("(pto_d, pto_da, pto_db, true)") == 2  # the first chunk's product, the loop's
    moved = tmp_path / "moved.cu"
    moved.write_text(text.replace("(pto_d, pto_da, pto_db, true)", "(pto_d, pto_da + 2, pto_db, true)"))
    for wgmma in (True, False):
        got = np.zeros((m, n), dtype)
        library = host_cuda.compile_source(moved, dtype, tmp_path / f"moved-{wgmma}.so", wgmma)
        host_cuda.call(library, "matmul", code, [a, b, got], ())
        assert np.array_equal(got, want) != wgmma


def test_products_that_do_not_fit_keep_mma_sync():
    """wgmma needs the operands' rows and columns in whole 64s and a result of a fitting shape
    in registers: a product whose k is one chunk of 100, a 32-row band, and attention's kernels
    (results in whole rows) are generated as before, with no wgmma text."""
    dtype = DTYPES[0]
    for kernel, shapes, scalars in [
            (tiles.matmul, ((64, 100), (100, 128), (64, 128)), ()),
            (tiles.matmul, ((32, 256), (256, 128), (32, 128)), ()),
            (llm.flash_attention_tile, ((2, 64, 128), (2, 256, 128), (2, 256, 128), (2, 64, 128)), (0, 1))]:
        text = family_of(kernel).cuda(shapes, dtype, scalars).source.read_text()
        assert "PTO_WGMMA_CUH" not in text and "pto_mma(" in text, (kernel.name, shapes)


@needs_gxx
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: dtype.name)
def test_a_programs_product_runs_on_the_emulator_as_an_h100_would(dtype):
    """A kernel compiled from a program (a 64-row band of a @ b over chunks of 64 of k, the last
    of 8) through the stream executor, and a captured graph of it replayed, on
    backend="cuda-emulated" with emulate="gpu-code-sm90a": the serial CPU executor's result,
    bit for bit."""
    module = isa.Module("band")
    f = isa.FunctionBuilder("band", module=module).in_core()
    kind = pto.FLOAT16 if dtype == np.float16 else pto.BFLOAT16
    f.memref("a", kind, (64, 200)).memref("b", kind, (200, 128)).memref("c", kind, (64, 128))
    f.tile("ta", 64, 64, kind).tile("tb", 64, 128, kind).tile("tc", 64, 128, kind)
    f.load("ta", "a").load("tb", "b").matmul("tc", "ta", "tb")
    f.for_loop("k", 64, 200, 64)
    f.load("ta", "a", 0, "k").load("tb", "b", "k", 0).matmul_acc("tc", "ta", "tb")
    f.end_for().store("c", "tc").build()
    band = isa.compile(module).kernels["band"]
    m, k, n = 64, 200, 128  # k's last chunk 8: its step zeroed past them
    assert "pto_wgmma<64, true>" in band.cuda.code_for([(m, k), (k, n), (m, n)], dtype, ()).source.read_text()
    a, b = small_integers((m, k), dtype, 8), small_integers((k, n), dtype, 9)

    def run(o, a, b, c):
        o.submit(band, pto.input(o.external(a)), pto.input(o.external(b)), pto.output(o.external(c)))

    want = np.zeros((m, n), dtype)
    pto.Runtime(backend="cpu", executor="serial").run(run, a, b, want)
    got = np.zeros((m, n), dtype)
    rt = pto.Runtime(backend="cuda-emulated", emulate="gpu-code-sm90a", executor="stream")
    rt.run(run, a, b, got)
    assert np.array_equal(got, want) and np.any(want != 0)
    got[:] = 0
    rt.capture(run, a, b, got).replay()  # a captured graph's launches: the same code
    assert np.array_equal(got, want)


# The benchmark's GEMM tile, and the LLaMA MLP's accumulating product over column blocks (once
# serialized and spilling at sm_90a: its tail's zeroing unrolled in 64-bit indices).
PTXAS_CASES = [("matmul", ((1024, 8192), (8192, 128), (1024, 128))),
               ("matmul_acc", ((1024, 8192), (8192, 128), (1024, 128))),
               ("matmul_acc", ((128, 4096), (4096, 11008), (128, 11008)))]


@pytest.mark.parametrize("name, shapes", PTXAS_CASES, ids=["matmul", "matmul_acc", "matmul_acc-mlp"])
def test_the_sm_90a_code_holds_wgmma_unserialized_and_sm_90s_none(name, shapes):
    library_or_skip()
    dtype = DTYPES[0]
    code = family_of(getattr(tiles, name)).cuda(shapes, dtype, ())
    options = cuda_abi.nvrtc_options(code.source.parent, dtype, name)
    text = code.source.read_text()
    ok, log, ptx = compile_source(text, cupy_options(options, "90a", ptx=True), code.source.name)
    assert ok, log
    ptx = ptx.decode(errors="replace")
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in ptx and "fence.proxy.async" in ptx
    assert "mma.sync" not in ptx
    ok, log, _ = compile_source(text, (*cupy_options(options, "90a"), "--ptxas-options=-v"), code.source.name)
    assert ok, log
    assert re.search(r"\b0 bytes spill stores", log) and "C7515" not in log, log  # C7515: serialized
    ok, log, ptx = compile_source(text, cupy_options(options, "90", ptx=True), code.source.name)
    assert ok and "wgmma" not in ptx.decode(errors="replace") and b"mma.sync" in ptx, log
