"""The run timeline (trace=) and RunResult's statistics agree with the graph, with each other,
and with when and where the kernels really ran (as the kernels themselves measured it; the
stream executor's spans are what its backend measured where the kernels ran, a stream's
thread or a GPU's timing events, not the host's issue and retirement)."""

import json
import threading
import time
from collections import Counter

import numpy as np
import pytest
from conftest import CONCURRENT_EXECUTORS, EXECUTORS
from pto_gpu.kernels.elementwise import scale
from pto_gpu.orchestration.flash_attention import flash_attention
from pto_gpu.orchestration.llama import llama_layer, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul

import pto_gpu as pto
from pto_gpu.backends import cpu, cuda
from pto_gpu.backends.cpu_streams import CpuEvent

WORKERS = {pto.CUBE: 2, pto.VECTOR: 2}
EPSILON_US = 0.002  # the trace rounds start and duration to the nanosecond, each by up to 0.5 ns


@pytest.fixture(scope="module", params=CONCURRENT_EXECUTORS)
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


def test_one_lane_per_worker_thread(traced):
    _, events = traced
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {e["tid"] for e in events if e["ph"] == "X"} <= set(names)
    assert len(names) == sum(WORKERS.values()) + 2  # + AI_CPU, ACCELERATOR


ran: dict[int, tuple[int, float, float]] = {}  # task number -> (thread, start, end), as the kernel saw


def _timed_step(number, *views):
    started = time.perf_counter()
    time.sleep(2e-4)  # releases the GIL: concurrent executors overlap tasks, so a missed wait shows
    views[-1][...] += sum(float(v.sum()) for v in views[:-1]) + 1
    ran[number] = (threading.get_ident(), started, time.perf_counter())


timed_cube = pto.kernel(worker=pto.CUBE, name="timed_cube")(_timed_step)
timed_vector = pto.kernel(worker=pto.VECTOR, name="timed_vector")(_timed_step)


def timed_program(o, x, n_tasks):
    """Task i (task id i) reads a few random rows of x and updates one."""
    rng = np.random.default_rng(4)
    X = o.external(x)
    for number in range(n_tasks):
        reads = [pto.input(X[int(r)]) for r in rng.integers(0, len(x), int(rng.integers(0, 3)))]
        kernel = timed_cube if rng.random() < 0.5 else timed_vector
        o.submit(kernel, number, *reads, pto.inout(X[int(rng.integers(len(x)))]))


@pytest.fixture(scope="module", params=EXECUTORS)
def timed(tmp_path_factory, request):
    """A traced run of kernels that time themselves: (result, trace events, what the kernels saw,
    the run's wall time in microseconds)."""
    path = tmp_path_factory.mktemp("trace") / "timed.json"
    rt = pto.Runtime(backend="cpu", executor=request.param, workers=WORKERS, task_window=16)
    ran.clear()
    started = time.perf_counter()
    result = rt.run(timed_program, np.zeros((6, 4)), 120, trace=path, threshold=4)
    wall_us = (time.perf_counter() - started) * 1e6
    return result, json.loads(path.read_text())["traceEvents"], dict(ran), wall_us


def test_kernels_start_after_their_producers_end(timed):
    result, events, kernels, _ = timed
    spans = task_events(events)
    assert sorted(kernels) == list(range(result.num_tasks)) and len(result.graph.edges) > result.num_tasks
    for producer, consumer in result.graph.edges:
        assert kernels[consumer][1] >= kernels[producer][2], (producer, consumer)  # as the kernels saw
        p, c = spans[producer], spans[consumer]
        assert c["ts"] >= p["ts"] + p["dur"] - EPSILON_US, (producer, consumer)  # as the trace says


def test_each_lane_is_one_thread_running_its_tasks_in_span_order(timed):
    _, events, kernels, _ = timed
    lanes: dict[int, list] = {}
    for e in events:
        if e["ph"] == "X":
            lanes.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["args"]["task"]))
    threads = []
    for spans in lanes.values():
        spans.sort()
        assert all(end <= start + EPSILON_US for (_, end, _), (start, _, _) in zip(spans, spans[1:]))
        tasks = [task for _, _, task in spans]
        assert len({kernels[task][0] for task in tasks}) == 1, "a lane's tasks ran on several threads"
        threads.append(kernels[tasks[0]][0])
        assert tasks == sorted(tasks, key=lambda task: kernels[task][1]), "spans out of the kernels' order"
    assert len(set(threads)) == len(threads), "two lanes drew tasks of one thread"


def test_spans_lie_within_the_run(timed):
    _, events, _, wall_us = timed
    spans = [e for e in events if e["ph"] == "X"]
    assert all(0 <= e["ts"] and 0 <= e["dur"] and e["ts"] + e["dur"] <= wall_us for e in spans)


def _late_retirement(o, x, y, pause: float):
    """A task, then `pause` seconds of the orchestration's own before the next submit: the stream
    executor notices the first task's end no sooner (it polls at each submit)."""
    X, Y = o.external(x), o.external(y)
    o.submit(scale, pto.input(X[0:1]), pto.output(Y[0:1]), 2.0)
    time.sleep(pause)
    o.submit(scale, pto.input(X[1:2]), pto.output(Y[1:2]), 2.0)


@pytest.mark.parametrize("backend, options", [("cpu", {}), ("cuda-emulated", {"emulate": "gpu-code"})])
def test_stream_spans_are_when_the_kernels_ran_not_when_the_host_noticed(tmp_path, backend, options):
    """A one-row kernel's span (and kernel time) on the stream executor is microseconds even
    though the host saw it end only `pause` later: as inferred from retirement it lasted `pause`."""
    pause = 0.4  # the kernel takes microseconds: a quarter of it is room for a loaded machine
    rt = pto.Runtime(backend=backend, executor="stream", **options)
    x, y = (rt.backend.to_device(a) for a in (np.ones((2, 16), np.float32), np.zeros((2, 16), np.float32)))
    rt.run(_late_retirement, x, y, 0.0)  # the kernel's first call (a compile) before the timed run
    path = tmp_path / "trace.json"
    result = rt.run(_late_retirement, x, y, pause, trace=path)
    spans = task_events(json.loads(path.read_text())["traceEvents"])
    assert np.array_equal(rt.backend.to_host(y), 2 * np.ones((2, 16)))
    assert spans[0]["dur"] < pause / 4 * 1e6 and result.kernels["scale"].seconds < pause / 4
    assert spans[1]["ts"] - spans[0]["ts"] > pause / 2 * 1e6  # its submit came after the pause
    assert all(0 <= e["ts"] and e["ts"] + e["dur"] <= result.seconds * 1e6 for e in spans.values())


def _chain(o, x, n: int, kernel=scale):
    X = o.external(x)
    for _ in range(n):
        o.submit(kernel, pto.input(X[0:1]), pto.output(X[0:1]), 1.0)


def _timing_events_made(monkeypatch, backend) -> list[int]:
    """The handles of the timing events a CUDA backend's device makes from now on."""
    made = []
    event = backend.device.event

    def counted(timed: bool = False) -> int:
        handle = event(timed)
        if timed:
            made.append(handle)
        return handle

    monkeypatch.setattr(backend.device, "event", counted)
    return made


def _all_back(backend, made: list[int]) -> bool:
    """Whether every timing event made is the backend's clock, or back in its pool once. (Its
    private state: a later run's needs, and so whether it makes more, depend on how many of its
    tasks are in flight at once, which is the machine's timing.)"""
    return sorted([*backend._timed_events, backend._clock.event]) == sorted(made)


def test_cuda_spans_stay_right_when_the_clock_is_taken_anew_under_them(monkeypatch, tmp_path):
    """The timed launches' clock taken again at every launch (its age bound 0), while earlier
    launches' spans are still to be read against older clocks: the spans keep a chain's order
    and lie within the run, and after each run every event (the old clocks' too) is back."""
    monkeypatch.setattr(cuda, "CLOCK_SECONDS", 0.0)
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=16)
    x = rt.backend.to_device(np.ones((1, 16), np.float32))
    made = _timing_events_made(monkeypatch, rt.backend)
    path = tmp_path / "trace.json"
    for _ in range(2):
        result = rt.run(_chain, x, 40, trace=path)
        assert result.num_tasks == 40 and _all_back(rt.backend, made)
    events = task_events(json.loads(path.read_text())["traceEvents"]).values()
    spans = sorted((e["ts"], e["ts"] + e["dur"], e["args"]["task"]) for e in events)
    assert [task for _, _, task in spans] == list(range(40))
    assert all(end <= start + EPSILON_US for (_, end, _), (start, _, _) in zip(spans, spans[1:]))
    assert 0 <= spans[0][0] and spans[-1][1] <= result.seconds * 1e6


def _chain_then_fail(o, x, n: int, kernel=scale):
    _chain(o, x, n, kernel)
    raise ValueError("the orchestration fails with its tasks in flight")


@pto.kernel(worker=pto.VECTOR)
def slow_scale(x, out, factor):
    time.sleep(0.05)  # the run fails long before the chain has run
    out[...] = x * factor


def test_a_failed_traced_run_gives_its_events_back(monkeypatch, tmp_path):
    """A run that fails with timed launches in flight hands their events back once its streams
    have passed them (StreamExecutor.abort): on a CUDA backend its timing events (which, kept,
    also kept the clock from being taken again), and on the CPU one, whose kernels are slow
    here, every event of its chain, all still in flight when it failed."""
    rt = pto.Runtime(backend="cuda-emulated", emulate="cpu-code", executor="stream", task_window=64)
    made = _timing_events_made(monkeypatch, rt.backend)
    with pytest.raises(ValueError, match="in flight"):
        rt.run(_chain_then_fail, rt.backend.to_device(np.ones((1, 16), np.float32)), 30,
               trace=tmp_path / "cuda.json")
    assert made and _all_back(rt.backend, made)

    created = []
    monkeypatch.setattr(cpu, "CpuEvent", lambda: created.append(CpuEvent()) or created[-1])
    rt = pto.Runtime(backend="cpu", executor="stream")
    with pytest.raises(ValueError, match="in flight"):
        rt.run(_chain_then_fail, np.ones((1, 16), np.float32), 4, slow_scale, trace=tmp_path / "cpu.json")
    assert len(created) == 4 and sorted(map(id, rt.backend._events)) == sorted(map(id, created))


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


@pytest.mark.parametrize("flag", [True, 1])
def test_a_trace_that_is_not_a_path_is_refused_before_anything_runs(flag):
    """trace=True used to run the whole orchestration and then fail in pathlib with a bare
    TypeError, its results thrown away."""
    a = np.ones((4, 4), np.float32)
    out = np.zeros_like(a)
    with pytest.raises(pto.PTOError, match=r"trace=(True|1): the path of the file"):
        pto.Runtime(backend="cpu", executor="serial").run(tiled_matmul, a, a, out, trace=flag)
    assert not out.any()


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


@pto.kernel(worker=pto.CUBE)
def computes_50_ms(x):
    started = time.thread_time()
    while time.thread_time() - started < 0.05:
        x += 1


@pto.kernel(worker=pto.VECTOR)
def sleeps_50_ms(x):
    time.sleep(0.05)


def computing_and_sleeping(o: pto.Orchestrator, x) -> None:
    X = o.external(x)
    o.submit(computes_50_ms, pto.inout(X[0:1]))
    o.submit(sleeps_50_ms, pto.inout(X[1:2]))


@pytest.mark.parametrize("executor", ["serial", "parallel"])
def test_cpu_seconds_are_counted_by_the_threads_that_spent_them(executor):
    """The CPU a kernel computes with counts on its class's threads (parallel) or the caller's
    (serial); a sleeping kernel's thread hardly any."""
    rt = pto.Runtime(backend="cpu", executor=executor, workers=WORKERS)
    rt.run(computing_and_sleeping, np.zeros(2))  # (first calls: whatever loads then is not measured)
    result = rt.run(computing_and_sleeping, np.zeros(2))
    cpu = result.cpu_seconds
    if executor == "serial":
        assert set(cpu) == {"caller"} and cpu["caller"] >= 0.05
    else:
        assert set(cpu) == {"caller", "CUBE", "VECTOR"}, cpu
        assert cpu["CUBE"] >= 0.05 and cpu["VECTOR"] < 0.025 and cpu["caller"] < 0.05, cpu
    assert f"caller {cpu['caller'] * 1e3:.2f}" in str(result)


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
