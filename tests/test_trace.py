"""The run timeline (trace=) and RunResult's statistics agree with the graph and with each other."""

import json
from collections import Counter

import numpy as np
import pytest
from pto_gpu.orchestration.flash_attention import flash_attention
from pto_gpu.orchestration.llama import llama_layer, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul

import pto_gpu as pto

WORKERS = {pto.CUBE: 2, pto.VECTOR: 2}
EPSILON_US = 0.002  # the trace rounds start and duration to the nanosecond, each by up to 0.5 ns


@pytest.fixture(scope="module", params=["parallel", "stream"])
def traced(tmp_path_factory, request):
    """A LLaMA layer run with a small task window, so rings fill while workers or streams run."""
    path = tmp_path_factory.mktemp("trace") / "llama.json"
    inputs = llama_layer_inputs(96, hidden=64, heads=4, ffn=96)
    rt = pto.Runtime(backend="cpu", executor=request.param, workers=WORKERS, task_window=32)
    result = rt.run(llama_layer, inputs, trace=path, threshold=4)
    return result, json.loads(path.read_text())["traceEvents"]


def task_events(events):
    return {e["args"]["task"]: e for e in events if e["ph"] == "X"}


def test_one_event_per_task_naming_its_kernel_worker_and_params(traced):
    result, events = traced
    assert Counter(e["args"]["task"] for e in events if e["ph"] == "X") == Counter(range(result.num_tasks))
    spans = task_events(events)
    for task in result.graph.tasks:
        event = spans[task.id]
        assert (event["name"], event["args"]["worker"]) == (task.kernel.name, task.worker.name)
        assert len(event["args"]["params"]) == len(task.params)


def test_no_two_events_overlap_in_one_lane(traced):
    _, events = traced
    lanes: dict[int, list] = {}
    for e in events:
        if e["ph"] == "X":
            lanes.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert set(lanes) <= set(names) and len(names) == sum(WORKERS.values()) + 2  # + AI_CPU, ACCELERATOR
    for spans in lanes.values():
        spans.sort()
        assert all(end <= next_start + EPSILON_US for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_consumers_start_after_their_producers_end(traced):
    result, events = traced
    spans = task_events(events)
    assert result.graph.edges
    for producer, consumer in result.graph.edges:
        p, c = spans[producer], spans[consumer]
        assert c["ts"] >= p["ts"] + p["dur"] - EPSILON_US, (producer, consumer)


def test_one_flow_arrow_per_dependency_bound_to_its_tasks(traced):
    result, events = traced
    spans = task_events(events)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == len(result.graph.edges)
    for flow, (producer, consumer) in enumerate(result.graph.edges):
        for end, task in ((starts[flow], spans[producer]), (ends[flow], spans[consumer])):
            assert (end["tid"], end["ts"], end["cat"]) == (task["tid"], task["ts"], task["cat"])


def test_counters_stay_within_the_rings(traced):
    result, events = traced
    counters: dict[str, list] = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).extend(e["args"].values())
    assert set(counters) == {"ready tasks", "task ring", "heap ring"}
    assert max(counters["task ring"]) <= result.capacity["task_ring"] == 32
    assert max(counters["task ring"]) == result.high_water["task_ring"]
    assert 0 < max(counters["heap ring"]) <= result.capacity["heap_bytes"]
    assert min(counters["ready tasks"]) >= 0 and max(counters["ready tasks"]) > 0


def test_the_dry_executor_cannot_trace(tmp_path):
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(pto.PTOError, match="dry executor runs none"):
        pto.Runtime(backend="cpu", executor="dry").run(tiled_matmul, x, x, x.copy(),
                                                       trace=tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("executor", ["serial", "parallel", "stream"])
def test_statistics_add_up(executor):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 256, 16)).astype(np.float32) for _ in range(3))
    rt = pto.Runtime(backend="cpu", executor=executor, workers=WORKERS)
    result = rt.run(flash_attention, q, k, v, np.zeros_like(q), tile=32, causal=True, record=True)
    assert sum(k.tasks for k in result.kernels.values()) == result.num_tasks
    ran = {name: k.tasks for name, k in result.kernels.items()}
    assert ran == Counter(t.kernel.name for t in result.graph.tasks)
    lanes = {"serial": 1, "parallel": 2, "stream": 2}[executor]  # lanes serving each of CUBE and VECTOR
    assert set(result.busy) == {"CUBE", "VECTOR"}
    assert all(0 < share <= 1 for share in result.busy.values())
    kernel_seconds = sum(k.seconds for k in result.kernels.values())
    assert kernel_seconds == pytest.approx(sum(result.busy.values()) * result.seconds * lanes)
    assert all(result.high_water[ring] <= result.capacity[ring] for ring in result.high_water)
    assert result.stalls == {}  # nothing filled up
    table = str(result)
    assert all(name in table for name in result.kernels) and all(ring in table for ring in result.high_water)


def test_stalls_are_timed_per_ring_within_the_run():
    a = np.random.default_rng(2).standard_normal((128, 128)).astype(np.float32)
    rt = pto.Runtime(backend="cpu", workers=WORKERS, task_window=4)
    result = rt.run(tiled_matmul, a, a, np.zeros_like(a), tile=32)
    assert result.high_water["task_ring"] == 4
    assert set(result.stalls) == {"task_ring"} and 0 < result.stalls["task_ring"] < result.seconds
    assert f"{result.stalls['task_ring'] * 1e3:.2f}" in str(result)


def test_a_dry_run_reports_no_kernels():
    a = np.zeros((64, 64), np.float32)
    result = pto.Runtime(backend="cpu", executor="dry").run(tiled_matmul, a, a, a.copy(), tile=32)
    assert result.num_tasks == 4 * (2 + 2) and result.kernels == {} and result.busy == {}
    assert "no kernel ran" in str(result)
