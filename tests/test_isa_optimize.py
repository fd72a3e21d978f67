"""Tile buffer reuse by liveness (pto_gpu.isa.optimize): the pass never changes a result.

Every kernel family's instances, for both targets (CPU: no local-memory budget; CUDA: the
shared-memory budget, which adds column blocks and chunked contractions, so FOR loops), run
under the reference interpreter before and after the pass on the same random inputs, whole
windows and tails: bitwise-equal outputs. The instances the pass changes also run through the
generators (CPU numba code; CUDA code built for the host by g++), against the interpreter.
Then hand-written programs that an unsound liveness would break (a tile read after a loop that
writes another tile, a tile carried across iterations, an accumulating destination, a tile kept
across an IF, a RETURN in a loop), and programs where the pass must reach an exact tile count.
"""

import shutil

import host_cuda
import numpy as np
import pytest
from kernel_samples import KERNELS, SCALARS, SIZES

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa import cpu_codegen, cuda_codegen, interpret
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_codegen import SHARED_LIMIT
from pto_gpu.isa.family import family_of
from pto_gpu.isa.ir import Op, walk
from pto_gpu.isa.optimize import assignment, optimize_module, reuse_tiles, tile_bytes

F32 = pto.FLOAT32
OTHER_SIZES = {"m": 7, "n": 12, "k": 9, "h": 3, "d": 6}  # rope: 12 = 2 heads of 6
# Sizes at which the CUDA instances work in pieces (column blocks, chunks of k: FOR loops).
CHUNKED = {"m": 3, "n": 700, "k": 100, "h": 2, "d": 80}
WIDE = {"rmsnorm": {"m": 3, "n": 7000}, "matmul": {"m": 4, "k": 20, "n": 7000},
        "matmul_acc": {"m": 4, "k": 20, "n": 7000}, "flash_pv": {"m": 5, "n": 100, "d": 64},
        "col_sum": {"m": 50, "n": 700}}


def _instance(kernel, sizes: dict[str, int], dtype, local_memory: int | None) -> isa.Module:
    """The instance's module as the family's builder writes it (built here, not by
    Family.module, which may run this pass itself)."""
    instances = family_of(kernel)
    words = [w for dims in instances.shapes for w in (dims[1:] if len(dims) == 3 else dims)
             if not w.isdigit()]
    named = {w: sizes[w] for w in dict.fromkeys(words)}
    structural = {name: SCALARS[kernel.name][i] for name, i in zip(instances.structural_names,
                                                                   instances.structural)}
    budget = {"local_memory": local_memory} if instances.budgeted else {}
    module = isa.Module(f"{instances.name}_" + "_".join(f"{w}{n}" for w, n in named.items()))
    builder = FunctionBuilder(instances.name, module=module).in_core()
    instances.build(builder, dtype, **named, **structural, **budget)
    builder.build()
    return module


def _inputs(kernel, function: isa.Function, sizes: dict[str, int], dtype, rng) -> list[np.ndarray]:
    """An array per memref of the function, of the window these sizes give (at most the memref's
    shape: smaller ones are tails)."""
    instances = family_of(kernel)
    arrays = []
    for dims, memref in zip(instances.shapes, function.memrefs):
        dims = dims[1:] if len(dims) == 3 else dims
        shape = tuple(min(int(w) if w.isdigit() else sizes[w], n) for w, n in zip(dims, memref.shape))
        arrays.append(rng.uniform(0.5, 2.0, shape).astype(dtype.numpy))
    return arrays


def _scalar_sets(kernel) -> list[tuple]:
    values = SCALARS.get(kernel.name, ())
    if kernel.name == "flash_scores":
        return [values, (*values[:2], 0)]  # causal and not: the IF both ways
    return [values]


def _assert_same_results(module: isa.Module, optimized: isa.Module, name: str, arrays, scalars) -> None:
    before, after = [a.copy() for a in arrays], [a.copy() for a in arrays]
    interpret.run(module, name, *before, *scalars)
    interpret.run(optimized, name, *after, *scalars)
    for index, (want, got) in enumerate(zip(before, after)):
        assert want.tobytes() == got.tobytes(), f"@{name} memref {index}: the pass changed the result"


def _tails(sizes: dict[str, int]) -> dict[str, int]:
    """Windows smaller than the instance's sizes: tiles valid over part of their rows and cols."""
    return {w: max(1, n - 1 - n // 4) for w, n in sizes.items()}


def _wide(kernel) -> dict[str, int]:
    if kernel.name == "rope":
        return {"m": 3, "n": 768}  # 2 heads of 384: columns past a CUDA block
    return {**CHUNKED, **WIDE.get(kernel.name, {})}


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_every_kernel_instance_gives_bitwise_the_same_results(kernel):
    rng = np.random.default_rng(sum(map(ord, kernel.name)))
    for sizes in (SIZES, OTHER_SIZES, _wide(kernel)):
        for dtype in (pto.FLOAT32, pto.FLOAT64, pto.FLOAT16):
            for local_memory in (None, SHARED_LIMIT):
                module = _instance(kernel, sizes, dtype, local_memory)
                optimized = optimize_module(module)
                function = module.functions[kernel.name]
                assert tile_bytes(optimized.functions[kernel.name]) <= tile_bytes(function)
                for window in (sizes, _tails(sizes)):
                    if kernel.name == "rope" and window is not sizes:
                        continue  # a rope window must hold whole heads
                    arrays = _inputs(kernel, function, window, dtype, rng)
                    for scalars in _scalar_sets(kernel):
                        _assert_same_results(module, optimized, kernel.name, arrays, scalars)


def _changed() -> list[tuple]:
    """(kernel, sizes, local_memory) of the float32 instances the pass changes."""
    found = []
    for kernel in KERNELS:
        for sizes in (SIZES, _wide(kernel)):
            for local_memory in (None, SHARED_LIMIT):
                module = _instance(kernel, sizes, pto.FLOAT32, local_memory)
                if optimize_module(module) != module:
                    found.append((kernel, sizes, local_memory))
    return found


CHANGED = _changed()
TOLERANCE = {pto.FLOAT32: dict(rtol=2e-5, atol=2e-6), pto.FLOAT64: dict(rtol=1e-12, atol=1e-12)}


def _reference(module, name, arrays, scalars) -> list[np.ndarray]:
    expected = [a.copy() for a in arrays]
    interpret.run(module, name, *expected, *scalars)
    return expected


def _host_run(module: isa.Module, name: str, arrays, scalars, dtype, folder) -> None:
    """The CUDA code of `name`, built for the host and called with the backend's arguments."""
    code = cuda_codegen.cuda_code(module, name, folder)
    host_cuda.call(host_cuda.build(code, dtype.numpy, folder), name, code, arrays, scalars)


def test_the_pass_changes_the_instances_it_should():
    names = {(kernel.name, local_memory) for kernel, _, local_memory in CHANGED}
    assert {"rope", "flash_softmax_update"} <= {name for name, _ in names}
    assert ("rmsnorm", SHARED_LIMIT) in names and ("rmsnorm", None) not in names  # two passes on CUDA


@pytest.mark.parametrize("dtype", [pto.FLOAT32, pto.FLOAT64], ids=lambda d: d.name)
@pytest.mark.parametrize("kernel, sizes, local_memory", CHANGED,
                         ids=[f"{_instance(k, s, pto.FLOAT32, lm).name}-{'cuda' if lm else 'cpu'}"
                              for k, s, lm in CHANGED])
def test_generated_code_of_an_optimised_instance_matches_the_interpreter(kernel, sizes, local_memory, dtype,
                                                                         tmp_path):
    """The CPU instance's numba code, the CUDA instance's code built for the host."""
    module = _instance(kernel, sizes, dtype, local_memory)
    optimized = optimize_module(module)
    arrays = _inputs(kernel, module.functions[kernel.name], sizes, dtype, np.random.default_rng(3))
    for scalars in _scalar_sets(kernel):
        expected = _reference(module, kernel.name, arrays, scalars)
        got = [a.copy() for a in arrays]
        if local_memory is None:
            cpu_codegen.cpu_function(optimized, kernel.name)(*got, *scalars)
        elif shutil.which("g++"):
            _host_run(optimized, kernel.name, got, scalars, dtype, tmp_path)
        else:
            pytest.skip("g++ is not installed")
        for index, (have, want) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(have, want, err_msg=f"param {index}", **TOLERANCE[dtype])


# --- hand-written programs an unsound liveness would break ----------------------------------------
def _function(name: str, memrefs: dict[str, tuple[int, int]], tiles: list[str],
              shape: tuple[int, int] = (4, 8)) -> FunctionBuilder:
    f = FunctionBuilder(name).in_core()
    for memref, dims in memrefs.items():
        f.memref(memref, F32, dims)
    for tile in tiles:
        f.tile(tile, *shape, F32)
    return f


def _check(f: FunctionBuilder, *scalar_sets: tuple, windows: dict[str, tuple[int, int]] | None = None
           ) -> isa.Function:
    """Build, optimise, and compare under the interpreter on random inputs (of the memrefs'
    shapes, or the smaller `windows`: tails), once per scalar set; the optimised function."""
    function = f.build()
    module = isa.Module(function.name)
    module.add(function)
    optimized = optimize_module(module)
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((windows or {}).get(m.name, m.shape)).astype(np.float32)
              for m in function.memrefs]
    for scalars in scalar_sets or [()]:
        _assert_same_results(module, optimized, function.name, arrays, scalars)
    return optimized.functions[function.name]


def _shared(f: FunctionBuilder, first: str, second: str) -> bool:
    """Whether the pass gives two tiles of the function one storage."""
    storage = assignment(f.build())
    return storage[first] == storage[second]


def test_a_tile_read_after_a_loop_keeps_its_storage_through_the_loop():
    f = _function("after_loop", {"x": (4, 32), "out": (4, 32), "kept": (4, 8)}, ["keep", "t", "u"])
    f.load("keep", "x", 0, 0)
    f.for_loop("j", 0, 32, 8).load("t", "x", 0, "j").exp("u", "t").store("out", "u", 0, "j").end_for()
    f.store("kept", "keep")
    optimized = _check(f)
    assert not _shared(f, "keep", "t") and not _shared(f, "keep", "u")
    assert [t.name for t in optimized.tiles] == ["keep", "t"]  # u takes t's storage (t is dead there)


def test_a_tile_carried_across_iterations_is_not_overwritten_inside_the_loop():
    """prev is written late in an iteration and read early in the next: live across the back
    edge, so `fresh`, written between the two, must not take its storage (in a straight-line
    view of the body prev is dead there)."""
    f = _function("carried", {"x": (4, 32), "y": (4, 32), "out": (4, 32), "out2": (4, 32)},
                  ["prev", "d", "fresh"])
    f.load("prev", "x", 0, 0)
    f.for_loop("j", 8, 32, 8)
    f.sub("d", "prev", "prev").adds("d", "d", 1.0).mul("d", "d", "prev").store("out", "d", 0, "j")
    f.load("prev", "x", 0, "j")
    f.load("fresh", "y", 0, "j").exp("fresh", "fresh").store("out2", "fresh", 0, "j")
    f.end_for()
    _check(f)
    assert not _shared(f, "prev", "fresh")


def test_an_accumulator_across_a_loop_is_not_shared():
    f = _function("running", {"x": (4, 32), "out": (4, 8), "sq": (4, 32)}, ["acc", "t", "s"])
    f.fill("acc", 0.0)
    f.for_loop("j", 0, 32, 8).load("t", "x", 0, "j").mul("s", "t", "t").store("sq", "s", 0, "j")
    f.add("acc", "acc", "t").end_for()
    f.store("out", "acc")
    _check(f)
    assert not _shared(f, "acc", "t") and not _shared(f, "acc", "s")


def test_an_accumulating_destination_is_read():
    """TMATMUL_ACC reads c: its TLOAD is no dead write, so t (of c's shape, written and done with
    before the product) may not take c's storage; nor may a product's destination share a
    source's."""
    f = _function("accumulate", {"a_in": (8, 8), "b_in": (8, 8), "c_io": (8, 8), "t_io": (8, 8)},
                  ["c", "t", "a", "b", "e"], shape=(8, 8))
    f.load("c", "c_io").load("t", "t_io").exp("t", "t").store("t_io", "t")
    f.load("a", "a_in").load("b", "b_in").matmul_acc("c", "a", "b")
    f.matmul("e", "c", "b").store("c_io", "e")
    optimized = _check(f)
    for first, second in (("c", "t"), ("c", "a"), ("c", "b"), ("e", "c"), ("e", "b")):
        assert not _shared(f, first, second), (first, second)
    assert [t.name for t in optimized.tiles] == ["c", "t", "b"]  # a, then e, take t's storage


def test_a_tile_live_on_one_arm_of_an_if_is_live_across_the_other():
    f = _function("branch", {"x": (4, 8), "y": (4, 8), "out": (4, 8), "out2": (4, 8)}, ["t", "w", "v"])
    f.scalar("flag", pto.INT64)
    f.load("t", "x").if_then("flag", "ne", 0).load("w", "y").store("out", "w")
    f.else_().load("v", "y").exp("v", "v").store("out", "v").end_if()
    f.store("out2", "t")
    _check(f, (0,), (1,))
    assert not _shared(f, "t", "w") and not _shared(f, "t", "v")
    assert _shared(f, "w", "v")  # never live together: one arm each


def test_a_tile_written_only_on_one_arm_keeps_its_earlier_value_on_the_other():
    f = _function("one_arm", {"x": (4, 8), "y": (4, 8), "out": (4, 8)}, ["t", "w"])
    f.scalar("flag", pto.INT64)
    f.load("t", "x").load("w", "y").if_then("flag", "ne", 0).exp("t", "w").end_if()
    f.store("out", "t")
    _check(f, (0,), (1,))
    assert not _shared(f, "t", "w")


def test_a_return_in_a_loop_ends_live_ranges_only_on_its_path():
    f = _function("early", {"x": (4, 32), "out": (4, 32), "kept": (4, 8)}, ["keep", "t"])
    f.scalar("stop", pto.INT64)
    f.load("keep", "x")
    f.for_loop("j", 0, 32, 8).if_then("j", "ge", "stop").ret().end_if()
    f.load("t", "x", 0, "j").store("out", "t", 0, "j").end_for()
    f.store("kept", "keep")
    _check(f, (0,), (16,), (100,))
    assert not _shared(f, "keep", "t")


def test_a_tile_read_where_no_write_may_have_reached_it_is_never_merged():
    """Its empty initial state is observed (an empty valid region: nothing stored). (A read
    with no write before it at all is refused by the verifier; one after a write in a branch
    not taken is not.)"""
    f = _function("uninitialised", {"x": (4, 8), "out": (4, 8), "out2": (4, 8)}, ["t", "u"])
    f.scalar("flag", pto.INT64)
    f.if_then("flag", "eq", 7).load("t", "x").end_if()
    f.if_then("flag", "ne", 0).load("u", "x").store("out", "u").end_if()
    f.store("out2", "t")
    optimized = _check(f, (0,), (1,))
    assert [t.name for t in optimized.tiles] == ["t", "u"]


def test_tails_keep_their_valid_regions():
    """A tail TLOAD leaves the rest of the tile untouched but past its valid region: the tile's
    earlier value is dead, and what is stored is the tail's."""
    f = _function("tails", {"x": (4, 8), "small": (4, 8), "out": (4, 8), "out2": (4, 8)}, ["t", "u"])
    f.load("t", "x").store("out", "t").load("u", "small").exp("u", "u").store("out2", "u")
    optimized = _check(f, windows={"small": (2, 3)})
    assert [t.name for t in optimized.tiles] == ["t"]


def test_a_row_broadcast_kept_in_shared_memory_shares_with_no_tile():
    """s and s2 (8 x 1, both read whole by TCOLSUM: CUDA shared memory) never live together,
    but s is a TROWEXPANDMUL's b, which the CUDA code reads per row with no barrier after."""
    f = _function("broadcast", {"x": (8, 8), "out": (8, 8), "c_out": (1, 1)}, ["x_t", "y"], shape=(8, 8))
    f.tile("s", 8, 1, F32).tile("s2", 8, 1, F32).tile("c", 1, 1, F32)
    f.load("x_t", "x").rowsum("s", "x_t").colsum("c", "s").store("c_out", "c")
    f.rowexpandmul("y", "x_t", "s").rowmax("s2", "y").colsum("c", "s2").store("c_out", "c").store("out", "y")
    _check(f)
    assert not _shared(f, "s", "s2")


# --- what the pass reaches --------------------------------------------------------------------------
def test_a_softmax_chain_shrinks_to_one_tile_of_each_shape():
    """Seven tiles (four 8x16 values in a chain, two 8x1 reductions, one never used) become two."""
    f = _function("softmax", {"x": (8, 16), "out": (8, 16)}, ["a", "b", "c", "d", "unused"], shape=(8, 16))
    f.tile("r1", 8, 1, F32).tile("r2", 8, 1, F32)
    f.load("a", "x").rowmax("r1", "a").rowexpandsub("b", "a", "r1").exp("c", "b").rowsum("r2", "c")
    f.rowexpanddiv("d", "c", "r2").store("out", "d")
    before = f.build()
    optimized = _check(f)
    assert [t.name for t in optimized.tiles] == ["a", "r1"]
    assert tile_bytes(before) == 5 * 8 * 16 * 4 + 2 * 8 * 4
    assert tile_bytes(optimized) == 8 * 16 * 4 + 8 * 4
    ops = [s for s in walk(optimized.body) if isinstance(s, Op)]
    assert ops[2] == Op("TROWEXPANDSUB", "a", ("a", "r1")) and ops[4] == Op("TROWSUM", "r1", ("a",))


def test_only_tiles_of_one_shape_and_dtype_and_role_share():
    f = _function("kinds", {"x": (8, 8), "y": (8, 4), "z": (8, 8), "out": (8, 8), "out2": (8, 4)},
                  ["a", "b"], shape=(8, 8))
    f.tile("narrow", 8, 4, F32).tile("wide64", 8, 8, pto.FLOAT64).tile("whole", 8, 8, F32)
    f.tile("r", 8, 8, F32)
    f.load("a", "x").store("out", "a")
    f.load("narrow", "y").store("out2", "narrow")  # another shape
    f.load("a", "x").cvt("wide64", "a").cvt("b", "wide64")  # another dtype
    f.load("whole", "z").matmul("a", "b", "whole")  # read whole: in CUDA shared memory
    f.load("r", "x").exp("r", "r").store("out", "r")  # a and b live, whole dead but in shared memory
    f.store("out", "a").store("out", "b")
    optimized = _check(f)
    assert [t.name for t in optimized.tiles] == ["a", "b", "narrow", "wide64", "whole", "r"]


@pytest.mark.parametrize("dtype", [pto.FLOAT16, F32], ids=["tensor-cores", "fma"])
def test_tensor_core_tiles_share_only_with_tiles_of_their_role_in_the_products(dtype):
    """q·kᵀ then p·v, every tile 16 x 16: k's load (a transpose's source), its transpose (a
    product's b), v's load (an operand) and the scores never live together. In a float16 kernel
    each keeps its own storage (the CUDA code reads k across in place and keeps v as float16:
    merged, neither could be), and the factor that scales the result in place counts as read
    whole (alone); in a float32 one (FMA) k's load and v's share, as before."""
    f = FunctionBuilder("roles").in_core()
    for memref in ("q", "k", "v", "w", "out"):
        f.memref(memref, dtype, (16, 1) if memref == "w" else (16, 16))
    for tile in ("tq", "tk", "kt", "s", "tv", "o"):
        f.tile(tile, 16, 16, dtype)
    f.tile("factor", 16, 1, dtype).tile("column", 16, 1, dtype)
    f.load("tq", "q").load("tk", "k").trans("kt", "tk").matmul("s", "tq", "kt").exp("s", "s")
    f.rowsum("column", "s").store("w", "column")
    f.load("tv", "v").matmul("o", "s", "tv").load("factor", "w").rowexpanddiv("o", "o", "factor")
    f.store("out", "o")
    storage = assignment(f.build())
    if dtype == F32:
        assert storage["tv"] == storage["tk"]
    else:
        assert len({storage[t] for t in ("tk", "kt", "tv", "s")}) == 4
        assert storage["factor"] == "factor" and storage["column"] == "column"


def test_the_pass_keeps_names_order_and_other_functions():
    m = isa.Module("two")
    (FunctionBuilder("inner", module=m).in_core().memref("x", F32, (4, 8)).memref("out", F32, (4, 8))
        .tile("t", 4, 8, F32).tile("u", 4, 8, F32).load("t", "x").exp("u", "t").store("out", "u").build())
    (FunctionBuilder("outer", module=m).in_core().memref("x", F32, (4, 16)).memref("out", F32, (4, 16))
        .tile("keep", 4, 8, F32).load("keep", "x").call("inner", {"x": ("x", 0, 1), "out": ("out", 0, 0)})
        .store("out", "keep", 0, 8).build())
    (FunctionBuilder("main", module=m).not_in_core().memref("x", F32).memref("out", F32)
        .call("outer", {"x": "x", "out": "out"}).build())
    optimized = optimize_module(m)
    assert list(optimized.functions) == ["inner", "outer", "main"]
    assert optimized.functions["main"] is m.functions["main"]
    assert [t.name for t in optimized.functions["inner"].tiles] == ["t"]
    assert optimized.functions["outer"] == m.functions["outer"]  # a call touches no caller tile
    x = np.arange(64, dtype=np.float32).reshape(4, 16) / 64
    outs = [np.zeros((4, 16), np.float32) for _ in "ab"]
    interpret.run(m, "outer", x, outs[0])
    interpret.run(optimized, "outer", x, outs[1])
    assert outs[0].tobytes() == outs[1].tobytes()
    assert reuse_tiles(optimized.functions["inner"]) == optimized.functions["inner"]  # a fixpoint
