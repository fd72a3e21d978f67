"""The panel GEMM (kernels/panels.py) and the tiled matmul that packs B into panels for it.

The micro-kernel against float64 numpy on strided views of every kind it takes, and on the
layouts it hands to BLAS; the orchestration on native workers against the Python way on the
serial executor (bit for bit: both call the same numba function) and against numpy.

Tolerance: a float32 dot product of k terms summed in any order by fused multiply-adds is
within k·u·Σ|a_i·b_i| of the exact value (u = 2⁻²⁴), so every entry is checked against that
bound computed from |a| @ |b| (twice it, for the rounding of the accumulated output).
"""

import numpy as np
import pytest
from pto_gpu.kernels import panels
from pto_gpu.orchestration.matmul import program, tiled_matmul_panels

import pto_gpu as pto

UNIT_ROUNDOFF = 2.0 ** -24


def _within_dot_bound(got, a, b, before, accumulate):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = (before.astype(np.float64) if accumulate else 0) + a64 @ b64
    scale = np.abs(a64) @ np.abs(b64) + (np.abs(before) if accumulate else 0)
    bound = 2 * (a.shape[1] + 1) * UNIT_ROUNDOFF * scale + 1e-30
    assert np.all(np.abs(got.astype(np.float64) - expected) <= bound)


def _operands(rng, m, k, panel_count, width=panels.PANEL, dtype=np.float32):
    """a: rows of a wider matrix; b: panels of a larger packed buffer; out: a SPLIT view (panels
    of a matrix's columns), all strided as the tiled matmul's are."""
    wide = rng.standard_normal((m + 3, k + 5)).astype(dtype)
    packed = rng.standard_normal((panel_count + 2, k + 4, width)).astype(dtype)
    matrix = rng.standard_normal((m + 1, (panel_count + 1) * width)).astype(dtype)
    out = matrix.reshape(m + 1, panel_count + 1, width).transpose(1, 0, 2)[1:, 1:]
    return wide[2:2 + m, 3:3 + k], packed[1:1 + panel_count, 2:2 + k], out


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("m, k", [(128, 128), (13, 7), (8, 1), (1, 300), (21, 64)])
def test_the_micro_kernel_matches_float64_numpy(m, k, accumulate):
    rng = np.random.default_rng(m * 1000 + k)
    a, b, out = _operands(rng, m, k, 3)
    assert panels._micro_kernel_takes(a, b, out)  # so this exercises the micro-kernel
    before = out.copy()
    panels.panels_product(a, b, out, accumulate)
    _within_dot_bound(out, a, b, before, accumulate)


@pytest.mark.parametrize("m, k", [(128, 128), (13, 7), (1, 300)])
def test_the_micro_kernel_adds_a_separate_accumulator(m, k):
    rng = np.random.default_rng(m + k)
    a, b, out = _operands(rng, m, k, 3)
    acc = rng.standard_normal(out.shape).astype(np.float32)  # contiguous, as a heap accumulator
    assert panels._micro_kernel_takes(a, b, out) and panels._source_takes(acc, out)
    acc_before = acc.copy()
    panels.panels_product_add(a, b, acc, out)
    _within_dot_bound(out, a, b, acc_before, True)
    assert acc.tobytes() == acc_before.tobytes()  # read, never written


@pytest.mark.parametrize("layout", ["acc is out", "acc overlaps out", "acc columns strided",
                                    "no columns of a"])
def test_accumulators_in_every_layout_are_added_as_numpy_does(layout):
    rng = np.random.default_rng(9)
    a, b, out = _operands(rng, 9, 0 if layout == "no columns of a" else 11, 2)
    if layout == "acc is out":
        acc = out
    elif layout == "acc overlaps out":  # out's panels shifted by one row over the same matrix
        shared = rng.standard_normal((2, 10, 32)).astype(np.float32)
        acc, out = shared[:, 1:], shared[:, :9]
    elif layout == "acc columns strided":
        acc = rng.standard_normal((2, 9, 64)).astype(np.float32)[:, :, ::2]
    else:
        acc = rng.standard_normal(out.shape).astype(np.float32)
    acc_before = acc.copy()
    if layout in ("acc overlaps out", "acc columns strided"):  # the micro-kernel's fallbacks
        assert not panels._source_takes(acc, out)
    panels.panels_product_add(a, b, acc, out)
    _within_dot_bound(out, a, b, acc_before, True)


@pytest.mark.parametrize("layout", ["narrow panels", "float64", "out is a", "a is out's first panel",
                                    "b overlaps out", "a columns strided"])
def test_layouts_the_micro_kernel_does_not_take_go_through_blas(layout):
    rng = np.random.default_rng(7)
    if layout == "narrow panels":
        a, b, out = _operands(rng, 9, 11, 2, width=16)
    elif layout == "float64":
        a, b, out = _operands(rng, 9, 11, 2, dtype=np.float64)
    elif layout in ("out is a", "a is out's first panel"):  # read before any panel is written
        out = rng.standard_normal((2, 9, 32)).astype(np.float32)
        a, b = out[1 if layout == "out is a" else 0], rng.standard_normal((2, 32, 32)).astype(np.float32)
    elif layout == "b overlaps out":
        shared = rng.standard_normal((3, 32, 32)).astype(np.float32)
        a, b, out = rng.standard_normal((32, 32)).astype(np.float32), shared[0:2], shared[1:3]
    else:
        a = rng.standard_normal((9, 22)).astype(np.float32)[:, ::2]
        _, b, out = _operands(rng, 9, 11, 2)
    assert not panels._micro_kernel_takes(a, b, out)
    a_before, b_before, before = a.copy(), b.copy(), out.copy()
    panels.panels_product(a, b, out, True)
    _within_dot_bound(out, a_before, b_before, before, True)


@pytest.mark.parametrize("shape, tile", [((200, 96, 160), 64), ((64, 64, 64), 32), ((130, 200, 96), 96),
                                         ((100, 50, 64), 64)])  # the last: one product per tile of C
def test_tiled_matmul_panels_runs_natively_with_the_serial_bits(shape, tile):
    m, k, n = shape
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    by_python = np.full((m, n), np.nan, np.float32)
    serial = pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul_panels, a, b, by_python, tile)
    rt = pto.Runtime(backend="cpu", executor="parallel")
    native = np.full((m, n), np.nan, np.float32)
    rt.run(tiled_matmul_panels, a, b, native, tile)  # the first run learns the entries
    native[...] = np.nan
    result = rt.run(tiled_matmul_panels, a, b, native, tile)
    row_tiles, depth_tiles, col_tiles = -(-m // tile), -(-k // tile), -(-n // tile)
    # per column block: its packing copies, then per row tile the chain of products, the last into C
    assert result.num_tasks == serial.num_tasks == col_tiles * (depth_tiles + row_tiles * depth_tiles)
    assert result.native_tasks == result.num_tasks
    assert native.tobytes() == by_python.tobytes()
    _within_dot_bound(native, a, b, native, False)


@pytest.mark.parametrize("shape", [(64, 0, 64), (0, 32, 64), (64, 32, 0)])
def test_empty_products_leave_c_as_numpy_does(shape):
    m, k, n = shape
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    c = np.full((m, n), np.nan, np.float32)
    pto.Runtime(backend="cpu").run(tiled_matmul_panels, a, b, c, 32)
    assert np.array_equal(c, a @ b)  # zeros where A has no columns


def test_the_interpreted_program_submits_the_same_graph_and_bits():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((100, 70)).astype(np.float32)
    b = rng.standard_normal((70, 96)).astype(np.float32)
    rt = pto.Runtime(backend="cpu", executor="serial")
    compiled, interpreted = np.zeros((100, 96), np.float32), np.zeros((100, 96), np.float32)
    first = rt.run(tiled_matmul_panels, a, b, compiled, 64, record=True)
    second = rt.run(program().orchestration("tiled_matmul_panels"), a, b, interpreted, 64, record=True)
    assert first.graph.edges == second.graph.edges and first.num_tasks == second.num_tasks
    assert compiled.tobytes() == interpreted.tobytes()


@pytest.mark.parametrize("n, tile", [(96, 48), (100, 64), (96, 0)])
def test_a_tile_or_width_off_the_panels_is_refused_by_name(n, tile):
    a, b, c = np.zeros((64, 64), np.float32), np.zeros((64, n), np.float32), np.zeros((64, n), np.float32)
    with pytest.raises(pto.ParamError, match=rf"the tile \({tile}\) and B's columns \({n}\) must be"):
        pto.Runtime(backend="cpu").run(tiled_matmul_panels, a, b, c, tile)


def test_operands_of_other_shapes_are_refused_before_any_write():
    a, b, out = np.ones((9, 4), np.float32), np.ones((2, 4, 32), np.float32), np.zeros((2, 8, 32), np.float32)
    with pytest.raises(ValueError, match="shapes are not a"):
        panels.panels_product(a, b, out, False)
    assert not out.any()


@pytest.mark.parametrize("acc", [np.ones((2, 9, 16), np.float32), np.ones((2, 9, 32))],
                         ids=["shape", "dtype"])
def test_an_accumulator_unlike_out_is_refused_before_any_write(acc):
    a, b, out = np.ones((9, 4), np.float32), np.ones((2, 4, 32), np.float32), np.zeros((2, 9, 32), np.float32)
    with pytest.raises(ValueError, match="acc is not shaped as out, or not of its dtype"):
        panels.panels_product_add(a, b, acc, out)
    assert not out.any()
