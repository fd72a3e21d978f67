"""Orchestration lowering (pto_gpu/isa/lowering.py), interpreted and compiled alike: the binary
expansion runs every iteration once, adaptive tiles pick their variants, local tensors are
allocated, viewed, split and freed after their last use, library kernels are checked against
their declarations, and bad programs are refused with errors that name the statement."""

import importlib.resources

import numpy as np
import pytest
from pto_gpu.orchestration.llama import program as llama_program
from pto_gpu.orchestration.tiling import binary_blocks

import pto_gpu as pto
from pto_gpu import isa
from pto_gpu.isa.family import family_of
from pto_gpu.isa.lowering import Level, expansion, free_points
from tests import kernel_samples

F32 = pto.FLOAT32
PROGRAMS = importlib.resources.files("pto_gpu.orchestration") / "programs"
COLS = 16
MAX_RANGE, MIN_RANGE = 64, 8


def bump_module(levels=None, rows: str | None = None) -> isa.Module:
    """@bump_all adds 1 to tile i of `data` (8 x COLS tiles) for i < n, in a binary-expanded loop."""
    m = isa.Module("bump")
    (isa.FunctionBuilder("bump", module=m).in_core()
        .memref("data", F32, (8, COLS)).tile("t", 8, COLS, F32)
        .load("t", "data").adds("t", "t", 1.0).store("data", "t")
        .build())
    (isa.FunctionBuilder("bump_all", module=m).not_in_core()
        .memref("data", F32).scalar("n", pto.INT64)
        .for_loop("i", 0, "n", 1, max_range=MAX_RANGE, min_range=MIN_RANGE, tile_levels=levels, rows=rows)
        .call("bump", {"data": ("data", "i", 0)})
        .end_for()
        .build())
    return m


@pytest.fixture(scope="module")
def bump():
    return isa.compile(bump_module())


SWEEP = sorted({0, 1, MIN_RANGE - 1, MIN_RANGE, MIN_RANGE + 1, MAX_RANGE - 1, MAX_RANGE,
                *range(3, MAX_RANGE, 6)})


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_binary_expansion_runs_every_iteration_exactly_once(bump, compiled):
    run = bump.orchestration("bump_all", compiled=compiled)
    for n in SWEEP:
        data = np.zeros((8 * MAX_RANGE, COLS), np.float32)
        result = pto.Runtime(executor="serial").run(run, data, n, record=True)
        assert result.num_tasks == n
        expected = np.zeros_like(data)
        expected[:8 * n] = 1
        np.testing.assert_array_equal(data, expected, err_msg=f"n={n}")
        # in order: task t is iteration t (its window starts at row 8t)
        starts = [t.params[0].value.byte_offset // (COLS * 4) for t in result.graph.tasks]
        assert starts == [8 * i for i in range(n)]


def test_the_expansion_is_the_spec_blocks():
    loop = bump_module().functions["bump_all"].body[0]
    levels = expansion(loop)
    assert [level.size for level in levels] == [64, 32, 16, 8, 0]
    for n in SWEEP:  # the same blocks as tiling.binary_blocks, the plain-Python statement of §2.5
        from pto_gpu.isa.lowering import block_count
        counts = [block_count(level, n, MIN_RANGE) for level in levels]
        assert [(size, count) for size, count in zip([64, 32, 16, 8, 0], counts) if count] == \
            [(level or 0, count) for _, count, level in binary_blocks(n, MAX_RANGE, MIN_RANGE)]


# --- adaptive tiles ----------------------------------------------------------------------------

LEVELS = {0: 8, 8: 16, 16: 16, 32: 16, 64: 16}


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def adaptive_softmax(define_variant: bool) -> isa.Module:
    """dynamic_softmax over 8-row base tiles, 16-row tiles in the blocks. With define_variant
    the module writes softmax_tile_16 itself, as a softmax times 2 (so its use shows)."""
    text = (PROGRAMS / "dynamic_softmax.pto").read_text()
    m = isa.parse(text.replace("max_range=4096 min_range=256",
                               "max_range=64 min_range=8 tile_levels={0:8,8:16,16:16,32:16,64:16}"))
    if define_variant:
        (isa.FunctionBuilder("softmax_tile_16", module=m).in_core()
            .memref("input", F32, (16, 64)).memref("output", F32, (16, 64))
            .tile("x", 16, 64, F32).tile("mx", 16, 1, F32).tile("s", 16, 1, F32)
            .load("x", "input").rowmax("mx", "x").rowexpandsub("x", "x", "mx").exp("x", "x")
            .rowsum("s", "x").rowexpanddiv("x", "x", "s").muls("x", "x", 2.0).store("output", "x")
            .build())
    return m


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("define_variant", [False, True], ids=["made", "defined"])
@pytest.mark.parametrize("n", [5, 8, 37, 64])
def test_adaptive_tiles_run_the_variant_in_blocks_and_the_base_tile_in_residual(compiled, define_variant, n):
    program = isa.compile(adaptive_softmax(define_variant))
    assert ("softmax_tile_16" in program.variants) != define_variant
    x = np.random.default_rng(n).standard_normal((8 * n, 64)).astype(np.float32)
    y = np.zeros_like(x)
    run = program.orchestration("dynamic_softmax", compiled=compiled)
    result = pto.Runtime(executor="serial").run(run, x, y, n, record=True)
    blocked = n - n % MIN_RANGE  # base tiles in blocks, two per task
    assert result.num_tasks == blocked // 2 + n % MIN_RANGE
    assert [t.kernel.name for t in result.graph.tasks] == \
        ["softmax_tile_16"] * (blocked // 2) + ["softmax_tile"] * (n % MIN_RANGE)
    expected = softmax_rows(x)
    if define_variant:
        expected[:8 * blocked] *= 2
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=1e-7)


def test_a_loop_rows_scalar_holds_each_levels_tile_rows():
    """rows=%r: an adaptive loop that views its tiles itself (as the LLaMA program does)."""
    m = isa.Module("rows")
    (isa.FunctionBuilder("scale", module=m).library("pto_gpu.kernels.elementwise.scale")
        .memref("a", F32, direction="input").memref("out", F32, direction="output")
        .scalar("factor", pto.FLOAT64).build())
    (isa.FunctionBuilder("by_tile_rows", module=m).not_in_core()
        .memref("x", F32).memref("y", F32).scalar("n", pto.INT64)
        .scalar_var("first", pto.INT64).scalar_var("last", pto.INT64)
        .tensor("x_tile", F32).tensor("y_tile", F32)
        .for_loop("i", 0, "n", 1, max_range=MAX_RANGE, min_range=MIN_RANGE, tile_levels=LEVELS, rows="r")
        .scalar_mul("first", "i", 8).scalar_add("last", "first", "r")
        .view("x_tile", "x", (("first", "last"), None)).view("y_tile", "y", (("first", "last"), None))
        .call("scale", {"a": "x_tile", "out": "y_tile"}, scalars={"factor": "r"})
        .end_for()
        .build())
    program = isa.compile(m)
    for compiled in (False, True):
        x = np.ones((8 * 13, 4), np.float32)
        y = np.zeros_like(x)
        result = pto.Runtime(executor="serial").run(program.orchestration("by_tile_rows", compiled=compiled),
                                                    x, y, 13, record=True)
        assert [t.params[0].value.shape for t in result.graph.tasks] == [(16, 4)] * 4 + [(8, 4)] * 5
        np.testing.assert_array_equal(y[:64], 16)
        np.testing.assert_array_equal(y[64:], 8)


# --- local tensors -----------------------------------------------------------------------------


def test_free_points_follow_the_last_use_of_a_tensor_or_its_views():
    m = isa.parse(PROGRAM)
    body = m.functions["tiles"].body
    loop = next(s for s in body if isinstance(s, isa.For))
    from pto_gpu.isa.dataflow import tensor_roots
    points = free_points(loop.body, tensor_roots(m.functions["tiles"]))
    calls = [i for i, s in enumerate(loop.body) if isinstance(s, isa.Call)]
    # scratch is last used (through its view `half`) by the second call
    assert [names for names in points if names] == [("scratch",)]
    assert points[calls[1]] == ("scratch",)


PROGRAM = """// PTO Module: scratch

// Function Type: InCore
func @copy(%a: in !pto.memref<f32>, %out: out !pto.memref<f32>) = library K.tiles.copy

// Function Type: InCore
func @scale(%a: in !pto.memref<f32>, %out: out !pto.memref<f32>, %factor: f64) = library \
pto_gpu.kernels.elementwise.scale

// Function Type: Orchestration
func @tiles(%x: !pto.memref<f32>, %y: !pto.memref<f32>, %tile: i64) {
  %rows = alloc_scalar : i64
  %cols = alloc_scalar : i64
  %n = alloc_scalar : i64
  %first = alloc_scalar : i64
  %last = alloc_scalar : i64
  %x_tile = alloc_tensor : !pto.memref<f32>
  %y_tile = alloc_tensor : !pto.memref<f32>
  %scratch = alloc_tensor : !pto.memref<f32>
  %half = alloc_tensor : !pto.memref<f32>
  %y_half = alloc_tensor : !pto.memref<f32>
  %rows = sdim %x, 0
  %cols = sdim %x, 1
  %n = sadd %rows, %tile
  %n = ssub %n, 1
  %n = sdiv %n, %tile
  FOR %i:idx, 0:idx, %n:idx, 1:idx
    %first = smul %i, %tile
    %last = sadd %first, %tile
    %x_tile = view %x[%first:%last, :]
    %y_tile = view %y[%first:%last, :]
    %last = sdim %x_tile, 0
    %scratch = alloc [%last, %cols]
    CALL @copy(%a -> %x_tile, %out -> %scratch)
    %half = view %scratch[:, 0:%cols]
    CALL @scale(%a -> %half, %out -> %y_tile, %factor = 3.0)
  ENDFOR
}

// Function Type: InCore
func @flash_init(%m: out !pto.memref<f32>, %s: out !pto.memref<f32>,
                 %o: out !pto.memref<f32>) = library K.llm.flash_init

// y (rows, groups * c) as (groups, rows, c), zeroed by flash_init.
// Function Type: Orchestration
func @split_zero(%y: !pto.memref<f32>, %groups: i64) {
  %rows = alloc_scalar : i64
  %y_groups = alloc_tensor : !pto.memref<f32>
  %running_max = alloc_tensor : !pto.memref<f32>
  %running_sum = alloc_tensor : !pto.memref<f32>
  %rows = sdim %y, 0
  %y_groups = split %y, %groups
  %running_max = alloc [%groups, %rows, 1]
  %running_sum = alloc [%groups, %rows, 1]
  CALL @flash_init(%m -> %running_max, %s -> %running_sum, %o -> %y_groups)
}

// Function Type: Orchestration
func @copy_rows(%x: !pto.memref<f32>, %y: !pto.memref<f32>, %first: i64, %last: i64) {
  %x_rows = alloc_tensor : !pto.memref<f32>
  %y_rows = alloc_tensor : !pto.memref<f32>
  %x_rows = view %x[%first:%last, :]
  %y_rows = view %y[%first:%last, :]
  CALL @copy(%a -> %x_rows, %out -> %y_rows)
}
""".replace("library K.", "library pto_gpu.kernels.")


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_local_tensors_are_freed_each_iteration_so_a_small_heap_suffices(compiled):
    program = isa.compile(isa.parse(PROGRAM))
    x = np.random.default_rng(1).standard_normal((203, 64)).astype(np.float32)
    y = np.zeros_like(x)
    # 26 tiles of 8 x 64 floats (2 KiB each) through a heap of 8 KiB: it must be reclaimed.
    rt = pto.Runtime(executor="serial", heap_bytes=8 << 10)
    result = rt.run(program.orchestration("tiles", compiled=compiled), x, y, 8, record=True)
    assert result.num_tasks == 2 * 26
    np.testing.assert_array_equal(y, 3 * x)


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_a_split_sees_column_groups_as_a_leading_dim(compiled):
    program = isa.compile(isa.parse(PROGRAM))
    y = np.ones((5, 12), np.float32)
    result = pto.Runtime(executor="serial").run(program.orchestration("split_zero", compiled=compiled), y, 3,
                                                record=True)
    out = result.graph.tasks[0].params[2].value
    assert (out.shape, out.strides) == ((3, 5, 4), (4, 12, 1))
    np.testing.assert_array_equal(y, 0)
    with pytest.raises(isa.ISAError, match=r"@split_zero: %y_groups = SPLIT %y, %groups"):
        pto.Runtime(executor="serial").run(program.orchestration("split_zero", compiled=compiled), y, 5)


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_a_view_is_cut_at_the_edge_and_one_outside_it_names_the_statement(compiled):
    program = isa.compile(isa.parse(PROGRAM))
    run = program.orchestration("copy_rows", compiled=compiled)
    x = np.arange(16 * 4, dtype=np.float32).reshape(16, 4)
    y = np.zeros_like(x)
    pto.Runtime(executor="serial").run(run, x, y, 8, 100)  # rows 8..16: a tail
    np.testing.assert_array_equal(y, np.where(np.arange(16)[:, None] >= 8, x, 0))
    for first, last in ((16, 20), (4, 2)):
        with pytest.raises(isa.ISAError, match=r"@copy_rows: %x_rows = VIEW %x\[%first:%last, :\]: .*dim 0"):
            pto.Runtime(executor="serial").run(run, x, y, first, last)


# --- library kernels ---------------------------------------------------------------------------


def test_the_llama_programs_library_declarations_are_the_kernels_directions():
    program = llama_program()
    libraries = [f for f in program.module.functions.values() if f.library is not None]
    assert len(libraries) == 11
    for function in libraries:
        kernel = program.kernels[function.name]
        family = family_of(kernel)
        sizes = family.sizes(tuple(kernel_samples.shapes(kernel)))
        structural = tuple(kernel_samples.SCALARS.get(kernel.name, ())[i] for i in family.structural)
        instance = family.module(sizes, pto.FLOAT32, structural)
        flows = isa.directions(instance.functions[family.name], instance)
        assert [m.direction for m in function.memrefs] == list(flows.values()), function.name


@pytest.mark.parametrize("path, message", [
    ("pto_gpu.kernels.tiles.nothing", r"cannot import it"),
    ("pto_gpu.kernels.tiles.contract", r"not a pto.Kernel"),
    ("pto_gpu.kernels.elementwise.add", r"declares 2 memrefs .* but the kernel takes 3 tensors"),
])
def test_a_library_declaration_that_does_not_match_its_kernel_is_refused(path, message):
    m = isa.Module("lib")
    (isa.FunctionBuilder("k", module=m).library(path)
        .memref("a", F32, direction="input").memref("out", F32, direction="output").build())
    with pytest.raises(isa.ISAError, match=message):
        isa.compile(m)


# --- the verifier ------------------------------------------------------------------------------


def orchestration(build) -> isa.FunctionBuilder:
    f = (isa.FunctionBuilder("o").not_in_core().memref("x", F32).scalar("n", pto.INT64)
         .scalar_var("s", pto.INT64).tensor("t", F32).tensor("u", pto.FLOAT64))
    return build(f)


@pytest.mark.parametrize("build, message", [
    (lambda f: f.for_loop("i", 0, "n").alloc("t", ("n",)).end_for().call("g", {"a": "t"}),
     r"local tensor %t is used before its binding or outside the block that binds it"),
    (lambda f: f.alloc("t", ("n",)).alloc("t", ("n",)).call("g", {"a": "t"}),
     r"%t = ALLOC \[%n\]: local tensor %t is already bound"),
    (lambda f: f.view("u", "x", (None,)).call("g", {"a": "u"}), r"%x is FLOAT32 but %u is FLOAT64"),
    (lambda f: f.alloc("x", ("n",)), r"%x is not a local tensor of @o"),
    (lambda f: f.alloc("t", ()).call("g", {"a": "t"}), r"an allocation has 1 to 4 dims"),
    (lambda f: f.alloc("t", ("n",), owner="n").call("g", {"a": "t"}), r"ALLOC \[%n\] OWNER %n: %n is"),
    (lambda f: f.alloc("t", ("n",), owner="u").call("g", {"a": "t"}),
     r"local tensor %u is used before its binding"),
    (lambda f: f.view("t", "x", ((0, 1.5),)).call("g", {"a": "t"}), r"1.5 is not an integer"),
    (lambda f: f.for_loop("i", 0, "n", rows="r").end_for().call("g", {"a": "x"}),
     r"rows=%r is the tile rows of a loop with tile_levels"),
    (lambda f: f.for_loop("i", 0, "n", max_range=64, tile_levels={0: 8, 8: 24}).end_for()
     .call("g", {"a": "x"}),
     r"tile_levels rows 24 for block size 8 is not the base tile \(8 rows\) times a power of two"),
    (lambda f: f.for_loop("i", 0, "n", max_range=64, min_range=2, tile_levels={0: 1, 2: 4}).end_for()
     .call("g", {"a": "x"}), r"tile_levels rows 4 for block size 2 .* divides the block"),
])
def test_the_verifier_refuses_misused_local_tensors_and_adaptive_loops(build, message):
    with pytest.raises(isa.ISAError, match=message):
        orchestration(build).build()


def test_the_verifier_refuses_misplaced_library_and_tensor_statements():
    with pytest.raises(isa.ISAError, match=r"a library function is a declaration: no body"):
        (isa.FunctionBuilder("k").library("a.b").memref("m", F32, direction="input")
            .tile("t", 8, 8, F32).load("t", "m").build())
    with pytest.raises(isa.ISAError, match=r"memrefs have no shape .* and a declared direction"):
        isa.FunctionBuilder("k").library("a.b").memref("m", F32).build()
    with pytest.raises(isa.ISAError, match=r"only a library function declares them"):
        (isa.FunctionBuilder("k").memref("m", F32, (8, 8), direction="input").tile("t", 8, 8, F32)
            .load("t", "m").build())
    with pytest.raises(isa.ISAError, match=r"axis 2 is not an integer in \[0, 2\)"):  # InCore: 2-d
        (isa.FunctionBuilder("k").memref("m", F32, (8, 8)).scalar_var("s", pto.INT64).tile("t", 8, 8, F32)
            .scalar_dim("s", "m", 2).load("t", "m").build())
    m = isa.Module("m")
    isa.FunctionBuilder("lib", module=m).library("a.b").memref("m", F32, direction="input").build()
    with pytest.raises(isa.ISAError, match=r"@lib is a library kernel, which has no body to inline"):
        (isa.FunctionBuilder("k", module=m).memref("m", F32, (8, 8)).call("lib", {"m": "m"}).build())
    with pytest.raises(isa.ISAError, match=r"windows scaled by two adaptive loops \(%i, %j\)"):
        (isa.FunctionBuilder("o", module=bump_module()).not_in_core().memref("d", F32)
            .for_loop("i", 0, 4, max_range=8, tile_levels={0: 8})
            .for_loop("j", 0, 4, max_range=8, tile_levels={0: 8})
            .call("two", {"a": ("d", "i", 0), "b": ("d", "j", 0)})
            .end_for().end_for().build())


def test_levels_of_an_expansion():
    loop = bump_module(LEVELS, "r").functions["bump_all"].body[0]
    assert expansion(loop) == (Level(64, 2, 16), Level(32, 2, 16), Level(16, 2, 16), Level(8, 2, 16),
                               Level(0, 1, 8))


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_arrays_of_another_dtype_than_their_memref_are_refused_by_name(bump, compiled):
    run = bump.orchestration("bump_all", compiled=compiled)
    with pytest.raises(isa.ISAError, match=r"@bump_all: %data is FLOAT32, but its array is FLOAT64"):
        pto.Runtime(executor="serial").run(run, np.zeros((8, COLS)), 1)
    with pytest.raises(isa.ISAError, match=r"@bump_all takes 1 arrays and 1 scalars \(data, n\), got 1"):
        pto.Runtime(executor="serial").run(run, np.zeros((8, COLS), np.float32))


# --- what a review found: each a case the two back ends, or the verifier, got wrong -----------


def counting(loop_start: str) -> isa.Module:
    """A max_range loop whose start scalar the body changes: the loop must not notice."""
    m = isa.parse(PROGRAM)
    (isa.FunctionBuilder("moving_start", module=m).not_in_core()
        .memref("x", F32).memref("y", F32).scalar("n", pto.INT64)
        .scalar_var("s", pto.INT64).scalar_var("stop", pto.INT64).tensor("xr", F32).tensor("yr", F32)
        .scalar_li("s", 0)
        .for_loop("i", loop_start, "n", 1, max_range=8)
        .scalar_add("stop", "i", 1)
        .view("xr", "x", (("i", "stop"), None)).view("yr", "y", (("i", "stop"), None))
        .call("copy", {"a": "xr", "out": "yr"}).scalar_add("s", "s", 1)
        .end_for()
        .build())
    return m


def test_a_loop_reads_its_start_once_interpreted_and_compiled():
    program = isa.compile(counting("s"))
    rows = []
    for compiled in (False, True):
        x = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
        result = pto.Runtime(executor="serial").run(program.orchestration("moving_start", compiled=compiled),
                                                    x, np.zeros_like(x), 4, record=True)
        rows.append([t.params[0].value.byte_offset // 16 for t in result.graph.tasks])
    assert rows == [[0, 1, 2, 3]] * 2


def test_a_compiled_loop_frees_more_allocations_than_a_scope_holds():
    program = isa.compile(isa.parse(PROGRAM))
    x = np.ones((5000, 4), np.float32)  # 5000 one-row tiles: one allocation each
    for compiled in (False, True):
        result = pto.Runtime(executor="dry").run(program.orchestration("tiles", compiled=compiled),
                                                 x, np.zeros_like(x), 1)
        assert result.num_tasks == 10_000


@pytest.mark.parametrize("build, message", [
    (lambda f: f.for_loop("i", 0, "n", 2, max_range=64, tile_levels={0: 8, 8: 16}),
     r"a loop with tile_levels steps by 1 .* not 2"),
    (lambda f: f.for_loop("i", 0, "n", 1, max_range=64, min_range=2, tile_levels={0: 16, 2: 8}),
     r"tile_levels rows 16 for the residual \(0\) is not the base tile \(8 rows\)"),
    (lambda f: f.for_loop("i", 0, "n", 1, max_range=64, tile_levels={0: 8, 8: 16})
     .call("bump", {"data": ("d", 0, "i")}),
     r"a window's column is indexed by an adaptive loop variable"),
])
def test_the_verifier_refuses_adaptive_loops_that_would_miss_tiles(build, message):
    f = isa.FunctionBuilder("o", module=bump_module()).not_in_core().memref("d", F32)
    f = build(f.scalar("n", pto.INT64))
    with pytest.raises(isa.ISAError, match=message):
        f.end_for().build()


def adaptive_calls(*calls, extra=None) -> isa.Module:
    """bump_module plus @acc (data += src, 8 x COLS) and an adaptive loop making `calls`."""
    m = bump_module()
    (isa.FunctionBuilder("acc", module=m).in_core()
        .memref("data", F32, (8, COLS)).memref("src", F32, (8, COLS))
        .tile("t", 8, COLS, F32).tile("u", 8, COLS, F32)
        .load("t", "data").load("u", "src").add("t", "t", "u").store("data", "t")
        .build())
    if extra is not None:
        extra(m)
    f = isa.FunctionBuilder("o", module=m).not_in_core()
    tensors = {arg if isinstance(arg, str) else arg[0] for _, args in calls for arg in args.values()}
    for tensor in sorted(tensors):
        f.memref(tensor, F32)
    f.scalar("n", pto.INT64).for_loop("i", 0, "n", 1, max_range=64, min_range=8, tile_levels={0: 8, 8: 16})
    for callee, args in calls:
        f.call(callee, args)
    f.end_for().build()
    return m


@pytest.mark.parametrize("module, message", [
    (lambda: adaptive_calls(("acc", {"data": ("d", "i", 0), "src": ("e", "i", 0)}),
                            ("acc", {"data": ("d", "i", 0), "src": "e"})),
     r"another call of @acc in an adaptive loop windows \(%data, %src\), this one \(%data\)"),
    (lambda: adaptive_calls(("acc", {"data": ("d", "i", 0), "src": "e"})),
     r"cannot make @acc_16 by scaling @acc: TLOAD %u, %src.* moves a tile of the scaled rows"),
    (lambda: adaptive_calls(("bump_twice", {"data": ("d", "i", 0)}), extra=lambda m: (
        isa.FunctionBuilder("bump_twice", module=m).memref("data", F32, (8, COLS))
        .call("bump", {"data": "data"}).call("bump", {"data": "data"}).build())),
     r"cannot make @bump_twice_16 .*passes a windowed memref on"),
    (lambda: adaptive_calls(("bump", {"data": ("d", "i", 0)}), extra=lambda m: (
        isa.FunctionBuilder("bump_16", module=m).memref("data", F32, (8, COLS)).tile("t", 8, COLS, F32)
        .load("t", "data").store("data", "t").build())),
     r"@bump_16, a variant of @bump for 2x its tile rows, must be .* \(%data 16x16\)"),
])
def test_variants_that_would_compute_the_wrong_rows_are_refused(module, message):
    with pytest.raises(isa.ISAError, match=message):
        isa.compile(module())


def test_a_library_declaration_with_a_wrong_direction_is_refused():
    m = isa.Module("lib")
    (isa.FunctionBuilder("rope", module=m).library("pto_gpu.kernels.llm.rope")
        .memref("x", F32, direction="input").scalar("first_position", pto.INT64).scalar("heads", pto.INT64)
        .build())
    with pytest.raises(isa.ISAError, match=r"declares directions \(input\), but the kernel's are \(inout\)"):
        isa.compile(m)


@pytest.mark.parametrize("a, b", [(1.0, float("nan")), (float("nan"), 1.0), (2.0, -3.0)])
def test_smin_and_smax_agree_everywhere_nan_included(a, b):
    m = isa.Module("minmax")
    (isa.FunctionBuilder("scale", module=m).library("pto_gpu.kernels.elementwise.scale")
        .memref("a", F32, direction="input").memref("out", F32, direction="output")
        .scalar("factor", pto.FLOAT64).build())
    (isa.FunctionBuilder("o", module=m).not_in_core().memref("x", F32).memref("y", F32)
        .scalar("a", pto.FLOAT64).scalar("b", pto.FLOAT64)
        .scalar_var("lo", pto.FLOAT64).scalar_var("hi", pto.FLOAT64)
        .scalar_min("lo", "a", "b").scalar_max("hi", "a", "b")
        .call("scale", {"a": "x", "out": "y"}, scalars={"factor": "lo"})
        .call("scale", {"a": "x", "out": "y"}, scalars={"factor": "hi"})
        .build())
    program = isa.compile(m)
    factors = []
    for compiled in (False, True):
        x = np.ones((2, 2), np.float32)
        run = program.orchestration("o", compiled=compiled)
        result = pto.Runtime(executor="dry").run(run, x, x.copy(), a, b, record=True)
        factors.append([repr(t.params[2].value) for t in result.graph.tasks])
    assert factors[0] == factors[1] == [repr(a if a < b else b), repr(a if a > b else b)]
