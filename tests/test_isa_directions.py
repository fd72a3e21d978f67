"""Direction inference through views of views (pto_gpu/isa/dataflow.py): a memref an Orchestration
reaches only through a chain of VIEWs and SPLITs (of any length, bound in any block) takes the
direction of what the calls do with the chain's end, exactly as if it were passed itself; uses
through several chains of one root add up (a load through one and a store through another is
inout). The calls may window the chain's end into an InCore function that windows its memref
again into another (windows of windows), or pass it whole to an Orchestration that views its
memref further, or to a library kernel. Programs are generated from a list of uses, each with
the direction computed here from the callee's access alone (never by the verifier's helpers),
and the consequence a user sees is checked too: the ParamKind each task is submitted with, and
the memrefs `pto-gpu run FILE.pto` reports as written."""

import dataclasses
import itertools
import random

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu import cli, isa
from pto_gpu.isa import Direction, FunctionBuilder, ISAError, Module, directions, verify_module

F32 = pto.FLOAT32
ROWS, COLS = 8, 64  # the tile (and memref shape) of the innermost kernels

ACCESSES = ("load", "store", "both")
READ, WRITE = 1, 2
BITS = {"load": READ, "store": WRITE, "both": READ | WRITE}  # what each kernel does to its memref
DIRECTION = {READ: Direction.INPUT, WRITE: Direction.OUTPUT, READ | WRITE: Direction.INOUT}
PARAM_KIND = {Direction.INPUT: pto.ParamKind.INPUT, Direction.OUTPUT: pto.ParamKind.OUTPUT,
              Direction.INOUT: pto.ParamKind.INOUT}

# How a use reaches the kernel that loads and/or stores (the chain's end is `v`):
#   task     CALL @k(v[r, c]): an InCore task on a window
#   whole    CALL @k(v): the InCore task on v cut to the memref's shape
#   incore   CALL @w1(v[r, c]), @w1 windows its memref into @k: a window of a window
#   incore2  CALL @w2(v[r, c]), @w2 -> @w1 -> @k, three windows deep
#   orch     CALL @o1(v), an Orchestration that views its memref twice more and windows it into @k
#   orch2    CALL @o2(v), an Orchestration that views its memref once and passes that to @o1
#   library  CALL @lib(v), a library kernel with declared directions
VIAS = ("task", "whole", "incore", "incore2", "orch", "orch2", "library")
# Where a use's statements go: at the top, in a FOR, in an IF's then or else branch, or the
# chain's first link at the top and the rest (and the call) in a FOR: a view of a view bound
# in an outer block.
PLACES = ("top", "loop", "then", "else", "straddle")


@dataclasses.dataclass(frozen=True)
class Use:
    """One use of a root memref of @main: a chain of `links` ("view" or "split") from it, the
    chain's end passed `via` a call to a kernel that does `access` to it, placed at `place`."""

    root: str
    access: str
    links: tuple[str, ...] = ()
    via: str = "task"
    place: str = "top"


def expected(uses: list[Use], bystander: bool = True) -> dict[str, Direction]:
    """The direction of every root, in declaration order: the union of its uses' accesses."""
    bits: dict[str, int] = {}
    for use in uses:
        bits[use.root] = bits.get(use.root, 0) | BITS[use.access]
    flows = {root: DIRECTION[b] for root, b in bits.items()}
    if bystander:
        flows["keep"] = Direction.INPUT
    return flows


# the callees


def kernel(m: Module, access: str) -> str:
    """@k_<access>: one ROWS x COLS memref %a that it loads, stores, or loads then stores."""
    name = f"k_{access}"
    if name not in m.functions:
        b = FunctionBuilder(name, module=m).in_core().memref("a", F32, (ROWS, COLS))
        b.tile("t", ROWS, COLS, F32)
        if access == "store":
            b.fill("t", 1.0)
        else:
            b.load("t", "a")
        if access == "both":
            b.adds("t", "t", 1.0)
        if access != "load":
            b.store("a", "t")
        b.build()
    return name


def callee(m: Module, via: str, access: str) -> tuple[str, str, bool]:
    """The function a use calls (made once per module), its memref parameter, and whether the
    call passes it a window."""
    if via in ("task", "whole"):
        return kernel(m, access), "a", via == "task"
    if via == "library":
        name = f"lib_{access}"
        if name not in m.functions:
            flow = DIRECTION[BITS[access]]
            (FunctionBuilder(name, module=m).in_core().library("tests.nowhere.kernel")
                .memref("a", F32, direction=flow).build())
        return name, "a", False
    if via == "incore":  # (2R, 2C) windowed at (1, 1) into @k
        name = f"w1_{access}"
        if name not in m.functions:
            inner = kernel(m, access)
            (FunctionBuilder(name, module=m).in_core().memref("w", F32, (2 * ROWS, 2 * COLS))
                .call(inner, {"a": ("w", 1, 1)}).build())
        return name, "w", True
    if via == "incore2":  # (4R, 4C) windowed at (1, 0) into @w1
        name = f"w2_{access}"
        if name not in m.functions:
            inner, _, _ = callee(m, "incore", access)
            (FunctionBuilder(name, module=m).in_core().memref("w", F32, (4 * ROWS, 4 * COLS))
                .call(inner, {"w": ("w", 1, 0)}).build())
        return name, "w", True
    if via == "orch":  # p -> q1 -> q2, q2[1, 0] into @k
        name = f"o1_{access}"
        if name not in m.functions:
            inner = kernel(m, access)
            (FunctionBuilder(name, module=m).not_in_core().memref("p", F32)
                .tensor("q1", F32).tensor("q2", F32)
                .view("q1", "p", ((0, 6 * ROWS), None)).view("q2", "q1", (None, (0, 2 * COLS)))
                .call(inner, {"a": ("q2", 1, 0)}).build())
        return name, "p", False
    if via == "orch2":  # p -> q, q whole into @o1
        name = f"o2_{access}"
        if name not in m.functions:
            inner, _, _ = callee(m, "orch", access)
            (FunctionBuilder(name, module=m).not_in_core().memref("p", F32).tensor("q", F32)
                .view("q", "p", ((ROWS, 8 * ROWS), None)).call(inner, {"p": "q"}).build())
        return name, "p", False
    raise AssertionError(via)


def callee_directions(via: str, access: str) -> dict[str, dict[str, Direction]]:
    """What every function a use calls must infer for its memref."""
    flow = DIRECTION[BITS[access]]
    chain = {"task": ["k"], "whole": ["k"], "incore": ["w1", "k"], "incore2": ["w2", "w1", "k"],
             "orch": ["o1", "k"], "orch2": ["o2", "o1", "k"], "library": ["lib"]}[via]
    params = {"k": "a", "lib": "a", "w1": "w", "w2": "w", "o1": "p", "o2": "p"}
    return {f"{prefix}_{access}": {params[prefix]: flow} for prefix in chain}


# the program


def program(uses: list[Use], bystander: bool = True) -> Module:
    """A module whose Orchestration @main takes each use's root (in order of first use), plus
    a memref %keep it only loads (when `bystander`), and makes the uses in order."""
    m = Module("directions")
    roots = list(dict.fromkeys(use.root for use in uses))
    b = FunctionBuilder("main", module=m).not_in_core()
    for root in roots:
        b.memref(root, F32)
    if bystander:
        b.memref("keep", F32).call(kernel(m, "load"), {"a": ("keep", 0, 0)})
    for i, use in enumerate(uses):
        emit(m, b, i, use)
    b.build()
    return m


def emit(m: Module, b: FunctionBuilder, i: int, use: Use) -> None:
    """Use number `i`: its chain's tensors %<root><i>_<k>, then its call, placed as it says."""
    var = f"i{i}"
    row: str | int = var if use.place in ("loop", "straddle") else 1
    links = list(use.links)
    source, dims = use.root, 2
    if use.place == "loop" or (use.place == "straddle" and not links):
        b.for_loop(var, 0, 2)
    elif use.place == "then":
        b.if_then(0, "eq", 0)
    elif use.place == "else":
        b.if_then(0, "ne", 0).else_()
    for k, link in enumerate(links):
        tensor = f"{use.root}{i}_{k}"
        b.tensor(tensor, F32)
        if link == "split":
            b.split(tensor, source, 2)
            dims = 3
        else:  # rows 0:6R (cut at the edge), then one more dim of columns at each deeper link
            b.view(tensor, source, (None,) * (dims - 2) + ((0, 6 * ROWS), (0, (6 - k) * COLS)))
        source = tensor
        if use.place == "straddle" and k == 0:
            b.for_loop(var, 0, 2)
    name, param, windowed = callee(m, use.via, use.access)
    b.call(name, {param: (source, row, 0) if windowed else source})
    if use.place in ("loop", "straddle"):
        b.end_for()
    elif use.place in ("then", "else"):
        b.end_if()


def check(uses: list[Use], bystander: bool = True) -> Module:
    """Build the program of `uses`; every function verifies and infers what the uses imply."""
    m = program(uses, bystander)
    verify_module(m)
    want = expected(uses, bystander)
    got = directions(m.functions["main"], m)
    assert list(got.items()) == list(want.items()), [str(u) for u in uses]
    for use in uses:
        for name, flows in callee_directions(use.via, use.access).items():
            assert directions(m.functions[name], m) == flows, name
    return m


# the rule, generated


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("access", ACCESSES)
@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_a_chain_gives_its_root_the_direction_of_its_use(length, access, via):
    check([Use("x", access, ("view",) * length, via)])


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("access", ACCESSES)
@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_chain_bound_in_any_block_reaches_its_root(length, access, place):
    check([Use("x", access, ("view",) * length, "task", place)])


@pytest.mark.parametrize("access", ACCESSES)
@pytest.mark.parametrize("links", [links for n in (1, 2, 3) for links in itertools.product(("view", "split"),
                                                                                              repeat=n)],
                         ids="-".join)
def test_splits_and_views_mixed_in_a_chain_reach_its_root(links, access):
    check([Use("x", access, links, "whole")])


@pytest.mark.parametrize("second_access", ACCESSES)
@pytest.mark.parametrize("first_access", ACCESSES)
@pytest.mark.parametrize("first, second", list(itertools.product([0, 1, 2, 3], repeat=2)))
def test_two_chains_of_one_root_add_up(first, second, first_access, second_access):
    # A second root with the opposite uses, so that an error on one shows as a wrong direction
    # of the other rather than only as a refused program.
    via = VIAS[(first + 2 * second) % len(VIAS)]
    check([Use("x", first_access, ("view",) * first, "task"),
           Use("y", second_access, ("view",) * first, via),
           Use("x", second_access, ("view",) * second, via, "loop"),
           Use("y", first_access, ("view",) * second, "task", "straddle" if second else "then")])


def random_uses(rng: random.Random) -> list[Use]:
    roots = ["x", "y", "z"][:rng.randint(1, 3)]
    uses = []
    for _ in range(rng.randint(1, 6)):
        length = rng.randint(0, 3)
        links = tuple(rng.choice(("view", "view", "split")) for _ in range(length))
        via = rng.choice(VIAS)
        if "split" in links and via in ("task", "incore", "incore2"):
            via = "whole"  # a window needs a 2-d tensor (the verifier does not check it; keep it honest)
        place = rng.choice(PLACES if length else PLACES[:4])
        uses.append(Use(rng.choice(roots), rng.choice(ACCESSES), links, via, place))
    return uses


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_infer_what_their_uses_imply(seed):
    rng = random.Random(seed)
    for _ in range(10):
        check(random_uses(rng), bystander=rng.random() < 0.5)


# named cases


def test_a_load_through_one_chain_and_a_store_through_another_is_inout():
    m = Module("m")
    load, store = kernel(m, "load"), kernel(m, "store")
    (FunctionBuilder("main", module=m).not_in_core()
        .memref("x", F32).memref("y", F32)
        .tensor("a", F32).tensor("b", F32).tensor("c", F32).tensor("d", F32)
        .view("a", "x", ((0, 64), None)).view("b", "a", (None, (0, 128))).view("c", "b", ((8, 32), None))
        .call(load, {"a": ("c", 0, 0)})
        .view("d", "x", ((64, 128), None))
        .call(store, {"a": "d"})
        .call(load, {"a": "y"})
        .build())
    verify_module(m)
    assert directions(m.functions["main"], m) == {"x": Direction.INOUT, "y": Direction.INPUT}


def test_branches_of_one_chain_tree_add_up_at_the_root():
    # x -> a -> b -> c: c loaded, a stored (a view of a view's source); y -> p -> q: p loaded,
    # q loaded; z -> r -> s: s stored, then in a loop a view of s (bound outside it) stored
    m = Module("m")
    load, store = kernel(m, "load"), kernel(m, "store")
    whole = (None, None)
    (FunctionBuilder("main", module=m).not_in_core()
        .memref("x", F32).memref("y", F32).memref("z", F32)
        .tensor("a", F32).tensor("b", F32).tensor("c", F32).tensor("p", F32).tensor("q", F32)
        .tensor("r", F32).tensor("s", F32).tensor("t", F32)
        .view("a", "x", whole).view("b", "a", whole).view("c", "b", whole)
        .view("p", "y", whole).view("q", "p", whole).view("r", "z", whole).view("s", "r", whole)
        .call(load, {"a": "c"}).call(store, {"a": ("a", 1, 0)})
        .call(load, {"a": "q"}).call(load, {"a": "p"})
        .call(store, {"a": "s"})
        .for_loop("i", 0, 2).view("t", "s", (("i", 16), None)).call(store, {"a": "t"}).end_for()
        .build())
    verify_module(m)
    assert directions(m.functions["main"], m) == {"x": Direction.INOUT, "y": Direction.INPUT,
                                                  "z": Direction.OUTPUT}


def test_one_call_loading_one_chain_and_storing_another_of_a_root_makes_it_inout():
    # @copy loads %src and stores %dst; one call binds both to chains of x (depths 2 and 3)
    m = Module("m")
    (FunctionBuilder("copy", module=m).in_core()
        .memref("src", F32, (ROWS, COLS)).memref("dst", F32, (ROWS, COLS)).tile("t", ROWS, COLS, F32)
        .load("t", "src").store("dst", "t").build())
    (FunctionBuilder("main", module=m).not_in_core()
        .memref("x", F32).memref("y", F32)
        .tensor("a", F32).tensor("b", F32).tensor("c", F32).tensor("d", F32).tensor("e", F32)
        .view("a", "x", ((0, 16), None)).view("b", "a", ((0, 8), None))
        .view("c", "x", ((16, 64), None)).view("d", "c", ((0, 32), None)).view("e", "d", ((0, 8), None))
        .call("copy", {"src": "b", "dst": ("e", 0, 0)})
        .call("copy", {"src": ("d", 1, 0), "dst": "y"})
        .build())
    verify_module(m)
    assert directions(m.functions["main"], m) == {"x": Direction.INOUT, "y": Direction.OUTPUT}


def test_a_chain_from_an_allocated_local_gives_no_memref_a_direction():
    m = Module("m")
    load, store, both = kernel(m, "load"), kernel(m, "store"), kernel(m, "both")
    (FunctionBuilder("main", module=m).not_in_core()
        .memref("x", F32).tensor("t", F32).tensor("u", F32).tensor("v", F32).tensor("w", F32)
        .alloc("t", (64, 64)).view("u", "t", ((0, 32), None)).view("v", "u", ((0, 8), None))
        .call(store, {"a": "v"}).call(both, {"a": ("u", 1, 0)})
        .view("w", "x", ((0, 8), None)).call(load, {"a": "w"})
        .build())
    verify_module(m)
    assert directions(m.functions["main"], m) == {"x": Direction.INPUT}


def test_a_memref_whose_chain_no_call_uses_has_no_direction():
    m = Module("m")
    load = kernel(m, "load")
    message = r"^@main: memref %y: neither passed to a call, so it has no direction"
    with pytest.raises(ISAError, match=message):
        (FunctionBuilder("main", module=m).not_in_core()
            .memref("x", F32).memref("y", F32).tensor("a", F32).tensor("b", F32)
            .view("a", "y", ((0, 8), None)).view("b", "a", ((0, 8), None))
            .call(load, {"a": "x"})
            .build())


def test_nested_orchestrations_and_windows_of_windows_reach_the_outer_root():
    # outer: x -> v1 -> v2, passed whole to @o2_store (p -> q, into @o1_store: p -> q1 -> q2,
    # q2[1, 0] into @k_store); y -> u1 -> u2 -> u3, u3[0, 1] into @w2_both (-> @w1_both -> @k_both)
    m = Module("m")
    o2, _, _ = callee(m, "orch2", "store")
    w2, _, _ = callee(m, "incore2", "both")
    (FunctionBuilder("outer", module=m).not_in_core()
        .memref("x", F32).memref("y", F32)
        .tensor("v1", F32).tensor("v2", F32).tensor("u1", F32).tensor("u2", F32).tensor("u3", F32)
        .view("v1", "x", ((0, 256), None)).view("v2", "v1", (None, (0, 256))).call(o2, {"p": "v2"})
        .view("u1", "y", ((0, 256), None)).view("u2", "u1", ((0, 128), None))
        .view("u3", "u2", ((0, 64), None))
        .call(w2, {"w": ("u3", 0, 1)})
        .build())
    verify_module(m)
    assert directions(m.functions["outer"], m) == {"x": Direction.OUTPUT, "y": Direction.INOUT}
    for via, access in (("orch2", "store"), ("incore2", "both")):
        for name, flows in callee_directions(via, access).items():
            assert directions(m.functions[name], m) == flows


def test_a_view_of_a_view_is_verified_once_the_module_is_complete():
    # verify_function before the callee exists leaves the call (its direction unknown), and the
    # completed module then infers it through the chain
    m = Module("m")
    (FunctionBuilder("main", module=m).not_in_core()
        .memref("x", F32).tensor("a", F32).tensor("b", F32)
        .view("a", "x", ((0, 64), None)).view("b", "a", ((0, 16), None))
        .call("k_store", {"a": ("b", 1, 0)})
        .build())
    kernel(m, "store")
    verify_module(m)
    assert directions(m.functions["main"], m) == {"x": Direction.OUTPUT}


# what a user sees


def runnable_uses() -> list[Use]:
    """Uses of x, y, z through 2-d views only, each a window or a whole tensor at run time."""
    return [Use("x", "load", ("view", "view"), "task"),
            Use("y", "store", ("view", "view", "view"), "incore2", "straddle"),
            Use("z", "load", ("view",), "incore", "loop"),
            Use("z", "store", ("view", "view", "view"), "orch2"),
            Use("x", "load", (), "whole", "then")]


def test_tasks_are_submitted_with_the_inferred_kinds():
    uses = runnable_uses()
    m = check(uses, bystander=False)
    program_ = isa.compile(m)
    arrays = [np.zeros((64, 512), np.float32) for _ in range(3)]
    # the interpreted orchestration (the generated one, compiled=True, takes the same directions
    # but costs a numba compilation of its own)
    result = pto.Runtime(executor="dry").run(program_.orchestration("main"), *arrays, record=True)
    tasks = [(t.kernel.name, [p.kind for p in t.params]) for t in result.graph.tasks]
    kinds = {name: [PARAM_KIND[flow] for flow in flows.values()]
             for use in uses for name, flows in callee_directions(use.via, use.access).items()}
    assert [name for name, _ in tasks] == ["k_load", "w2_store", "w2_store", "w1_load", "w1_load",
                                           "k_store", "k_load"]
    assert tasks == [(name, kinds[name]) for name, _ in tasks]


def test_pto_gpu_run_reports_the_memrefs_written_through_views(tmp_path, capsys):
    # `run FILE.pto` prints a checksum line for each memref it infers written (output or inout)
    path = tmp_path / "views.pto"
    path.write_text(isa.print_module(check(runnable_uses(), bystander=False)))
    shapes = [item for name in "xyz" for item in ("--shape", f"{name}=64x512")]
    assert cli.main(["run", str(path), "--backend", "cpu", "--executor", "serial", "--entry", "main",
                     *shapes]) == 0
    written = {line.split()[0] for line in capsys.readouterr().out.splitlines() if ": sum " in line}
    assert written == {"y", "z"}
