"""Pipelined compiled calls (jit/pipeline.py): in a dry run, a compiled call's submits queue
their core part for a core stage on a thread of its own, once the body's last call submitted
pipeline.START_AFTER tasks (here 1). Such runs must build the graph the serial submit builds
(the same tasks, edges and high-water marks), through full rings and heap reuse, raise the
errors it raises, and leave no thread behind."""

import re
import threading
import weakref

import numba
import numpy as np
import pytest
from fuzzing import HEAP_TILE, PLAN_SHAPE, compiled_plan, native_plan
from pto_gpu.kernels.elementwise import add
from pto_gpu.orchestration.flash_attention import flash_attention_compiled
from pto_gpu.orchestration.llama import llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul_panels

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.jit import pipeline


@pytest.fixture
def stages(monkeypatch):
    """How many core stages have started; the serial submit when `serial()` is called."""
    started = []
    enter = pipeline.CoreStage.__enter__

    def counting_enter(self):
        started.append(self)
        return enter(self)

    monkeypatch.setattr(pipeline.CoreStage, "__enter__", counting_enter)
    monkeypatch.setattr(pipeline, "START_AFTER", 1)
    monkeypatch.setattr(pipeline, "pays", lambda calls: True)  # tiny calls' rates are noise
    monkeypatch.setattr(pipeline, "_CALLS", weakref.WeakKeyDictionary())  # no body has run

    class Stages:
        @staticmethod
        def count() -> int:
            return len(started)

        @staticmethod
        def serial() -> None:
            monkeypatch.setattr(pipeline, "wanted", lambda *conditions: False)

    return Stages


def _build(orchestration, *args, **sizes):
    """Two dry runs on one runtime (the second, pipelined, reuses its rings): what each built."""
    rt = pto.Runtime(backend="cpu", executor="dry", **sizes)
    runs = [rt.run(orchestration, *args) for _ in range(2)]
    return [(r.num_tasks, r.num_edges, r.high_water) for r in runs]


BUILDS = {
    "llama": lambda: (llama_layer_compiled, llama_layer_inputs(1024, lazy=True), True),
    "flash attention": lambda: (flash_attention_compiled, *np.empty((4, 4, 256, 16), np.float32), 64, True),
    # a heap buffer per column block, freed after its chains: allocs and frees meet the stage
    "panel matmul": lambda: (tiled_matmul_panels, *(np.empty((256, 256), np.float32) for _ in range(3)), 64),
}
SIZES = {
    "default rings": {},
    "a TensorMap the stage sweeps": {"tensormap_entries": 64},
    "a window of 8 tasks": {"task_window": 8},
}


@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("build", BUILDS.values(), ids=BUILDS.keys())
def test_pipelined_builds_are_the_serial_submits_builds(build, sizes, stages):
    orchestration, *args = build()
    pipelined = _build(orchestration, *args, **sizes)
    assert stages.count() > 0
    stages.serial()
    assert pipelined == _build(orchestration, *args, **sizes)


@pytest.mark.parametrize("seed", range(6))
def test_pipelined_random_plans_with_heap_tiles_are_the_serial_submits_builds(seed, stages):
    """Random programs of tiles, heap tiles among them, in windows of 2 to 64 tasks and heaps
    of one to four tiles: allocs wait for frees, which wait for the stage."""
    rng = np.random.default_rng(seed)
    plan = native_plan(rng, 300)
    a, b = np.zeros((2, *PLAN_SHAPE), np.float32)
    sizes = {"task_window": 2 << (seed % 6), "heap_bytes": HEAP_TILE * (1 + seed % 4)}
    pipelined = _build(compiled_plan, a, b, plan, **sizes)
    assert stages.count() > 0
    stages.serial()
    assert pipelined == _build(compiled_plan, a, b, plan, **sizes)


@numba.njit(cache=True)
def _tasks_then(o, x, kernel_id, tasks, case):
    """`tasks` adds into x, then a misuse: an add reading a freed tile (0), a free of a freed
    tile (1), a tensor of the wrong shape (2), or nothing (3)."""
    t = pj.alloc(o, (4, 4), pj.dtype(x))
    for _ in range(tasks):
        pj.submit(o, kernel_id, (pj.input(t), pj.input(x), pj.output(x)))
    pj.free(o, t)
    if case == 0:
        pj.submit(o, kernel_id, (pj.input(t), pj.input(x), pj.output(x)))
    elif case == 1:
        pj.free(o, t)
    elif case == 2:
        pj.submit(o, kernel_id, (pj.input(x), pj.input(x), pj.output(pj.narrow(x, 0, 0, 2))))


@pytest.mark.parametrize("case, error, words", [
    (0, pto.UseAfterFreeError, "param 0 of add: Buffer(heap #0"),
    (1, pto.DoubleFreeError, "already freed"),
    (2, pto.ParamError, "tensor param 2 dim 0"),
])
def test_errors_after_queued_tasks_are_the_serial_submits_and_the_runtime_goes_on(case, error, words, stages):
    x = np.zeros((4, 4), np.float32)
    outcomes = []
    for pipelined in (True, False):
        if not pipelined:
            stages.serial()
        rt = pto.Runtime(backend="cpu", executor="dry", task_window=16)
        rt.run(lambda o: o.compiled(_tasks_then, o.external(x), add.id, 100, 3))  # serial: its first call
        with pytest.raises(error, match=re.escape(words)):
            rt.run(lambda o: o.compiled(_tasks_then, o.external(x), add.id, 100, case))
        result = rt.run(lambda o: o.compiled(_tasks_then, o.external(x), add.id, 100, 3))
        outcomes.append((result.num_tasks, result.num_edges))
    assert stages.count() == 2 and outcomes[0] == outcomes[1] == (100, 99)
    assert not [t for t in threading.enumerate() if t.name == "pto-core-stage"]


def test_a_tensormap_too_small_for_one_task_raises_as_in_a_serial_submit(stages):
    """The stage cannot make room for the task itself: it waits, and the body's side raises
    what the serial submit's service raises."""
    x = np.zeros((4, 4), np.float32)
    pto.Runtime(backend="cpu", executor="dry").run(
        lambda o: o.compiled(_tasks_then, o.external(x), add.id, 5, 3))  # the body's first call: serial
    messages = []
    for pipelined in (True, False):
        if not pipelined:
            stages.serial()
        rt = pto.Runtime(backend="cpu", executor="dry", tensormap_entries=2)
        with pytest.raises(pto.PTOError) as raised:
            rt.run(lambda o: o.compiled(_tasks_then, o.external(x), add.id, 5, 3))
        messages.append((type(raised.value), str(raised.value)))
    assert stages.count() == 1 and messages[0] == messages[1]


def test_a_body_runs_pipelined_after_a_call_of_start_after_tasks(stages, monkeypatch):
    monkeypatch.setattr(pipeline, "START_AFTER", 101)
    x = np.zeros((4, 4), np.float32)
    rt = pto.Runtime(backend="cpu", executor="dry")
    for tasks, stages_after in ((100, 0), (101, 0), (100, 1), (100, 1)):
        rt.run(lambda o, tasks=tasks: o.compiled(_tasks_then, o.external(x), add.id, tasks, 3))
        assert stages.count() == stages_after


@numba.njit(cache=True)
def _same(o, t):
    return t


@numba.njit(cache=True)
def _reads(o, t, x, kernel_id):
    pj.submit(o, kernel_id, (pj.input(t), pj.input(x), pj.output(x)))


@pytest.mark.parametrize("executor", ["serial", "dry"])
def test_compiled_code_that_kept_a_descriptor_finds_its_buffer_freed_by_python(executor):
    """Submits check liveness in the session's heap_versions: a free from Python between two
    compiled calls must reach them (a body may return a descriptor, and be given it back)."""
    x = np.zeros((4, 4), np.float32)

    def orchestration(o):
        X = o.external(x)
        t = o.alloc((4, 4))
        kept = o.compiled(_same, t)
        o.compiled(_reads, kept, X, add.id)  # live: fine
        o.free(t)
        o.compiled(_reads, kept, X, add.id)

    with pytest.raises(pto.UseAfterFreeError, match=re.escape("param 0 of add")):
        pto.Runtime(backend="cpu", executor=executor).run(orchestration)


def test_a_body_keeps_the_faster_way_as_its_calls_measure_it(monkeypatch):
    monkeypatch.setattr(pipeline, "START_AFTER", 100)
    monkeypatch.setattr(pipeline, "_CALLS", weakref.WeakKeyDictionary())

    def body():
        """A stand-in for a compiled body (the table holds bodies weakly)."""

    def calls(seconds: float, pipelined: bool, tasks: int = 1000) -> bool:
        """Note a call of body; whether the next runs pipelined."""
        pipeline.submitted(body, tasks, seconds, pipelined)
        return pipeline.worth(body)

    def probes_in(count: int, seconds: float, pipelined: bool) -> int:
        """Run `count` calls, each the way the policy says (the one that is `pipelined` taking
        `seconds`, the other 1 s); how many went the other way."""
        other = 0
        for _ in range(count):
            way = pipeline.worth(body)
            other += way != pipelined
            calls(seconds if way == pipelined else 1.0, way)
        return other

    assert not pipeline.worth(body)  # no call yet
    assert calls(1e-4, pipelined=False)  # its first call: not a measure; none has run pipelined: try it
    assert pipeline.first_pipelined_next(body)
    assert calls(9e-3, pipelined=True)  # its first pipelined call: not a measure either
    assert not pipeline.first_pipelined_next(body)
    assert not calls(2e-3, pipelined=True)  # measured pipelined: now one serially
    assert not calls(1e-3, pipelined=False)  # pipelined was slower: serial it stays...
    # ...but for one call after every _PROBE_EVERY measured calls (here 2 so far)
    assert probes_in(3 * pipeline._PROBE_EVERY - 2, 1e-3, pipelined=False) == 2
    assert pipeline.worth(body)  # the third probe
    assert calls(0.5e-3, pipelined=True)  # found pipelined faster: it stays
    assert not calls(1e-6, pipelined=True, tasks=99)  # but not after a call of too few tasks
    assert calls(0.5e-3, pipelined=True, tasks=100)
    assert calls(1.5e-3, pipelined=True)  # one call slower than serial: its best still wins
    measured = pipeline._CALLS[body].measured
    assert probes_in(pipeline._PROBE_EVERY, 0.5e-3, pipelined=True) == 1  # serial is probed too
    assert pipeline._CALLS[body].measured == measured + pipeline._PROBE_EVERY
    monkeypatch.setattr(pipeline, "_PROBE_EVERY", 10**9)  # no probes: each call below is pipelined's
    slow = 0
    while pipeline.worth(body) and slow < 100:  # the machine has turned slow for pipelined calls
        calls(2e-3, pipelined=True)
        slow += 1
    assert 1 < slow < 10  # not after one slow call, but after a few: each counts
