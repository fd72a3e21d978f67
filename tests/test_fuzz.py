"""Differential fuzzing: random programs on the parallel, stream and dry executors, with random
windows, heap sizes, thresholds, worker or stream counts and (threads) schedules, must leave every buffer
byte-identical to the serial executor, agree on whether the heap is too small, and record the
serial executor's graph, which must be exactly the edges that the independent oracle
(oracle.py) derives from docs/DESIGN.md's rules. The oracle's own tests are here too: it gives
hand-derived edges, and it fails a graph with one edge too few or too many.

Programs of generated kernels (fuzzing.native_plan), submitted by compiled code or from Python,
must give the serial executor's bytes on native workers too: run twice on one runtime, with
random windows, heaps and worker counts; and on the CUDA backend over the emulator, on every
executor that runs on CUDA.

CI runs FUZZ_EXAMPLES (default 1,500) programs of the first kind and a tenth as many of the
second; `make fuzz` runs many more of both.
"""

import os

import numpy as np
import pytest
from conftest import GRAPH_EXECUTORS, fill, noop
from fuzzing import (
    HEAP_TILE,
    PLAN_SHAPE,
    compiled_plan,
    describe,
    make_buffers,
    native_plan,
    python_plan,
    random_program,
    run,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import expected_edges, mismatch

import pto_gpu as pto

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1500"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize="FUZZ_SEED" not in os.environ, print_blob=True)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 60),
       window_log2=st.integers(2, 10), heap_slack=st.integers(0, 4),
       threshold=st.sampled_from([0, 1, 5, 17]), workers=st.integers(1, 3),
       executor=st.sampled_from([e for e in GRAPH_EXECUTORS if e != "serial"]),
       order_by=st.sampled_from([None, "critical_path", "fifo"]))
def test_matches_serial_and_the_oracle(seed, n_ops, window_log2, heap_slack, threshold, workers, executor,
                                       order_by):
    _, probe = run("serial", seed, n_ops, heap_bytes=1 << 24)
    # From just big enough for the live set (the serial high-water mark) upwards.
    heap = max(64, probe.high_water["heap_bytes"]) * (1 + heap_slack) // 2 // 64 * 64 or 64
    config = {"heap_bytes": heap, "task_window": 1 << window_log2}  # the same for both executors
    expected, reference = run("serial", seed, n_ops, **config)
    schedule = pto.Schedule(order_by=order_by) if order_by and executor == "parallel" else None
    got, result = run(executor, seed, n_ops, threshold, schedule,
                      workers={pto.CUBE: workers, pto.VECTOR: workers}, **config)
    program = f"seed={seed} n_ops={n_ops} {schedule}; program:\n{describe(seed, n_ops)}"
    assert type(result) is type(reference), f"serial gave {reference!r}, {executor} {result!r}; {program}"
    if isinstance(reference, pto.DeadlockError):
        return
    if executor != "dry":  # the dry executor runs no kernel: its buffers stay as they were
        for index, (e, g) in enumerate(zip(expected, got)):
            assert e.tobytes() == g.tobytes(), f"buffer {index} differs; {program}"
    assert result.graph.edges == reference.graph.edges, program
    wrong = mismatch(result.graph.tasks, result.graph.edges)
    assert not wrong, f"{executor}: {wrong}; {program}"


def planned_case(seed: int, rows: int, compiled: bool):
    """A plan of generated-kernel tasks, its two start arrays, the orchestration that submits it,
    and the serial CPU executor's result: its arrays and its RunResult."""
    rng = np.random.default_rng(seed)
    plan = native_plan(rng, rows)
    start = rng.uniform(-1, 1, (2, *PLAN_SHAPE)).astype(np.float32)
    orchestration = compiled_plan if compiled else python_plan
    a, b = start[0].copy(), start[1].copy()
    reference = pto.Runtime(backend="cpu", executor="serial").run(orchestration, a, b, plan)
    return plan, start, orchestration, (a, b), reference


@settings(max_examples=max(1, EXAMPLES // 10), deadline=None, suppress_health_check=list(HealthCheck),
          derandomize="FUZZ_SEED" not in os.environ, print_blob=True)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 300), window_log2=st.integers(1, 10),
       heap_tiles=st.integers(1, 8), workers=st.integers(1, 3), compiled=st.booleans())
def test_native_workers_match_serial(seed, rows, window_log2, heap_tiles, workers, compiled):
    """The second run is all native (the first learns each instance's entry, for the process);
    both reuse the runtime's rings, tables and threads, and a small heap makes allocs wait."""
    plan, start, orchestration, (a, b), reference = planned_case(seed, rows, compiled)
    expected = a.tobytes() + b.tobytes()
    runtime = pto.Runtime(backend="cpu", executor="parallel", task_window=1 << window_log2,
                          heap_bytes=heap_tiles * HEAP_TILE, workers={pto.CUBE: workers, pto.VECTOR: workers})
    program = f"seed={seed} rows={rows} window={1 << window_log2} heap={heap_tiles} tiles workers={workers}"
    for attempt in range(2):
        a, b = start[0].copy(), start[1].copy()
        result = runtime.run(orchestration, a, b, plan)
        assert a.tobytes() + b.tobytes() == expected, f"run {attempt}: {program}"
        assert result.num_tasks == reference.num_tasks, program
    assert result.native_tasks == result.num_tasks, program


@settings(max_examples=max(1, EXAMPLES // 10), deadline=None, suppress_health_check=list(HealthCheck),
          derandomize="FUZZ_SEED" not in os.environ, print_blob=True)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 200), window_log2=st.integers(1, 10),
       heap_tiles=st.integers(1, 8), streams=st.integers(1, 3), compiled=st.booleans(),
       executor=st.sampled_from(["stream", "parallel", "serial", "persistent"]),
       emulate=st.sampled_from(["cpu-code", "gpu-code"]))
def test_the_cuda_emulator_matches_serial(seed, rows, window_log2, heap_tiles, streams, compiled, executor,
                                          emulate):
    """The same programs through the CUDA backend on the emulator: its launch records, issue
    path, streams and events, and the persistent kernel. Running each instance's CPU code
    (cpu-code), bitwise the serial CPU executor's bytes; running its GPU code built for the host
    (gpu-code, and always in the persistent kernel), within float32 rounding of the few ops the
    two codes compute in another order (swiglu's exp and division)."""
    plan, start, orchestration, (a, b), reference = planned_case(seed, rows, compiled)
    runtime = pto.Runtime(backend="cuda-emulated", emulate=emulate, executor=executor,
                          task_window=1 << window_log2, heap_bytes=heap_tiles * HEAP_TILE,
                          workers={pto.CUBE: streams, pto.VECTOR: streams})
    program = f"seed={seed} rows={rows} window={1 << window_log2} heap={heap_tiles} tiles streams={streams}"
    got = [runtime.backend.to_device(x) for x in start]
    result = runtime.run(orchestration, *got, plan)
    assert result.num_tasks == reference.num_tasks, program
    for want, array in zip((a, b), got):
        if emulate == "cpu-code" and executor != "persistent":
            assert runtime.backend.to_host(array).tobytes() == want.tobytes(), program
        else:
            np.testing.assert_allclose(runtime.backend.to_host(array), want, rtol=1e-5, atol=1e-6,
                                       err_msg=program)


def known_program(o, x, y):
    """One case of each rule, with the edges docs/DESIGN.md gives written beside each task."""
    X, Y = o.external(x), o.external(y)
    o.submit(fill, pto.output(X), 1.0)                      # 0
    o.submit(noop, pto.input(X[0:2]))                       # 1: RAW 0
    o.submit(fill, pto.output(X[0:4]), 2.0)                 # 2: WAW 0 (partial), WAR 1 (covered)
    o.submit(noop, pto.input(X[0]))                         # 3: RAW 0 and 2: a partial write leaves 0
    o.submit(fill, pto.output(X), 3.0)                      # 4: WAW 0, 2; WAR 3 (1 went with 2)
    o.submit(noop, pto.input(X[5]))                         # 5: only 4 is left to read
    o.submit(fill, pto.output(Y[:, 0::2]), 4.0)             # 6
    o.submit(fill, pto.output(Y[:, 1::2]), 5.0)             # 7: interleaved with 6: no edge
    o.submit(noop, pto.input(Y[1, 1::2]))                   # 8: RAW 7 only
    o.submit(noop, pto.input(Y[1, 1::2].with_overlap(pto.Overlap.BOUNDING_BOX)))  # 9: its span meets 6 too
    as_bytes = o.external(y.view(np.uint8))
    o.submit(fill, pto.output(as_bytes[0, 4:8]), 0)         # 10: bytes of Y[0, 1]: WAW 7; no WAR 8, 9 (row 1)
    first = o.alloc((4,))
    o.submit(fill, pto.output(first), 6.0)                  # 11
    o.free(first)
    again = o.alloc((4,))  # first's memory (an empty heap starts at 0), but another allocation
    assert again.addr == first.addr
    o.submit(noop, pto.input(again))                        # 12: no edge to 11
    o.submit(fill, pto.output(Y[1, 0:3]), 8.0)              # 13: WAW 6, 7; WAR 8, 9
    o.free(again)


KNOWN_EDGES = {(0, 1), (0, 2), (1, 2), (0, 3), (2, 3), (0, 4), (2, 4), (3, 4), (4, 5),
               (7, 8), (6, 9), (7, 9), (7, 10), (6, 13), (7, 13), (8, 13), (9, 13)}


def test_the_oracle_gives_the_hand_derived_edges():
    result = pto.Runtime(backend="cpu", executor="serial").run(
        known_program, np.zeros(8, np.float32), np.zeros((4, 6), np.float32), record=True)
    assert expected_edges(result.graph.tasks) == KNOWN_EDGES
    assert set(result.graph.edges) == KNOWN_EDGES


@pytest.mark.parametrize("seed", [3, 11])
def test_the_oracle_fails_a_graph_with_an_edge_removed_or_added(seed):
    result = pto.Runtime(backend="cpu", executor="dry").run(random_program, make_buffers(), seed, 40,
                                                             record=True)
    tasks, edges = result.graph.tasks, result.graph.edges
    assert len(edges) > 10 and not mismatch(tasks, edges)
    removed = edges[len(edges) // 2]
    assert f"lacks: [{removed}]" in mismatch(tasks, [e for e in edges if e != removed])
    added = next((p, c) for c in range(len(tasks)) for p in range(c) if (p, c) not in edges)
    assert f"do not give: [{added}]" in mismatch(tasks, edges + [added])
