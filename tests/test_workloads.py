"""Kernels, fused softmax, flash attention and the LLaMA layer against float64 references."""

import numpy as np
import pytest
from pto_gpu.kernels import elementwise, reduce, tiles
from pto_gpu.kernels.llm import flash_scores, rmsnorm
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import (
    flash_attention,
    flash_attention_fused,
    flash_attention_fused_compiled,
)
from pto_gpu.orchestration.llama import expected_tasks, llama_layer, llama_layer_inputs
from pto_gpu.orchestration.softmax import fused_softmax
from pto_gpu.orchestration.tiling import adaptive_tiles, binary_blocks, fixed_tiles

import pto_gpu as pto

rng = np.random.default_rng(7)


def run_one(kernel, arrays, *scalars):
    """Submit one task over externals: the last array is the output."""
    def orch(o):
        ts = [o.external(a) for a in arrays]
        o.submit(kernel, *(pto.input(t) for t in ts[:-1]), pto.output(ts[-1]), *scalars)
    pto.Runtime(backend="cpu", executor="serial").run(orch)


BINARY = [(elementwise.add, np.add), (elementwise.sub, np.subtract), (elementwise.mul, np.multiply),
          (elementwise.div, np.divide)]
UNARY = [(elementwise.exp, np.exp), (elementwise.log, np.log), (elementwise.sqrt, np.sqrt),
         (elementwise.silu, lambda a: a / (1 + np.exp(-a)))]


@pytest.mark.parametrize("kernel, ref", BINARY, ids=lambda k: getattr(k, "name", ""))
def test_binary_kernels(kernel, ref):
    a, b = rng.random((5, 7)) + 0.5, rng.random((5, 7)) + 0.5
    out = np.zeros((5, 7))
    run_one(kernel, [a, b, out])
    np.testing.assert_allclose(out, ref(a, b), rtol=1e-12)


@pytest.mark.parametrize("kernel, ref", UNARY, ids=lambda k: getattr(k, "name", ""))
def test_unary_kernels(kernel, ref):
    a, out = rng.random((5, 7)) + 0.5, np.zeros((5, 7))
    run_one(kernel, [a, out])
    np.testing.assert_allclose(out, ref(a), rtol=1e-12)


def test_reductions_broadcasts_matmul_and_scalars():
    a = rng.random((6, 4))
    for kernel, shape, expected in ((reduce.row_sum, (6, 1), a.sum(1, keepdims=True)),
                                    (reduce.row_max, (6, 1), a.max(1, keepdims=True)),
                                    (reduce.col_sum, (1, 4), a.sum(0, keepdims=True))):
        out = np.zeros(shape)
        run_one(kernel, [a, out])
        np.testing.assert_allclose(out, expected, rtol=1e-12)
    row = rng.random((6, 1)) + 1
    for kernel, ref in ((reduce.row_expand_sub, a - row), (reduce.row_expand_div, a / row),
                        (reduce.row_expand_mul, a * row)):
        out = np.zeros((6, 4))
        run_one(kernel, [a, row, out])
        np.testing.assert_allclose(out, ref, rtol=1e-12)
    out = np.zeros((6, 4))
    run_one(elementwise.scale, [a, out], 2.5)
    np.testing.assert_allclose(out, 2.5 * a, rtol=1e-12)
    b, out = rng.random((4, 3)), np.zeros((6, 3))
    run_one(tiles.matmul, [a, b, out])
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


@pytest.mark.parametrize("params, message", [
    (lambda o: (pto.input(o.alloc((4, 8))), pto.input(o.alloc((7, 8))), pto.output(o.alloc((4, 8)))),
     r"matmul: tensor param 1 dim 0 \(k\) is 7 but tensor param 0 has k=8"),
    (lambda o: (pto.input(o.alloc((4, 8))), pto.input(o.alloc((8, 2))), pto.output(o.alloc((4, 2, 1)))),
     r"matmul: tensor param 2 must be 2-d \(m n\), got shape \(4, 2, 1\)"),
    (lambda o: (pto.input(o.alloc((4, 8))), pto.input(o.alloc((8, 2), pto.FLOAT16)),
                pto.output(o.alloc((4, 2)))),
     "matmul: tensor param 1 is FLOAT16 but tensor param 0 is FLOAT32"),
    (lambda o: (pto.input(o.alloc((4, 8))), pto.output(o.alloc((4, 8)))),
     "matmul takes 3 tensor params, got 2"),
])
def test_kernels_reject_wrong_shapes_and_dtypes_at_submit(params, message):
    with pytest.raises(pto.ParamError, match=message):
        pto.Runtime(backend="cpu").run(lambda o: o.submit(tiles.matmul, *params(o)))


def test_rmsnorm_checks_its_weight_shape():
    def orch(o):
        o.submit(rmsnorm, pto.input(o.alloc((4, 8))), pto.input(o.alloc((1, 9))),
                 pto.output(o.alloc((4, 8))), 1e-6)
    with pytest.raises(pto.ParamError, match="rmsnorm: tensor param 1 dim 1"):
        pto.Runtime(backend="cpu").run(orch)


@pytest.mark.parametrize("rows, tile_rows", [(64, 8), (37, 8), (5, 16)])
def test_fused_softmax(executor, rows, tile_rows):
    x = rng.standard_normal((rows, 33)).astype(np.float32)
    out = np.zeros_like(x)
    result = pto.Runtime(backend="cpu", executor=executor).run(fused_softmax, x, out, tile_rows=tile_rows,
                                                               record=True)
    assert result.num_tasks == 5 * -(-rows // tile_rows)
    assert sorted(result.graph.edges)[:5] == [(0, 1), (1, 2), (2, 3), (2, 4), (3, 4)]
    # float32 exp and sum over 33 terms: 1e-6 relative is ~10 ulp.
    np.testing.assert_allclose(out, reference.softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq, tile", [(128, 32), (100, 32), (45, 64)])
def test_flash_attention(executor, causal, seq, tile):
    q, k, v = (rng.standard_normal((3, seq, 16)).astype(np.float32) for _ in range(3))
    out = np.zeros_like(q)
    result = pto.Runtime(backend="cpu", executor=executor).run(
        flash_attention, q, k, v, out, tile=tile, causal=causal)
    n = -(-seq // tile)
    pairs = n * (n + 1) // 2 if causal else n * n
    assert result.num_tasks == 2 * n + 3 * pairs
    # float32 online softmax over <= 128 keys: errors ~1e-6 of unit-scale outputs.
    np.testing.assert_allclose(out, reference.attention(q, k, v, causal), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("orchestration", [flash_attention_fused, flash_attention_fused_compiled],
                         ids=["python", "compiled"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq, tile", [(128, 32), (100, 32), (45, 64), (300, 128)])
def test_flash_attention_fused(executor, causal, seq, tile, orchestration):
    """A task per query tile (the tail tile too), over every key (300: key blocks of 128 and a
    tail); the three-task orchestration's tolerance."""
    q, k, v = (rng.standard_normal((3, seq, 16)).astype(np.float32) for _ in range(3))
    out = np.zeros_like(q)
    result = pto.Runtime(backend="cpu", executor=executor).run(
        orchestration, q, k, v, out, tile=tile, causal=causal)
    assert result.num_tasks == -(-seq // tile)
    np.testing.assert_allclose(out, reference.attention(q, k, v, causal), rtol=1e-4, atol=2e-5)


def test_binary_expansion_blocks_and_tiles():
    assert binary_blocks(300, 4096, 256) == [(0, 256, 256), (256, 44, 0)]
    assert binary_blocks(4096, 4096, 16) == [(0, 4096, 4096)]
    assert binary_blocks(53, 4096, 16) == [(0, 32, 32), (32, 16, 16), (48, 5, 0)]
    with pytest.raises(ValueError, match="exceeds max_range"):
        binary_blocks(5000, 4096, 16)
    assert fixed_tiles(70, 32) == [(0, 32), (32, 32), (64, 6)]
    # 53 base tiles of 32 rows: 48 in blocks -> 24 tiles of 64 rows, then 5 residual 32-row tiles.
    tiles = adaptive_tiles(53 * 32 - 10)
    assert len(tiles) == 29
    assert tiles[23] == (46 * 32, 64) and tiles[24] == (48 * 32, 32) and tiles[-1] == (52 * 32, 22)
    assert sum(rows for _, rows in tiles) == 53 * 32 - 10


@pytest.mark.parametrize("seq_len, plain, adaptive", [(1024, 3584, 1024), (2048, 13312, 3584),
                                                      (4096, 51200, 13312)])
def test_llama_task_counts_match_spec_table(seq_len, plain, adaptive):
    inputs = llama_layer_inputs(seq_len, lazy=True)
    rt = pto.Runtime(backend="cpu", executor="dry", heap_bytes=256 << 20)
    assert rt.run(llama_layer, inputs).num_tasks == plain == expected_tasks(seq_len // 32)
    assert rt.run(llama_layer, inputs, adaptive=True).num_tasks == adaptive == expected_tasks(seq_len // 64)


@pytest.mark.parametrize("seq_len, adaptive", [(96, False), (77, False), (600, True)])
def test_llama_layer_matches_reference(executor, seq_len, adaptive):
    inputs = llama_layer_inputs(seq_len, hidden=64, heads=4, ffn=96, seed=seq_len)
    pto.Runtime(backend="cpu", executor=executor).run(llama_layer, inputs, adaptive=adaptive)
    expected = reference.llama_layer(inputs)
    # float32 through ~10 chained matmuls of width <= 96: 1e-5 of the output's scale.
    np.testing.assert_allclose(inputs["out"], expected, atol=1e-5 * np.abs(expected).max())


def test_llama_pipelined_is_bit_identical_to_serial_and_matches_reference(executor):
    expected = llama_layer_inputs(128, hidden=64, heads=4, ffn=96)
    pto.Runtime(backend="cpu", executor="serial").run(llama_layer, expected)
    inputs = llama_layer_inputs(128, hidden=64, heads=4, ffn=96)
    pto.Runtime(backend="cpu", executor=executor).run(llama_layer, inputs, threshold=16)
    assert inputs["out"].tobytes() == expected["out"].tobytes()
    reference_out = reference.llama_layer(inputs)
    # The tolerance of test_llama_layer_matches_reference.
    np.testing.assert_allclose(inputs["out"], reference_out, atol=1e-5 * np.abs(reference_out).max())


def test_flash_scores_causal_mask():
    q = np.ones((1, 2, 4), np.float32)
    k = np.ones((1, 3, 4), np.float32)
    s = np.zeros((1, 2, 3), np.float32)
    def orch(o):
        o.submit(flash_scores, pto.input(o.external(q)), pto.input(o.external(k)),
                 pto.output(o.external(s)), 5, 5, 1)
    pto.Runtime(backend="cpu").run(orch)
    assert np.isinf(s[0, 0, 1:]).all() and np.isfinite(s[0, 1, :2]).all() and np.isinf(s[0, 1, 2])
