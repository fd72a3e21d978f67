"""Compiled orchestration (pto_gpu.jit): the same descriptors, tasks, edges and bytes as the
Python API, executing runs that wait on full rings, and clear errors from compiled code."""

import re
import threading

import numba
import numpy as np
import pytest
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import (
    flash_attention,
    flash_attention_compiled,
    flash_attention_fused,
    flash_attention_fused_compiled,
)
from pto_gpu.orchestration.llama import expected_tasks, llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import program as matmul_program
from pto_gpu.orchestration.matmul import tiled_matmul, tiled_matmul_compiled

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.core.lock import load_acquire, monotonic_ns
from pto_gpu.isa.orchestration_codegen import orchestration_source
from pto_gpu.jit import bridge, host
from pto_gpu.jit.descriptor import from_tensor, write_layout
from pto_gpu.layout import PARAM_WIDTH, ROW_WIDTH
from tests import hand_written
from tests.conftest import add_into, fill, mix


def task_signature(graph):
    """Tasks as (id, kernel, worker, params by kind and layout or value), and the edges."""
    tasks = [(t.id, t.kernel.name, int(t.worker),
              tuple((int(p.kind), tuple(p.value.layout.tolist()) if p.kind != pto.ParamKind.SCALAR
                     else p.value) for p in t.params)) for t in graph.tasks]
    return tasks, graph.edges


@pytest.mark.parametrize("seq_len", [1024, 2048])
@pytest.mark.parametrize("adaptive", [False, True])
def test_the_llama_program_interpreted_and_compiled_builds_the_hand_written_graph(seq_len, adaptive):
    inputs = llama_layer_inputs(seq_len, lazy=True)
    rt = pto.Runtime(backend="cpu", executor="dry")
    by_hand = rt.run(hand_written.llama_layer, inputs, adaptive, record=True)
    assert by_hand.num_tasks == expected_tasks(seq_len // (64 if adaptive else 32))
    for orchestration in (llama_layer, llama_layer_compiled):
        result = rt.run(orchestration, inputs, adaptive, record=True)
        assert result.num_tasks == by_hand.num_tasks and result.num_edges == by_hand.num_edges
        assert task_signature(result.graph) == task_signature(by_hand.graph)


@pytest.mark.parametrize("m, k, n, tile", [(256, 192, 128, 64), (200, 130, 70, 64)])
def test_the_matmul_program_interpreted_and_compiled_builds_the_python_graph(m, k, n, tile):
    a, b, c = np.empty((m, k), np.float32), np.empty((k, n), np.float32), np.empty((m, n), np.float32)
    rt = pto.Runtime(backend="cpu", executor="dry")
    by_hand = rt.run(tiled_matmul, a, b, c, tile, record=True)
    tiles = -(-m // tile) * -(-n // tile)
    assert by_hand.num_tasks == tiles * (2 + -(-k // tile))
    for orchestration in (matmul_program().orchestration("tiled_matmul"), tiled_matmul_compiled):
        result = rt.run(orchestration, a, b, c, tile, record=True)
        assert task_signature(result.graph) == task_signature(by_hand.graph)


def test_a_recording_run_grows_the_tensormap_under_compiled_code():
    """The pool fills while compiled code runs: a recording run grows it (new tables, which
    compiled code must then use) and records the same graph as the Python-level build."""
    inputs = llama_layer_inputs(1024, lazy=True)
    small = pto.Runtime(backend="cpu", executor="dry", tensormap_entries=64)
    result = small.run(llama_layer_compiled, inputs, True, record=True)
    assert len(small._scheduler.state.entries) > 64
    reference = pto.Runtime(backend="cpu", executor="dry").run(llama_layer, inputs, True, record=True)
    assert task_signature(result.graph) == task_signature(reference.graph)


@pytest.mark.parametrize("seq, tile, causal", [(256, 64, True), (200, 32, False), (45, 64, True)])
def test_the_flash_attention_program_builds_the_hand_written_graph(seq, tile, causal):
    q, k, v = (np.empty((4, seq, 16), np.float32) for _ in range(3))
    rt = pto.Runtime(backend="cpu", executor="dry")
    by_hand = rt.run(hand_written.flash_attention, q, k, v, np.empty_like(q), tile, causal, record=True)
    for orchestration in (flash_attention, flash_attention_compiled):
        result = rt.run(orchestration, q, k, v, np.empty_like(q), tile, causal, record=True)
        assert task_signature(result.graph) == task_signature(by_hand.graph)


@pytest.mark.parametrize("seq, tile, causal", [(256, 64, True), (45, 64, False)])
def test_the_fused_flash_attention_program_builds_the_same_graph_compiled(seq, tile, causal):
    """A task per query tile reading every key and value, writing its rows of out: no edges."""
    q, k, v = (np.empty((4, seq, 16), np.float32) for _ in range(3))
    rt = pto.Runtime(backend="cpu", executor="dry")
    python = rt.run(flash_attention_fused, q, k, v, np.empty_like(q), tile, causal, record=True)
    compiled = rt.run(flash_attention_fused_compiled, q, k, v, np.empty_like(q), tile, causal, record=True)
    assert task_signature(compiled.graph) == task_signature(python.graph)
    assert (python.num_tasks, python.num_edges) == (-(-seq // tile), 0)


def test_compiled_llama_fills_window_and_heap_and_matches_reference(executor):
    inputs = llama_layer_inputs(200, hidden=64, heads=4, ffn=96, seed=3)
    # 16 task slots and a heap of a few tiles: both rings fill many times over.
    rt = pto.Runtime(backend="cpu", executor=executor, task_window=16, heap_bytes=96 << 10)
    result = rt.run(llama_layer_compiled, inputs, adaptive=True)
    assert result.high_water["task_ring"] == 16
    assert result.high_water["heap_bytes"] > (96 << 10) // 2
    expected = reference.llama_layer(inputs)
    # Same tolerance as the Python-level orchestration's test (test_workloads.py).
    np.testing.assert_allclose(inputs["out"], expected, atol=1e-5 * np.abs(expected).max())
    python_inputs = llama_layer_inputs(200, hidden=64, heads=4, ffn=96, seed=3)
    pto.Runtime(backend="cpu", executor="serial").run(llama_layer, python_inputs, adaptive=True)
    assert inputs["out"].tobytes() == python_inputs["out"].tobytes()


def random_views(rng, count):
    """TensorDescriptors made by slicing, transposing and reshaping a few arrays."""
    rt_views = []

    def collect(o):
        for _ in range(count):
            shape = tuple(int(n) for n in rng.integers(1, 9, size=rng.integers(1, 4)))
            t = o.external(np.zeros(shape, rng.choice([np.float32, np.uint8, np.float64])))
            dim = int(rng.integers(0, t.ndim))
            start = int(rng.integers(0, t.shape[dim] + 1))
            stop = int(rng.integers(start, t.shape[dim] + 1))
            index = tuple(slice(start, stop) if d == dim else slice(None) for d in range(t.ndim))
            view = t[index]
            if view.ndim > 1 and rng.random() < 0.5:
                view = view.transpose(*rng.permutation(view.ndim))
            rt_views.append((t, view, dim, start, stop))

    pto.Runtime(backend="cpu", executor="dry").run(collect)
    return rt_views


@numba.njit(cache=True)
def _layout_of(desc):
    row = np.zeros(PARAM_WIDTH, np.int64)
    write_layout(desc, row)
    return row[:ROW_WIDTH]


@numba.njit(cache=True)
def _row_chain(o, x, add_id, first, count):
    for i in range(first, first + count):
        pj.submit(o, add_id, (pj.input(pj.narrow(x, 0, i, i + 1)), pj.inout(pj.narrow(x, 0, i + 1, i + 2))))


def test_compiled_code_follows_a_tensormap_that_python_submits_grew():
    """A recording run: compiled code, then Python submits that grow the pool (new tables),
    then compiled code again, which must use the grown tables (it waited for room for ever)."""
    def orchestration(o, out):
        x = o.external(out)
        o.compiled(_row_chain, x, add_into.id, 0, 2)
        for i in range(2, 40):
            o.submit(add_into, pto.input(x[i]), pto.inout(x[i + 1]))
        o.compiled(_row_chain, x, add_into.id, 40, 20)

    grown, roomy = np.ones((64, 4), np.float32), np.ones((64, 4), np.float32)
    small = pto.Runtime(backend="cpu", executor="serial", tensormap_entries=4)
    results = []
    runner = threading.Thread(target=lambda: results.append(small.run(orchestration, grown, record=True)),
                              daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert results, "the second compiled call never found room in the TensorMap"
    result = results[0]
    expected = pto.Runtime(backend="cpu", executor="serial").run(orchestration, roomy, record=True)
    assert len(small._scheduler.state.entries) > 64
    assert result.graph.edges == expected.graph.edges and len(result.graph.edges) == 59
    np.testing.assert_array_equal(grown, roomy)


@numba.njit(cache=True)
def _narrowed(desc, dim, start, stop):
    return pj.narrow(desc, dim, start, stop)


def test_compiled_descriptors_have_the_python_layout_rows():
    rng = np.random.default_rng(0)
    for parent, view, dim, start, stop in random_views(rng, 300):
        assert _layout_of(from_tensor(view)).tolist() == view.layout.tolist()
        narrowed = _narrowed(from_tensor(parent), dim, start, stop)
        index = tuple(slice(start, stop) if d == dim else slice(None) for d in range(parent.ndim))
        assert narrowed == from_tensor(parent[index])


@numba.njit(cache=True)
def _split_swap(desc, inner):
    return pj.swap(pj.split(desc, 1, inner), 0, 1)


def test_split_and_swap_match_reshape_and_transpose():
    def check(o):
        t = o.external(np.zeros((6, 12), np.float32))[1:5]
        assert _split_swap(from_tensor(t), 3) == from_tensor(t.reshape(4, 4, 3).transpose(1, 0, 2))

    pto.Runtime(backend="cpu", executor="dry").run(check)


@numba.njit(cache=True)
def _chain(o, x, out, fill_id, add_id, rounds):
    scratch = pj.alloc(o, (pj.shape(x, 0), pj.shape(x, 1)), pj.dtype(x))
    pj.submit(o, fill_id, (pj.output(scratch),), (1.5,))
    for _ in range(rounds):
        pj.submit(o, add_id, (pj.input(scratch), pj.inout(out)))
    pj.free(o, scratch)


@numba.njit(cache=True, nogil=True)
def _wait_for_a_worker(o, flag, flag_desc, fill_id, patience_ns):
    """Submit a task that fills `flag`, hand it over, and wait for it without returning:
    whether a worker ran it while the body ran."""
    pj.submit(o, fill_id, (pj.output(flag_desc),), (1.0,))
    pj.flush(o)
    start = monotonic_ns()
    while monotonic_ns() - start < patience_ns:
        if load_acquire(flag.ctypes.data) != 0:  # 1.0's bits
            return True
    return False


def test_python_workers_run_beside_a_body_that_releases_the_gil():
    """A `nogil` body (as generated ones are) leaves the GIL to the workers while it runs:
    a Python kernel's task, handed over by the body's flush, runs while the body waits for it (a
    body that held the GIL would wait out its patience and find nothing)."""
    flag = np.zeros(1, np.float64)
    seen = []

    def orchestration(o):
        seen.append(o.compiled(_wait_for_a_worker, flag, o.external(flag), fill.id, 30_000_000_000))

    pto.Runtime(backend="cpu", executor="parallel").run(orchestration, threshold=1)
    assert seen == [True] and flag[0] == 1.0


def test_generated_bodies_release_the_gil():
    source, _ = orchestration_source(matmul_program().module, "tiled_matmul_panels")
    assert "@njit(cache=True, nogil=True)\ndef body(" in source


def test_python_and_compiled_code_share_a_run():
    out = np.zeros((4, 4), np.float32)

    def orchestration(o):
        target = o.external(out)
        o.submit(fill, pto.output(target), 1.0)
        o.compiled(_chain, target, target, fill.id, add_into.id, 3)
        o.submit(add_into, pto.input(target), pto.inout(target))  # doubles: (1 + 3 * 1.5) * 2

    result = pto.Runtime(backend="cpu", executor="parallel").run(orchestration, record=True)
    np.testing.assert_array_equal(out, 11.0)
    assert result.num_tasks == 6
    # fill -> add -> add -> add -> add, and the scratch fill feeds each compiled add.
    assert {(0, 2), (1, 2), (2, 3), (3, 4), (4, 5)} <= set(result.graph.edges)


@numba.njit(cache=True)
def _misuse(o, x, kernel_id, case):
    a = pj.alloc(o, (4, 4), pj.dtype(x))
    if case == 0:
        pj.free(o, a)
        pj.submit(o, kernel_id, (pj.input(a), pj.input(x), pj.output(x)))
    elif case == 1:
        pj.submit(o, kernel_id, (pj.input(a), pj.input(x), pj.output(pj.narrow(x, 0, 0, 2))))
    elif case == 2:
        pj.free(o, a)
        pj.free(o, a)
    elif case == 3:
        pj.free(o, x)
    elif case == 4:
        newer = pj.version_inc(o, a)
        pj.submit(o, kernel_id, (pj.input(x), pj.input(x), pj.output(newer)))
        pj.submit(o, kernel_id, (pj.input(a), pj.input(x), pj.output(x)))
    elif case == 5:
        pj.submit(o, 10_000, (pj.input(a),))
    elif case == 6:
        pj.scope_end(o)
    elif case == 7:
        pj.alloc(o, (2,), pj.dtype(x), 1)
    elif case == 8:
        pj.free(o, a)
        pj.owner_of(o, a)


@pytest.mark.parametrize("case, error, words", [
    (0, pto.UseAfterFreeError, "param 0 of mix: Buffer(heap #0"),
    (1, pto.ParamError, "mix: tensor param 2 dim 0"),
    (2, pto.DoubleFreeError, "already freed"),
    (3, pto.LifecycleError, "cannot free external"),
    (4, pto.StaleVersionError, "version 0 of Buffer(heap #0"),
    (5, pto.ParamError, "kernel id 10000 names no kernel"),
    (6, pto.UsageError, "scope_end without a matching scope_begin"),
    (7, pto.RankError, "alloc: owner=1 is out of range: a run of one process has rank 0 only"),
    (8, pto.UseAfterFreeError, "owner_of: Buffer(heap #0"),
])
def test_misuse_in_compiled_code_raises_a_named_error(case, error, words):
    mix_shaped = pto.kernel(worker=pto.CUBE, name="mix", shapes=("m n", "m n", "m n"))(mix.cpu)

    def orchestration(o):
        o.compiled(_misuse, o.external(np.zeros((4, 4), np.float32)), mix_shaped.id, case)

    rt = pto.Runtime(backend="cpu", executor="serial")
    with pytest.raises(error, match=re.escape(words)) as raised:
        rt.run(orchestration)
    # raised by the session in a callback (jit/bridge.py), and handed on as itself
    assert not isinstance(raised.value.__context__, bridge.ServiceRaised)
    out = np.zeros(3, np.float32)
    rt.run(lambda o: o.submit(fill, pto.output(o.external(out)), 2.0))  # the runtime goes on
    np.testing.assert_array_equal(out, 2.0)


@numba.njit(cache=True)
def _owners(o, x):
    tile = pj.alloc(o, (2, 2), pj.dtype(x), 0)
    return pj.owner_of(o, x), pj.owner_of(o, tile)


def test_one_process_owns_everything_as_rank_0():
    """What a distributed body asks (owner_of, alloc's owner) has one answer in one process;
    tests/mpi_programs/cases.py runs such a body on ranks."""
    answers = []
    pto.Runtime(backend="cpu", executor="serial").run(
        lambda o: answers.append(o.compiled(_owners, o.external(np.zeros((4, 4), np.float32)))))
    assert answers == [(0, 0)]


@numba.njit
def _flushes(o):
    pj.flush(o)


@numba.njit
def _flushes_and_catches(o):
    try:
        pj.flush(o)
    except Exception:  # what a body may do; the service's exception still reaches the caller
        pass


@pytest.mark.parametrize("body", [_flushes, _flushes_and_catches], ids=["raises", "catches"])
def test_what_a_service_call_raises_reaches_the_caller_as_it_is(body, monkeypatch):
    """Compiled code calls the session through a C callback (jit/bridge.py), which an exception
    cannot cross: it is kept and raised again, a KeyboardInterrupt as well, and not kept after."""
    def interrupted(session, code, a, b, c):
        raise KeyboardInterrupt("in a service call")

    monkeypatch.setattr(host.Session, "service", interrupted)
    with pytest.raises(KeyboardInterrupt, match="in a service call") as raised:
        pto.Runtime(backend="cpu", executor="serial").run(lambda o: o.compiled(body))
    assert not isinstance(raised.value.__context__, bridge.ServiceRaised)
    assert not bridge._RAISED


def test_compiled_validation_mode_checks_invariants():
    inputs = llama_layer_inputs(96, hidden=64, heads=4, ffn=96, seed=5)
    pto.Runtime(backend="cpu", executor="parallel", validate=True, task_window=32).run(
        llama_layer_compiled, inputs)
    expected = reference.llama_layer(inputs)
    np.testing.assert_allclose(inputs["out"], expected, atol=1e-5 * np.abs(expected).max())
