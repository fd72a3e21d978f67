"""The kernel library (pto_gpu.kernels): every kernel, generated from its one PTO program,
against float64 numpy written independently (kernel_references.py).

  - CPU: the generated numba code, on strided views, float32, float64 and float16, at the
    sample sizes and at sizes where every dim differs (another instance of the family);
  - CUDA: the instance's generated source, built for the host by g++ (pto_isa.cuh runs each
    block's threads as threads) and called through the backend's argument convention, float32
    and float64; compiled by nvcc for sm_90 with warnings as errors;
  - the attention kernels' leading dim is a batch: each head is the 2-d kernel's result.

Tolerances: float64 to 1e-12 (a few roundings of values of order 1 over sums of up to 8
terms); float32 to 2e-5 relative / 2e-6 absolute: each element passes through at most a
reduction of 8 terms and a few transcendental functions, each within a few ulps (6e-8), and
rope's angles of order 10 lose ~1e-6; float16 to 4e-3 (ulp 1e-3 at 1-2, one rounding per
stored result, computed in float32); bfloat16 (CUDA only) to 2e-2 (8 bits of mantissa: a
rounding is 2^-9 relative; 4e-3 scaled the same way).
"""

import re
import shutil
import subprocess

import host_cuda
import ml_dtypes
import numpy as np
import pytest
from kernel_references import REFERENCES, tf32_rounded
from kernel_samples import KERNELS, SCALARS, SIZES, arrays, shapes, strided
from pto_gpu.kernels import llm, tiles
from pto_gpu.kernels.elementwise import scale
from pto_gpu.kernels.tiles import TENSOR_BAND

import pto_gpu as pto
from pto_gpu.backends import cuda_abi
from pto_gpu.backends.cuda_abi import THREADS_PER_BLOCK
from pto_gpu.dtypes import as_dtype
from pto_gpu.isa import ISAError
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_codegen import SHARED_LIMIT
from pto_gpu.isa.family import SPLIT_ROWS, family, family_of, first_fitting

BFLOAT16 = ml_dtypes.bfloat16
TOLERANCE = {np.float16: dict(rtol=4e-3, atol=4e-3), np.float32: dict(rtol=2e-5, atol=2e-6),
             np.float64: dict(rtol=1e-12, atol=1e-12), BFLOAT16: dict(rtol=2e-2, atol=2e-2)}
OTHER_SIZES = {"m": 7, "n": 12, "k": 9, "h": 3, "d": 6, "p": 2, "b": 3}  # rope: 12 = 2 heads of 6


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _expected(kernel, inputs, scalars):
    expected = [a.astype(np.float64) for a in inputs]
    REFERENCES[kernel.name](*expected, *scalars)
    return expected


def _assert_matches(kernel, got, expected, dtype):
    for index, (have, want) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(have.astype(np.float64), want, err_msg=f"{kernel.name} param {index}",
                                   **TOLERANCE[dtype])


def test_every_kernel_has_a_reference_and_a_program():
    assert len(KERNELS) == 32
    assert {k.name for k in KERNELS} == set(REFERENCES)
    for kernel in KERNELS:
        text = family_of(kernel).source(tuple(shapes(kernel)), pto.FLOAT32, _structural(kernel))
        assert f"\nfunc @{kernel.name}(" in text, text


def _structural(kernel) -> tuple:
    instances = family_of(kernel)
    return tuple(SCALARS[kernel.name][i] for i in instances.structural)


@pytest.mark.parametrize("sizes", [SIZES, OTHER_SIZES], ids=["sample", "other"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_generated_cpu_code_matches_numpy(kernel, dtype, sizes):
    inputs = arrays(kernel, dtype, sizes)
    scalars = SCALARS.get(kernel.name, ())
    expected = _expected(kernel, inputs, scalars)
    family_of(kernel).generated_cpu(*inputs, *scalars)
    _assert_matches(kernel, inputs, expected, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float16], ids=["blas", "numpy"])  # BLAS takes no float16
@pytest.mark.parametrize("kernel", [k for k in KERNELS if family_of(k).library_cpu], ids=lambda k: k.name)
def test_a_cpu_library_matches_the_generated_code(kernel, dtype):
    generated = arrays(kernel, dtype, OTHER_SIZES)
    library = [a.copy() for a in generated]
    family_of(kernel).generated_cpu(*generated)
    kernel.cpu(*library)
    _assert_matches(kernel, library, [a.astype(np.float64) for a in generated], dtype)


@pytest.mark.parametrize("call, message", [
    (lambda: llm.flash_scores.cpu(np.ones((2, 5, 4)), np.ones((6, 4)), np.ones((2, 5, 6)), 0, 0, 0),
     r"flash_scores: tensor param 1 must be 3-d \(h n d\), got shape \(6, 4\)"),
    (lambda: llm.flash_scores.cpu(np.ones((3, 5, 4)), np.ones((2, 6, 4)), np.ones((3, 5, 6)), 0, 0, 0),
     r"flash_scores: the leading \(batch\) dims of the 3-d params differ: \[2, 3\]"),
    (lambda: scale.cpu(np.ones((0, 4)), np.ones((0, 4)), 2.0),
     r"scale: m = 0 in shapes .*: a kernel family's tiles are never empty"),
])
def test_calls_a_family_cannot_serve_are_refused_by_name(call, message):
    with pytest.raises(pto.ParamError, match=message):
        call()


def test_an_empty_batch_runs_nothing():
    scores = np.full((0, 5, 6), np.nan)
    llm.flash_scores.cpu(np.ones((0, 5, 4)), np.ones((0, 6, 4)), scores, 0, 0, 0)
    assert family_of(llm.flash_scores).cuda(((0, 5, 4), (0, 6, 4), (0, 5, 6)), np.float32, (0, 0, 0)).items(
        [(0, 5, 4), (0, 6, 4), (0, 5, 6)]) == 0


def test_a_builder_must_declare_params_as_the_family_says():
    from pto_gpu.isa.family import family

    @family(worker=pto.VECTOR, shapes=("m n", "m n"), scalars=("alpha", "beta"))
    def swapped(f, dtype, m, n):
        f.memref("a", dtype, (m, n)).memref("out", dtype, (m, n)).scalar("beta", pto.FLOAT64)
        f.scalar("alpha", pto.FLOAT64).tile("t", m, n, dtype).load("t", "a").muls("t", "t", "alpha")
        f.adds("t", "t", "beta").store("out", "t")

    message = (r"swapped: the builder declares memrefs \(a, out\) and scalars \(beta, alpha\), but .* "
               r"scalars=\('alpha', 'beta'\), in that order")
    with pytest.raises(pto.ParamError, match=message):
        swapped.cpu(np.ones((2, 2)), np.ones((2, 2)), 1.0, 2.0)

    @family(worker=pto.VECTOR, shapes=("h m n", "m n"))
    def writes_shared(f, dtype, m, n):
        f.memref("a", dtype, (m, n)).memref("total", dtype, (m, n)).tile("t", m, n, dtype)
        f.load("t", "a").store("total", "t")

    with pytest.raises(pto.ParamError, match=r"writes_shared: %total is 2-d in a batched family"):
        writes_shared.cpu(np.ones((3, 2, 2)), np.ones((2, 2)))


def test_each_head_of_a_batch_is_the_two_dimensional_kernel():
    rng = np.random.default_rng(1)
    q, k = strided((3, 5, 4), np.float64, rng), strided((3, 6, 4), np.float64, rng)
    scores = np.zeros((3, 5, 6))
    llm.flash_scores.cpu(q, k, scores, 2, 0, True)
    for head in range(3):
        alone = np.zeros((5, 6))
        family_of(llm.flash_scores).cpu(q[head][None], k[head][None], alone[None], 2, 0, True)
        np.testing.assert_array_equal(scores[head], alone)
    assert np.isinf(scores[:, 0, 3:]).all() and np.isfinite(scores[:, 0, :3]).all()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("q_start", [3, 40, 100])
def test_a_causal_score_tile_masks_only_where_a_key_comes_after_its_query(q_start, tmp_path):
    """flash_scores skips the mask where every key of the tile (k_start 1, 48 keys) comes before
    its first query (q_start 100), masks where some come after (3: most of each row; 40: a
    corner): the CPU code and the CUDA code built for the host (70 rows: bands of 32, which
    count their rows from the tile's top) equal the reference."""
    kernel = llm.flash_scores
    inputs = arrays(kernel, np.float32, {"h": 2, "m": 70, "d": 16, "n": 48})
    scalars = (q_start, 1, True)
    expected = _expected(kernel, inputs, scalars)
    assert np.isinf(expected[2]).any() == (q_start < 48)
    cpu = [a.copy() for a in inputs]
    kernel.cpu(*cpu, *scalars)
    _assert_matches(kernel, cpu, expected, np.float32)
    code, library = _host_library(kernel, np.float32, [a.shape for a in inputs], scalars, tmp_path)
    _host_call(library, kernel, code, inputs, scalars)
    _assert_matches(kernel, inputs, expected, np.float32)


def test_rope_refuses_heads_that_do_not_split_the_row():
    x = np.ones((2, 12))
    with pytest.raises(pto.ParamError, match=r"rope: a row of 12 does not split into 5 heads"):
        llm.rope.cpu(x, 0, 5)


# --- CUDA, built for the host --------------------------------------------------------------------
def _host_library(kernel, dtype, call_shapes, scalars, folder):
    code = family_of(kernel).cuda(tuple(call_shapes), np.dtype(dtype), scalars)
    return code, host_cuda.build(code, dtype, folder)


def _host_call(library, kernel, code, arrays, scalars):
    host_cuda.call(library, kernel.name, code, arrays, scalars)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16], ids=dtype_name)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_generated_cuda_code_built_for_the_host_matches_numpy(kernel, dtype, tmp_path):
    inputs = arrays(kernel, dtype)
    scalars = SCALARS.get(kernel.name, ())
    expected = _expected(kernel, inputs, scalars)
    code, library = _host_library(kernel, dtype, [a.shape for a in inputs], scalars, tmp_path)
    _host_call(library, kernel, code, inputs, scalars)
    _assert_matches(kernel, inputs, expected, dtype)


TENSOR_CORE_SIZES = [("matmul", {"m": 37, "k": 100, "n": 70}), ("matmul_acc", {"m": 128, "k": 64, "n": 128}),
                     ("matmul_panels_add", {"m": 20, "k": 48, "p": 2, "n": 40}),
                     ("flash_scores", {"h": 2, "m": 64, "d": 128, "n": 64}),
                     ("flash_scores", {"h": 1, "m": 40, "d": 72, "n": 200}),
                     ("flash_pv", {"h": 2, "m": 64, "n": 64, "d": 128}),
                     ("flash_pv", {"h": 1, "m": 50, "n": 37, "d": 72}),
                     ("flash_attention_tile", {"h": 2, "m": 64, "d": 128, "n": 200}),
                     ("flash_attention_tile", {"h": 1, "m": 50, "d": 72, "n": 130})]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=dtype_name)
@pytest.mark.parametrize("name, sizes", TENSOR_CORE_SIZES,
                         ids=[f"{n}-{'x'.join(map(str, sizes.values()))}" for n, sizes in TENSOR_CORE_SIZES])
def test_16_bit_products_on_tensor_cores_match_numpy(name, sizes, dtype, tmp_path):
    """float16 and bfloat16 products are mma.sync instructions (pto_isa.cuh's host build meets a warp's lanes
    at each one and multiplies their fragments as the PTX ISA lays them out): over several
    units of 16 rows x 32 columns per warp, several steps of k, chunks of k, column blocks and
    tails of every dim, each element is within the type's tolerance of float64 numpy (the
    products of 16-bit values are exact in float, the sums float, one rounding at the store)."""
    kernel = BY_NAME[name]
    inputs = arrays(kernel, dtype, sizes)
    scalars = SCALARS.get(kernel.name, ())
    expected = _expected(kernel, inputs, scalars)
    code, library = _host_library(kernel, dtype, [a.shape for a in inputs], scalars, tmp_path)
    assert "pto_mma(acc" in code.source.read_text()
    _host_call(library, kernel, code, inputs, scalars)
    _assert_matches(kernel, inputs, expected, dtype)


SPLIT_SIZES = [("matmul", {"m": 100, "k": 40, "n": 24}), ("matmul_acc", {"m": 70, "k": 24, "n": 40}),
               ("matmul_panels_add", {"m": 90, "k": 16, "p": 2, "n": 32}),
               ("flash_scores", {"h": 2, "m": 100, "d": 16, "n": 48}),
               ("flash_pv", {"h": 2, "m": 75, "n": 48, "d": 16})]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name, sizes", SPLIT_SIZES,
                         ids=[f"{n}-{'x'.join(map(str, sizes.values()))}" for n, sizes in SPLIT_SIZES])
def test_tall_product_tiles_are_bands_of_rows_over_blocks(name, sizes, dtype, tmp_path):
    """A product's tile of m > SPLIT_ROWS rows (the matmuls' TENSOR_BAND in float16) is the
    instance for a band's rows, launched over ceil(m / band) blocks per batch index, each a band
    of rows of a and the result
    (b whole in each); the last band partial; the causal mask counts rows from the tile's top
    (flash_scores' q_start = 3). The same as the numpy reference."""
    kernel = BY_NAME[name]
    inputs = arrays(kernel, dtype, sizes)
    scalars = SCALARS.get(kernel.name, ())
    expected = _expected(kernel, inputs, scalars)
    call_shapes = [a.shape for a in inputs]
    code, library = _host_library(kernel, dtype, call_shapes, scalars, tmp_path)
    batch = sizes.get("h", sizes.get("p", 1))
    band = family_of(kernel).band(as_dtype(dtype))
    assert band == (TENSOR_BAND if dtype == np.float16 and "matmul" in name else SPLIT_ROWS)
    assert code.items(call_shapes) == THREADS_PER_BLOCK * batch * -(-sizes["m"] // band)
    _host_call(library, kernel, code, inputs, scalars)
    _assert_matches(kernel, inputs, expected, dtype)


# Other bands, chunks of k and result widths of the matmul family, as bench/test_gpu.py's
# generated GEMM compares them on a GPU (test_gpu_code.BAND_FORMS): rows a band, the widest chunk
# of k (tiles.TENSOR_CHUNK_K: the chunks ahead's buffers), a band's result floats a lane
# (tiles.BAND_RESULT_FLOATS: the columns of a block).
_BAND, _FLOATS = tiles.TENSOR_BAND, tiles.BAND_RESULT_FLOATS
BAND_FORMS = [(128, tiles.TENSOR_CHUNK_K, 2 * _FLOATS), (128, 32, 2 * _FLOATS), (_BAND, 96, _FLOATS),
              (_BAND, 48, _FLOATS)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("band, chunk_k, result_floats", BAND_FORMS,
                         ids=[f"band{b}-chunk{c}-floats{f}" for b, c, f in BAND_FORMS])
def test_the_matmul_bands_a_gpu_benchmark_compares_match_numpy(band, chunk_k, result_floats, monkeypatch,
                                                               tmp_path):
    """The float16 matmul declared with those bands, made with those chunks and result widths:
    bands over blocks (the last partial), chunks of k with a tail, column blocks with a tail
    (a 128-row band's result is 128 x 128 in registers: four turns of a warp share b's
    fragments), the same as the numpy reference within float16's tolerance."""
    monkeypatch.setattr(tiles, "TENSOR_CHUNK_K", chunk_k)
    monkeypatch.setattr(tiles, "BAND_RESULT_FLOATS", result_floats)
    declared = family(worker=pto.CUBE, split="m", tensor_band=band, shapes=("m k", "k n", "m n"),
                      name="matmul")
    instances = family_of(declared(family_of(tiles.matmul).build))
    kernel = BY_NAME["matmul"]
    inputs = arrays(kernel, np.float16, {"m": band + 40, "k": 3 * chunk_k + 16, "n": 296})
    expected = _expected(kernel, inputs, ())
    code = instances.cuda(tuple(a.shape for a in inputs), np.dtype(np.float16), ())
    assert f"float pto_frag_t_c[{band // 32}][4][4]" in code.source.read_text()  # band x 128: band / 32 turns
    assert code.items([a.shape for a in inputs]) == THREADS_PER_BLOCK * 2
    _host_call(host_cuda.build(code, np.float16, tmp_path), kernel, code, inputs, ())
    _assert_matches(kernel, inputs, expected, np.float16)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("name", ["matmul", "matmul_acc"])
def test_a_familys_float32_product_instance_made_with_tf32_rounds_its_operands(name, tmp_path):
    """Family.cuda(..., tf32=True): the banded instance of a tall float32 product (tails of
    every dim) on tensor cores as TF32: the float64 product of TF32-rounded operands to
    float32's accumulation, not the exact one (docs/ISA.md, "TF32, on request")."""
    kernel = BY_NAME[name]
    m, k, n = 100, 40, 24
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    if name == "matmul_acc":
        c = rng.standard_normal((m, n)).astype(np.float32)
    code = family_of(kernel).cuda(((m, k), (k, n), (m, n)), np.dtype(np.float32), (), tf32=True)
    assert "pto_mma_tf32(acc" in code.source.read_text()
    out = c.copy()
    host_cuda.call(host_cuda.build(code, np.float32, tmp_path), kernel.name, code, [a, b, out], ())

    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b) + np.abs(c)
    accumulation = (k + 2) * 2.0**-24 * magnitude
    assert np.all(np.abs(out - (tf32_rounded(a) @ tf32_rounded(b) + c)) <= accumulation)
    assert np.abs(out - (a.astype(np.float64) @ b + c)).max() > 10 * accumulation.max()

@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_scalars_are_passed_as_the_kernel_declares_them(tmp_path):
    """scale's factor is a float64 parameter: an int value still arrives as a double."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.zeros_like(a)
    code, library = _host_library(scale, np.float32, [a.shape, out.shape], (3,), tmp_path)
    assert code.integer_scalars == (False,)
    _host_call(library, scale, code, [a, out], (3,))
    np.testing.assert_array_equal(out, 3 * a)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
def test_every_kernel_compiles_with_nvcc_for_sm_90(tmp_path):
    sources = [family_of(k).cuda(tuple(shapes(k)), np.dtype(np.float32), SCALARS.get(k.name, ())).source
               for k in KERNELS]
    unit = tmp_path / "library.cu"  # every source carries the header's include guard: one unit
    unit.write_text("".join(s.read_text() for s in sources))
    for options in cuda_abi.COMPILE_OPTIONS.values():
        done = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Werror", "all-warnings", *options, "-c",
                               str(unit), "-o", str(tmp_path / "library.o")], capture_output=True, text=True)
        assert done.returncode == 0, (options, done.stderr[-3000:])


CHUNKED = [("matmul", {"m": 6, "k": 100, "n": 128}), ("matmul_acc", {"m": 6, "k": 100, "n": 128}),
           ("flash_scores", {"h": 2, "m": 5, "d": 80, "n": 64}),
           ("flash_pv", {"h": 2, "m": 5, "n": 100, "d": 64}),
           ("matmul", {"m": 4, "k": 20, "n": 7000}), ("matmul_acc", {"m": 4, "k": 20, "n": 7000}),
           ("rmsnorm", {"m": 3, "n": 7000}), ("add", {"m": 3, "n": 700}), ("copy", {"m": 3, "n": 700}),
           ("zero", {"m": 3, "n": 700}), ("exp", {"m": 3, "n": 700}), ("scale", {"m": 3, "n": 700}),
           ("swiglu", {"m": 3, "n": 700}), ("row_sum", {"m": 3, "n": 700}), ("row_max", {"m": 3, "n": 700}),
           ("row_expand_div", {"m": 3, "n": 700}), ("col_sum", {"m": 50, "n": 700})]
BY_NAME = {k.name: k for k in KERNELS}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("name, sizes", CHUNKED,
                         ids=[f"{name}-{'x'.join(map(str, sizes.values()))}" for name, sizes in CHUNKED])
def test_wide_tiles_are_blocked_for_shared_memory_only_on_cuda(name, sizes, tmp_path):
    """The CUDA instance works in pieces that fit a GPU core: chunks of k whose whole-tile
    operands fit shared memory (tails included: 100 = 48 + 48 + 4), blocks of 256 columns (a
    lane holds its columns of a tile row in registers; a matmul's b too wide for even 8 rows;
    RMSNorm's weight row, in two passes), blocks of rows for a column sum; the CPU one in one
    piece. Both are right."""
    kernel = BY_NAME[name]
    inputs = arrays(kernel, np.float64, sizes)
    scalars = SCALARS.get(kernel.name, ())
    call_shapes = tuple(a.shape for a in inputs)
    instances = family_of(kernel)
    assert "FOR " in instances.source(call_shapes, pto.FLOAT64, (), SHARED_LIMIT)
    assert "FOR " not in instances.source(call_shapes, pto.FLOAT64, ())
    expected = _expected(kernel, inputs, scalars)
    cpu = [a.copy() for a in inputs]
    family_of(kernel).generated_cpu(*cpu, *scalars)
    _assert_matches(kernel, cpu, expected, np.float64)
    code, library = _host_library(kernel, np.float64, list(call_shapes), scalars, tmp_path)
    _host_call(library, kernel, code, inputs, scalars)
    _assert_matches(kernel, inputs, expected, np.float64)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=dtype_name)
@pytest.mark.parametrize("q_start, causal", [(0, False), (37, True), (-40, True), (130, True)])
def test_flash_attention_tile_in_passes_and_key_blocks_matches_numpy(q_start, causal, dtype, tmp_path):
    """flash_attention_tile's CUDA instance goes over a tall tile's rows in passes and the keys
    in blocks (the last a tail; the first sizes that fit a block); the causal loop stops after
    each pass's last query (q_start = 37: its first pass, of 128 rows in float16 and 64 in
    float32, sees 165 or 101 of the 300 keys; at -40 its first pass's first 40 rows see none,
    NaN as in numpy, and its loop still runs), and a block whose keys all come before the
    pass's first query skips the mask (at 130 the first two blocks of 64 do, and the CPU's first
    of CPU_KEY_BLOCK). The CPU's is one pass, blocks of CPU_KEY_BLOCK keys. Both equal float64
    numpy within the kernel tolerance."""
    h, m, d, n = 2, 200, 40, 300
    kernel = llm.flash_attention_tile
    inputs = arrays(kernel, dtype, {"h": h, "m": m, "d": d, "n": n})
    call_shapes = tuple(a.shape for a in inputs)
    cuda_program = family_of(kernel).source(call_shapes, as_dtype(dtype), (), SHARED_LIMIT)
    cpu_program = family_of(kernel).source(call_shapes, as_dtype(dtype), ())
    assert "FOR %row" in cuda_program and "FOR %row" not in cpu_program
    assert f"%s = alloc_tile : !pto.tile<{m}x{llm.CPU_KEY_BLOCK}x" in cpu_program
    expected = _expected(kernel, inputs, (q_start, causal))
    cpu = [a.copy() for a in inputs]
    kernel.cpu(*cpu, q_start, causal)
    _assert_matches(kernel, cpu, expected, dtype)
    code, library = _host_library(kernel, dtype, [a.shape for a in inputs], (q_start, causal), tmp_path)
    _host_call(library, kernel, code, inputs, (q_start, causal))
    _assert_matches(kernel, inputs, expected, dtype)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("d", [32, 48, 64, 96])
def test_flash_attention_tile_as_tf32_keeps_its_products_on_tensor_cores(d, tmp_path):
    """A float32 instance made with tf32 is sized as it is built (its sibling trial says tf32
    too): its products are TF32 mma at every head dim, and it computes attention to TF32's
    precision (operands rounded to 10 bits: 2^-11 relative each, over sums of |p·v| <= |v|max)."""
    kernel = llm.flash_attention_tile
    rng = np.random.default_rng(d)
    q, k, v = (rng.standard_normal((1, n, d)).astype(np.float32) for n in (64, 200, 200))
    out = np.zeros_like(q)
    shapes = (q.shape, k.shape, v.shape, out.shape)
    code = family_of(kernel).cuda(shapes, np.dtype(np.float32), (0, 1), tf32=True)
    assert "pto_mma_tf32(acc" in code.source.read_text()
    expected = _expected(kernel, [q, k, v, out], (0, 1))
    host_cuda.call(host_cuda.build(code, np.float32, tmp_path), kernel.name, code, [q, k, v, out], (0, 1))
    np.testing.assert_allclose(out, expected[3], rtol=0, atol=2e-2 * np.abs(expected[3]).max())
    assert np.abs(out - expected[3]).max() > 1e-6  # not exact: TF32's rounding shows


def test_first_fitting_tries_sizes_in_order_as_the_function_is_built_and_names_a_misfit():
    """Each candidate is written into a sibling of the builder (its name, its tf32), the first
    whose CUDA code fits is chosen; none fitting is an ISAError naming the function."""
    def write(f, rows):  # a rows x 16 operand in shared memory: 4096 and 2048 rows do not fit
        f.memref("a", pto.FLOAT16, (rows, 16)).memref("b", pto.FLOAT16, (16, 16))
        f.memref("out", pto.FLOAT16, (rows, 16)).tile("x", rows, 16, pto.FLOAT16)
        f.tile("y", 16, 16, pto.FLOAT16).tile("z", rows, 16, pto.FLOAT16)
        f.load("x", "a").load("y", "b").matmul("z", "x", "y").store("out", "z")

    tried = []
    builder = FunctionBuilder("sized").in_core()
    assert first_fitting(builder, [4096, 64], lambda f, rows: (tried.append(rows), write(f, rows))) == 64
    assert tried == [4096, 64]
    with pytest.raises(ISAError, match=r"@sized: no size of its tiles fits .* \(the smallest tried: 2048\)"):
        first_fitting(builder, [4096, 2048], write)


def test_flash_attention_tiles_sizes_fit_shared_memory_with_tensor_cores():
    """The sizes _attention_sizes picks for CUDA keep every tile a float16 instance reads whole
    in shared memory, its products on tensor cores, at the head dims of real models; the
    output in registers (scaled there by its rows' factors), k read across where it was loaded
    (no transpose), v as float16, k and v in several buffers each (the next key blocks'
    copied while this one's products run: past 48 KiB a block, opted in)."""
    for m, d in [(128, 128), (64, 128), (64, 64), (32, 256), (50, 72)]:
        code = family_of(llm.flash_attention_tile).cuda(((4, m, d), (4, 2048, d), (4, 2048, d), (4, m, d)),
                                                        np.dtype(np.float16), (0, 1))
        source = code.source.read_text()
        assert "pto_mma(acc" in source, (m, d)
        assert "float pto_frag_t_o[" in source, (m, d)
        assert all(f"PTO_SHARED(T, pto_buf_{tile}, [" in source for tile in ("t_vt", "t_k_part")), (m, d)
        assert re.search(r"pto_ldmatrix\(&fb\[4 \* p\], &t_k_part", source), (m, d)


# q, k and v of a 128-row pass at head dim 128 in float16, a buffer each (rows padded to 136)
ATTENTION_D128_TILES = (128 + 64 + 64) * 136 * 2


@pytest.mark.parametrize("arch", sorted(cuda_abi.BLOCK_SHARED))
def test_the_fused_attention_keeps_q_whole_where_the_gpu_gives_its_block_the_room(arch):
    """A fused attention block holds an SM (its registers allow one block an SM), so its tiles
    may take half of what a block may opt in to on the GPU (Generator.tile_budget): at head dim
    128 its 128-row passes keep q whole where that half holds q, k and v (sm_80's 163 KiB, sm_90's
    227), loaded once a pass, and every load in the loop over key blocks is a copy started a
    block or more ahead; on a GPU of 99 KiB a block (sm_86, sm_89, sm_120) q comes in chunks of
    64 columns, loaded again every key block, as on every GPU before. Either way the block
    takes no more than the GPU gives. A matmul band (two blocks an SM) is the same code on every
    GPU."""
    block_shared = cuda_abi.instance_shared(cuda_abi.BLOCK_SHARED[arch])
    shapes = ((4, 128, 128), (4, 2048, 128), (4, 2048, 128), (4, 128, 128))
    code = family_of(llm.flash_attention_tile).cuda(shapes, np.dtype(np.float16), (0, 1),
                                                    block_shared=block_shared)
    source = code.source.read_text()
    loop = source.index("for (long long i_key")
    whole = block_shared // 2 >= ATTENTION_D128_TILES
    assert whole == (arch in ("sm_80", "sm_87", "sm_90", "sm_100"))
    assert all(load.start() < loop for load in re.finditer("// TLOAD %q_part", source)) == whole
    in_loop = re.findall(r"// TLOAD [^\n]*", source[loop:])
    assert all(load.endswith("ahead") for load in in_loop) == whole, in_loop
    assert code.shared_bytes <= block_shared and (code.shared_bytes > cuda_abi.SHARED_OPT_IN) == whole
    band = ((1024, 512), (512, 128), (1024, 128))
    matmul = family_of(tiles.matmul)
    code = matmul.cuda(band, np.dtype(np.float16), (), block_shared=block_shared)
    assert "PTO_ENTRY(2)" in code.source.read_text()
    assert code.source == matmul.cuda(band, np.dtype(np.float16), ()).source


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("arch, d", [("sm_80", 128), ("sm_86", 256)])
def test_the_fused_attention_sized_to_other_gpus_matches_numpy(arch, d, tmp_path):
    """The instances sized to GPUs the emulator is not (it is an H100's kind), built for the
    host: an A100's at head dim 128 (q whole, k and v in three buffers: 139,264 bytes a block),
    and a 99 KiB GPU's at 256, whose room a little past 96 KiB gives k and v a third buffer
    (100,864 bytes). Both equal float64 numpy within the kernel tolerance."""
    kernel = llm.flash_attention_tile
    block_shared = cuda_abi.instance_shared(cuda_abi.BLOCK_SHARED[arch])
    rng = np.random.default_rng(d)
    q, k, v = (rng.standard_normal((1, rows, d)).astype(np.float16) for rows in (128, 200, 200))
    inputs = [q, k, v, np.zeros_like(q)]
    code = family_of(kernel).cuda(tuple(a.shape for a in inputs), np.dtype(np.float16), (0, 1),
                                  block_shared=block_shared)
    assert cuda_abi.SHARED_OPT_IN < code.shared_bytes <= block_shared
    expected = _expected(kernel, inputs, (0, 1))
    _host_call(host_cuda.build(code, np.float16, tmp_path), kernel, code, inputs, (0, 1))
    _assert_matches(kernel, inputs, expected, np.float16)


@pytest.mark.parametrize("first_position", [4096, 32000])
def test_rope_keeps_float32_accuracy_far_into_the_sequence(first_position, tmp_path):
    """The angles are float64 tiles (a float32 angle of 4000 is off by 2e-4 rad): float32 x
    stays within a few ulps of the float64 rotation, on the CPU and in the CUDA code."""
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    want = x.astype(np.float64)
    REFERENCES["rope"](want, first_position, 2)
    cpu = x.copy()
    llm.rope.cpu(cpu, first_position, 2)
    np.testing.assert_allclose(cpu, want, rtol=0, atol=1e-6)
    if shutil.which("g++"):
        gpu = x.copy()
        code, library = _host_library(llm.rope, np.float32, [x.shape], (first_position, 2), tmp_path)
        _host_call(library, llm.rope, code, [gpu], (first_position, 2))
        np.testing.assert_allclose(gpu, want, rtol=0, atol=1e-6)


HEADS = 32
LLAMA_7B = [("rmsnorm", ((32, 4096), (1, 4096), (32, 4096)), (1e-6,)),
            ("matmul", ((32, 4096), (4096, 11008), (32, 11008)), ()),
            ("swiglu", ((32, 11008), (32, 11008)), ()), ("add", ((32, 4096),) * 3, ()),
            ("rope", ((32, 4096),), (0, 32)),
            ("flash_scores", ((HEADS, 64, 128), (HEADS, 64, 128), (HEADS, 64, 64)), (0, 0, 1)),
            ("flash_softmax_update", ((32, 64, 64), (32, 64, 1), (32, 64, 1), (32, 64, 1)), ()),
            ("flash_pv", ((32, 64, 64), (32, 64, 128), (32, 64, 1), (32, 64, 128)), ()),
            ("flash_attention_tile", ((HEADS, 64, 128), (HEADS, 4096, 128), (HEADS, 4096, 128),
                                      (HEADS, 64, 128)), (0, 1))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=dtype_name)
def test_llama_7b_size_instances_keep_their_tiles_in_registers(dtype, tmp_path):
    """The instances a LLaMA-7B layer launches (32-row tiles, 32 heads of 128) compile for sm_90
    with no spills: column blocks keep each lane's share of a tile row small; in float16 the
    products' accumulators (tensor cores) too."""
    unit = tmp_path / "llama.cu"
    sources = [family_of(BY_NAME[name]).cuda(shapes, np.dtype(dtype), scalars).source
               for name, shapes, scalars in LLAMA_7B]
    unit.write_text("".join(source.read_text() for source in sources))
    done = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v",
                           *cuda_abi.COMPILE_OPTIONS[np.dtype(dtype)], "-c", str(unit), "-o",
                           str(tmp_path / "llama.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    spills = dict(re.findall(r"Function properties for (pto_\w+)\n\s*\d+ bytes stack frame, (\d+) bytes "
                             r"spill stores", done.stderr))
    assert sorted(spills) == sorted(f"pto_{name}" for name, _, _ in LLAMA_7B), done.stderr
    assert all(stores == "0" for stores in spills.values()), spills
