"""Random float16 attention blocks kept in whole rows, against the interpreter.

In a 16-bit tensor-core kernel, a group of tiles that reduces rows (TROWMAX, TROWSUM,
TROWMIN) or hands a product its a is kept in registers in whole rows, a warp a band of 16
rows, one-column tiles a row's value in its group's lanes (Generator._fragments,
_in_registers, _groups: FlashAttention-2's form). Each program here is a FlashAttention-2
block drawn at random from what decides and exercises that choice:

- tile rows 16, 20, 40 (37 valid), 48 or 144 (nine bands: more than one a warp), sometimes
  fewer rows valid in the arrays than the tiles hold; keys a block 16, 32, 48 or 64, sometimes
  fewer valid (a block partly past the keys); head dim d 16, 32 or 40 (a partial step of k);
- s = q·kᵀ through TLOAD k and TTRANS, or k loaded already transposed; then TMULS or TADDS on s,
  or neither; a causal mask under an IF on a flag (rows q_start.., keys k_start..);
- the row max into a one-column tile (or with a loaded one, stored back), TROWEXPANDSUB, TEXP,
  the row sum (into its tile, or a TFILLed one plus a part), sometimes a TROWMIN stored;
- o = p·v, or o loaded and p·v accumulated; the keys in one block, or in a FOR over blocks
  (online softmax: factor = exp(old max - new max), the sum and o rescaled by it, o += p·v),
  with the first block before the loop or the loop from a TFILLed max of -inf; then o divided
  by the row sum, or not; o and the one-column tiles stored;
- sometimes: a loaded bias added to s, p stored, TROWMIN of s (-inf in masked rows) rather
  than of p, o scaled by a loaded one-column tile (a ROW_EXPAND's b in shared memory), the
  loop's p·v under an IF on a second flag.

(Every tile declared is used and every value read: g++ -Werror refuses the generated code
otherwise, whole rows or not. 144 x 64 scores at d 40 are left out: over a block's shared
memory, the generator refuses them, as it did before whole rows.)

All programs are built into one library by g++ (pto_isa.cuh: every thread a fiber) and run on
the host, each compared with the interpreter.

Tolerance. Inputs are uniform in [-1, 1], so |s| <= d <= 40 (in practice below ~10) and exp
stays finite. The interpreter rounds every instruction to float16; the kernel keeps float in
registers from the product to the store (p is rounded to float16 once, as p·v's a). The
differences are dominated by the rounding of s and of s - max in the interpreter: an error
of at most 2^-11 |s - max| in an exponent whose terms matter (s - max > -8) is a relative
error of at most ~2^-8 in p; o, the row sum, and the row max are sums or averages of such
terms (rounded once more on the way out), so each output may differ by a few units of 2^-11
relative to its largest element. atol = 16 * 2^-11 * max|expected| per output allows eight
such errors in the same direction on the largest value. Measured on ~900 programs of other
seeds: at most 0.34 of it.

p itself (stored, or its row min) is compared element by element, each to its own size: the
interpreter's exponent s - max is off by at most 2^-11 (|s| + |s - max|) plus a rounding or
two of TMULS/TADDS, where |s| < 16 here and |s - max| < 17 for any p that float16 does not
round to zero (exp(-17) is below its smallest subnormal), so rtol = 48 * 2^-11, with atol =
2^-14 for values float16 holds as subnormals. Measured likewise: at most 0.27 of it.
"""

import math
import random
import re
import shutil

import host_cuda
import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu.isa import interpret
from pto_gpu.isa.builder import FunctionBuilder
from pto_gpu.isa.cuda_codegen import cuda_code
from pto_gpu.isa.ir import Module

F16 = pto.FLOAT16
I64 = pto.INT64
PROGRAMS = 48
TOLERANCE = 16 * 2.0**-11  # of each output's largest magnitude
P_RTOL, P_ATOL = 48 * 2.0**-11, 2.0**-14  # each element of p, or of p's row min (see above)


def _whole_rows(source: str) -> bool:
    """Whether a generated kernel keeps tiles in whole rows: a product's a in registers, or a
    one-column tile as its rows' values."""
    return "pto_a[kb]" in source or re.search(r"float pto_frag_\w+\[\d+\]\[2\]", source) is not None


def _program(module: Module, name: str, rng: random.Random) -> dict:
    """A random attention block @name in `module`; what calling it needs."""
    rows = rng.choice([16, 20, 40, 48, 144])
    valid_rows = 37 if rows == 40 else rows - (rng.randint(1, min(9, rows - 1)) if rng.random() < 0.25 else 0)
    d = rng.choice([16, 32, 40])
    # 144 x 64 scores at d 40 are over a block's shared memory whichever way they are kept
    # (refused by the generator, as before whole rows)
    keys = rng.choice([16, 32, 48] if (rows, d) == (144, 40) else [16, 32, 48, 64])
    mode = rng.choice(["one block", "one block", "first block, then a loop", "loop from a fill"])
    blocks = 1 if mode == "one block" else rng.choice([2, 3])
    # valid keys: all of the blocks, or fewer (the last block partly past them)
    valid_keys = blocks * keys - (rng.randint(1, keys - 1) if rng.random() < 0.35 else 0)
    k_transposed = rng.random() < 0.35  # k loaded as kᵀ (d x keys): no TTRANS
    scale = rng.choice(["", "muls", "adds", "muls"])
    causal = rng.random() < 0.5
    with_m = rng.random() < 0.4  # the row max of a loaded m too, stored back to it
    sum_form = rng.choice(["rowsum", "fill + part"])
    row_min = rng.choice(["", "", "p", "s"])  # p's row min stored, or s's before the max (-inf where masked)
    bias = rng.random() < 0.2  # a loaded bias added to s (a tile of s's shape beside it)
    store_p = rng.random() < 0.2  # p stored (a TSTORE of a tile in whole rows, past its valid keys)
    weigh = rng.random() < 0.2  # o scaled by a loaded one-column tile (a ROW_EXPAND's b in shared memory)
    skip = rng.random() < 0.15  # the loop's p·v under an IF on a second flag
    o_loaded = rng.random() < 0.35  # o loaded and p·v accumulated into it
    divide = rng.random() < 0.7  # o / l at the end
    store_l = rng.random() < 0.5 or not divide  # l used (g++ -Werror refuses a value set, never read)
    if mode == "loop from a fill" and valid_rows < rows:
        o_loaded = True  # a TFILLed o holds every row; the factor only the valid ones
    first_col = 0 if mode == "loop from a fill" else keys

    memrefs = {"q": (rows, d)}
    memrefs["k"] = (d, blocks * keys) if k_transposed else (blocks * keys, d)
    memrefs["v"] = (blocks * keys, d)
    memrefs["out"] = (rows, d)
    if with_m:
        memrefs["m"] = (rows, 1)
    if o_loaded:
        memrefs["o_in"] = (rows, d)
    if store_l:
        memrefs["l_out"] = (rows, 1)
    if row_min:
        memrefs["mn_out"] = (rows, 1)
    if bias:
        memrefs["bias"] = (rows, blocks * keys)
    if store_p:
        memrefs["p_out"] = (rows, blocks * keys)
    if weigh:
        memrefs["w"] = (rows, 1)
    arrays = {"q": (valid_rows, d), "k": (d, valid_keys) if k_transposed else (valid_keys, d),
              "v": (valid_keys, d), "out": (valid_rows, d), "m": (valid_rows, 1),
              "o_in": (valid_rows, d), "l_out": (valid_rows, 1), "mn_out": (valid_rows, 1),
              "bias": (valid_rows, valid_keys), "p_out": (valid_rows, valid_keys), "w": (valid_rows, 1)}

    f = FunctionBuilder(name, module=module).in_core()
    for memref, shape in memrefs.items():
        f.memref(memref, F16, shape)
    f.scalar("flag", I64).scalar("q_start", I64).scalar("k_start", I64).scalar("flag2", I64)
    f.scalar_var("kcol", I64)
    f.tile("tq", rows, d, F16).tile("kt", d, keys, F16).tile("tv", keys, d, F16)
    f.tile("s", rows, keys, F16).tile("o", rows, d, F16)
    if not k_transposed:
        f.tile("tk", keys, d, F16)
    if bias:
        f.tile("tb", rows, keys, F16)
    if weigh:
        f.tile("tw", rows, 1, F16)
    columns = ["mx", "l"]
    columns += ["part"] if with_m or sum_form != "rowsum" or mode != "one block" else []
    columns += ["newmax", "factor"] if mode != "one block" else []
    columns += ["mn"] if row_min else []
    for column in columns:  # only those used: g++ -Werror refuses an unused tile's declaration
        f.tile(column, rows, 1, F16)
    scale_value = rng.choice([0.125, 0.25, 0.5]) if scale == "muls" else rng.choice([-0.5, 0.75])

    def scores(offset):
        """s = q·kᵀ of the keys from `offset`, scaled and masked as drawn (the mask's column:
        k_start + offset)."""
        if k_transposed:
            f.load("kt", "k", 0, offset)
        else:
            f.load("tk", "k", offset, 0).trans("kt", "tk")
        f.matmul("s", "tq", "kt")
        if scale == "muls":
            f.muls("s", "s", scale_value)
        elif scale == "adds":
            f.adds("s", "s", scale_value)
        if bias:
            f.load("tb", "bias", 0, offset).add("s", "s", "tb")
        if causal:
            f.scalar_add("kcol", "k_start", offset)
            f.if_then("flag", "ne", 0).causal_mask("s", "s", "q_start", "kcol").end_if()

    def row_min_of(stage, offset):
        if row_min == stage:
            f.rowmin("mn", "s").store("mn_out", "mn")
        if stage == "p" and store_p:
            f.store("p_out", "s", 0, offset)

    f.load("tq", "q")
    if mode != "loop from a fill":  # the first block, outside any loop
        scores(0)
        row_min_of("s", 0)
        if with_m:
            f.load("mx", "m").rowmax("part", "s").max("mx", "mx", "part").store("m", "mx")
        else:
            f.rowmax("mx", "s")
        f.rowexpandsub("s", "s", "mx").exp("s", "s")
        if sum_form == "rowsum":
            f.rowsum("l", "s")
        else:
            f.fill("l", rng.choice([0.0, 1.0])).rowsum("part", "s").add("l", "part", "l")
        row_min_of("p", 0)
        f.load("tv", "v")
        if o_loaded:
            f.load("o", "o_in").matmul_acc("o", "s", "tv")
        else:
            f.matmul("o", "s", "tv")
    else:  # the running max, sum and output before the first block
        if with_m:
            f.load("mx", "m")
        else:
            f.fill("mx", -math.inf)
        f.fill("l", rng.choice([0.0, 1.0]))
        if o_loaded:
            f.load("o", "o_in")
        else:
            f.fill("o", 0.0)
    if mode != "one block":  # online softmax over the other blocks
        exact_rows = with_m or mode != "loop from a fill"  # mx holds only the valid rows
        f.for_loop("kk", first_col, blocks * keys, keys)
        scores("kk")
        row_min_of("s", "kk")
        f.rowmax("part", "s").max("newmax", "part", "mx")
        if exact_rows and rng.random() < 0.5:
            f.sub("factor", "mx", "newmax")
        else:  # mx may hold more rows than newmax: read newmax's
            f.sub("factor", "newmax", "mx").neg("factor", "factor")
        f.exp("factor", "factor")
        f.rowexpandsub("s", "s", "newmax").exp("s", "s").rowsum("part", "s")
        f.mul("l", "factor", "l").add("l", "part", "l")
        row_min_of("p", "kk")
        f.rowexpandmul("o", "o", "factor").load("tv", "v", "kk", 0)
        if skip:
            f.if_then("flag2", "ne", 0).matmul_acc("o", "s", "tv").end_if()
        else:
            f.matmul_acc("o", "s", "tv")
        f.muls("mx", "newmax", 1.0)
        f.end_for()
        if with_m:
            f.store("m", "mx")
    if weigh:
        f.load("tw", "w").rowexpandmul("o", "o", "tw")
    if divide:
        f.rowexpanddiv("o", "o", "l")
    f.store("out", "o")
    if store_l:
        f.store("l_out", "l")
    f.build()

    k_start = rng.randint(0, 8)
    q_start = k_start + rng.choice([0, 0, 1, 5, rng.randint(0, keys)])
    return dict(memrefs=memrefs, arrays={memref: arrays[memref] for memref in memrefs},
                scalars=(rng.choice([0, 1, 1]), q_start, k_start, rng.choice([0, 1])),
                drawn=dict(rows=rows, valid_rows=valid_rows, keys=keys, valid_keys=valid_keys, d=d, mode=mode,
                           blocks=blocks, k_transposed=k_transposed, scale=scale, causal=causal,
                           with_m=with_m,
                           sum_form=sum_form, row_min=row_min, o_loaded=o_loaded, divide=divide,
                           bias=bias, store_p=store_p, weigh=weigh, skip=skip))


OUTPUTS = ("out", "m", "l_out", "mn_out", "p_out")


def _inputs(case: dict, seed: int) -> list[np.ndarray]:
    """Uniform values in [-1, 1] in the inputs (m too), NaN in what is only written."""
    rng = np.random.default_rng(seed)
    arrays = []
    for memref, shape in case["arrays"].items():
        if memref in ("out", "l_out", "mn_out", "p_out"):
            arrays.append(np.full(shape, np.nan, np.float16))
        else:
            arrays.append(rng.uniform(-1, 1, shape).astype(np.float16))
    return arrays


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """PROGRAMS random programs, their CUDA sources in one library built by g++."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    rng = random.Random(1729)
    module = Module("whole_rows_fuzz")
    cases = {f"w{i}": _program(module, f"w{i}", rng) for i in range(PROGRAMS)}
    folder = tmp_path_factory.mktemp("whole-rows-fuzz")
    codes = {name: cuda_code(module, name, folder) for name in cases}
    return module, cases, codes, host_cuda.build_all(codes.values(), np.float16, folder)


def _run(programs, index: int):
    """(the interpreter's arrays, the kernel's) for program `index`."""
    module, cases, codes, library = programs
    name = f"w{index}"
    case = cases[name]
    expected = _inputs(case, index)
    got = [a.copy() for a in expected]
    interpret.run(module, name, *expected, *case["scalars"])
    host_cuda.call(library, name, codes[name], got, case["scalars"])
    return expected, got


def test_most_programs_take_whole_rows(programs):
    """The sample is worth its time: most programs keep tiles in whole rows, among them a
    product's a in registers, one-column tiles as rows' values, and tiles two bands a warp."""
    _, cases, codes, _ = programs
    sources = {name: code.source.read_text() for name, code in codes.items()}
    whole = [name for name, source in sources.items() if _whole_rows(source)]
    assert len(whole) >= 0.75 * len(cases), f"{len(whole)} of {len(cases)} take whole rows"
    together = "".join(sources[name] for name in whole)
    assert "pto_a[kb]" in together and re.search(r"float pto_frag_\w+\[\d+\]\[2\]", together)
    assert any(cases[name]["drawn"]["rows"] == 144 for name in whole)
    assert any(cases[name]["drawn"]["mode"] != "one block" for name in whole)


@pytest.mark.parametrize("index", range(PROGRAMS))
def test_a_random_whole_rows_program_equals_the_interpreter(programs, index):
    module, cases, _, _ = programs
    name = f"w{index}"
    expected, got = _run(programs, index)
    for memref, want, have in zip(module.functions[name].memrefs, expected, got):
        if memref.name not in OUTPUTS:
            continue
        want64, have64 = want.astype(np.float64), have.astype(np.float64)
        where = f"{name}: {memref.name} ({cases[name]['drawn']})"
        finite = np.isfinite(want64)  # s's row min is -inf in a masked row; nothing else is not finite
        assert memref.name == "mn_out" or finite.all(), f"{where}: the interpreter's result is not finite"
        np.testing.assert_array_equal(have64[~finite], want64[~finite], err_msg=where)
        if memref.name == "p_out" or (memref.name == "mn_out" and cases[name]["drawn"]["row_min"] == "p"):
            np.testing.assert_allclose(have64, want64, rtol=P_RTOL, atol=P_ATOL, err_msg=where)
            continue
        scale = np.abs(want64[finite]).max(initial=0.0)
        np.testing.assert_allclose(have64[finite], want64[finite], rtol=0, atol=TOLERANCE * scale,
                                   err_msg=where)
