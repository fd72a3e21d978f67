"""Differential fuzzing: random programs on the parallel and stream executors, with random
windows, heap sizes, thresholds and worker or stream counts, must leave every buffer
byte-identical to the serial executor, record the same graph, and agree on whether the heap
is too small.

CI runs FUZZ_EXAMPLES (default 2,000) programs; `make fuzz` runs many more.
"""

import os

from fuzzing import describe, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pto_gpu as pto

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "2000"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize="FUZZ_SEED" not in os.environ, print_blob=True)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 60),
       window_log2=st.integers(2, 10), heap_slack=st.integers(0, 4),
       threshold=st.sampled_from([0, 1, 5, 17]), workers=st.integers(1, 3),
       executor=st.sampled_from(["parallel", "stream"]))
def test_matches_serial(seed, n_ops, window_log2, heap_slack, threshold, workers, executor):
    _, probe = run("serial", seed, n_ops, heap_bytes=1 << 20)
    # From just big enough for the live set (the serial high-water mark) upwards.
    heap = max(64, probe.high_water["heap_bytes"]) * (1 + heap_slack) // 2 // 64 * 64 or 64
    config = {"heap_bytes": heap, "task_window": 1 << window_log2}  # the same for both executors
    expected, reference = run("serial", seed, n_ops, **config)
    got, result = run(executor, seed, n_ops, threshold, workers={pto.CUBE: workers, pto.VECTOR: workers},
                      **config)
    program = f"seed={seed} n_ops={n_ops}; program:\n{describe(seed, n_ops)}"
    assert type(result) is type(reference), f"serial gave {reference!r}, {executor} {result!r}; {program}"
    if isinstance(reference, pto.DeadlockError):
        return
    for index, (e, g) in enumerate(zip(expected, got)):
        assert e.tobytes() == g.tobytes(), f"buffer {index} differs; {program}"
    assert result.graph.edges == reference.graph.edges, program
