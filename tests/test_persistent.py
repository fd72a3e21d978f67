"""executor="persistent": one kernel runs a run's tasks (executors/persistent.py), on the CUDA
emulator (its blocks' host build: pto_persistent.cuh) and, marked gpu, on a GPU. The
orchestrations and random graphs against the serial CPU executor are in test_cuda.py (its
executor lists name "persistent"); here: rings smaller than the graph, one kernel a run once
its instances are known, the errors, and the module's GPU build."""

from __future__ import annotations

import dataclasses
import gc
import json
import re
import shutil
import subprocess
import time
import weakref
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
import nvrtc
import pytest
from fuzzing import HEAP_TILE, PLAN_SHAPE, compiled_plan, native_plan, python_plan
from pto_gpu.kernels.elementwise import add, scale
from pto_gpu.kernels.tiles import copy, matmul_acc, zero
from pto_gpu.orchestration.flash_attention import flash_attention_fused
from pto_gpu.orchestration.matmul import tiled_matmul
from test_cuda import ON_GPU, axpy_kernel, random_buffers, random_kernel_program

import pto_gpu as pto
import pto_gpu.tasks
from pto_gpu import jit as pj
from pto_gpu.backends import cuda_abi, emulated_device, emulator, persistent_host, persistent_module
from pto_gpu.errors import DeadlockError, PTOError, TaskError
from pto_gpu.executors import persistent

BACKENDS = [pytest.param("cuda", marks=ON_GPU), "cuda-emulated"]


@pytest.fixture
def fresh_emulator():
    """The emulator's faults disarmed and its context fresh, after as before."""
    emulator.reset()
    yield
    emulator.reset()


def expected(seed: int) -> list[np.ndarray]:
    buffers = random_buffers(seed)
    pto.Runtime(backend="cpu", executor="serial").run(random_kernel_program, buffers, seed, 80)
    return buffers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window", [2, 4, 16])
def test_a_graph_larger_than_the_rings_runs_and_a_later_run_launches_one_kernel(window, backend):
    """80 tasks through task rings of 2 to 16 slots (so slots of the kernel's state are used
    again and again, and the host waits on them), bitwise equal to the serial CPU executor.
    The first run's new instances end and relaunch the kernel; the backend keeps them, so a
    second run of the same graph is one kernel."""
    rt = pto.Runtime(backend=backend, executor="persistent", task_window=window)
    emulated = backend == "cuda-emulated"  # (on a GPU the emulator is not built)
    for run in range(2):
        launched = emulator.launches() if emulated else 0
        got = [rt.backend.to_device(b) for b in random_buffers(5)]
        rt.run(random_kernel_program, got, 5, 80)
        for want, array in zip(expected(5), got):
            assert rt.backend.to_host(array).tobytes() == want.tobytes(), f"run {run}"
        if emulated and run == 1:
            assert emulator.launches() - launched == 1


def test_no_garbage_collection_runs_while_a_persistent_kernel_does():
    """A collection may free device memory or a cuBLAS handle, which waits for every kernel,
    the persistent one too, whose blocks wait for the thread in that call: so collections are
    held off from the kernel's launch (the first wait: here a full task window) to its end, an
    aborted run's too, and run again after."""
    enabled = []

    def orchestration(o, x, fail):
        X = o.external(x)
        for _ in range(12):
            o.submit(scale, pto.input(X), pto.output(X), 2.0)
            enabled.append(gc.isenabled())
        if fail:
            raise ValueError("the orchestration's own")

    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=4)
    x = np.ones((4, 16), np.float32)
    assert gc.isenabled()
    rt.run(orchestration, x, False)
    assert enabled[0] and not enabled[-1] and gc.isenabled()
    np.testing.assert_array_equal(x, 2.0**12)
    enabled.clear()
    with pytest.raises(ValueError, match="the orchestration's own"):
        rt.run(orchestration, x, True)
    assert not enabled[-1] and gc.isenabled()


@pytest.mark.parametrize("executor", ["serial", "parallel", "stream", "persistent"])
def test_a_runtime_and_its_device_memory_go_with_its_last_reference(executor):
    """No collection is needed to free a backend and its device memory (a collection held off
    while a persistent kernel runs would otherwise keep an earlier runtime's heap alive; the
    parallel executor's schedule once kept it in a cycle)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        rt = pto.Runtime(backend="cuda-emulated", executor=executor)
        x = np.ones((4, 16), np.float32)
        rt.run(lambda o: o.submit(scale, pto.input(o.external(x)), pto.output(o.external(x)), 2.0))
        backend = weakref.ref(rt.backend)
        del rt
        assert backend() is None
    finally:
        if collecting:
            gc.enable()


def planned(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A plan of scale, add and swiglu tasks over two arrays (tests/fuzzing.py), its start,
    and the serial CPU executor's end."""
    rng = np.random.default_rng(seed)
    plan = native_plan(rng, rows)
    start = rng.uniform(-1, 1, (2, *PLAN_SHAPE)).astype(np.float32)
    want = start.copy()
    pto.Runtime(backend="cpu", executor="serial").run(compiled_plan, want[0], want[1], plan)
    return plan, start, want


def instances(plan: np.ndarray) -> int:
    """The plan's kernel instances: a kernel and a tile shape (op 3 is a scale and an add)."""
    kernels = {0: ("scale",), 1: ("add",), 2: ("swiglu",), 3: ("scale", "add")}
    return len({(kernel, h, w) for op, _, _, _, h, w, _, _ in plan.tolist() for kernel in kernels[op]})


@pytest.mark.parametrize("orchestration", [compiled_plan, python_plan], ids=["compiled", "python"])
@pytest.mark.parametrize("window", [2, 4, 64])
def test_tasks_whose_instance_is_learnt_are_published_from_the_argument_tables(window, orchestration):
    """A compiled orchestration's log, and Python submits whose arguments the orchestrator wrote
    to the tables, are published by numba once each instance's first task has gone the Python
    way (the run's first task too, which sets its element type): in a second run, all of them.
    Through rings of 2 to 64 task slots; equal to the serial CPU executor within float32
    rounding of swiglu's exp and division, which the GPU code computes in another order."""
    plan, start, want = planned(3, 150)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=window)
    for run in range(2):
        got = start.copy()
        result = rt.run(orchestration, got[0], got[1], plan)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"run {run}")
        assert result.native_tasks >= result.num_tasks - instances(plan) - 1
    assert result.native_tasks == result.num_tasks


def test_a_validating_run_checks_the_core_after_every_completion(monkeypatch):
    """validate=True: a compiled orchestration's tasks go the Python way and retire one by one,
    the scheduler's invariants checked after each completion, as on the other executors."""
    checked = []
    check = pto_gpu.tasks.Scheduler.check_invariants

    def noted(self, after):
        checked.append(after)
        return check(self, after)

    monkeypatch.setattr(pto_gpu.tasks.Scheduler, "check_invariants", noted)
    plan, start, want = planned(5, 60)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=8, validate=True)
    got = start.copy()
    result = rt.run(compiled_plan, got[0], got[1], plan)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    completed = {int(after.split()[-1]) for after in checked if after.startswith("completing task ")}
    assert completed == set(range(result.num_tasks)) and result.native_tasks == 0


def test_a_task_whose_producers_words_have_no_room_waits_for_its_oldest_producer(monkeypatch):
    """A ring of one producer's word a slot (not 16): tasks that name more in-flight producers
    than the last slots' share leaves wait for their oldest producer to finish, the Python
    way, and are published once it has."""
    waits = []
    wait_done = persistent.PersistentExecutor._wait_done

    def noted(self, ticket, why):
        waits.append(why)
        return wait_done(self, ticket, why)

    monkeypatch.setattr(persistent, "WORDS_PER_SLOT", 1)
    monkeypatch.setattr(persistent.PersistentExecutor, "_wait_done", noted)
    plan, start, want = planned(4, 300)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=4)
    for orchestration in (compiled_plan, python_plan):
        got = start.copy()
        rt.run(orchestration, got[0], got[1], plan)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "room for its producers' words" in waits


@numba.njit(cache=True)
def _scales_then_adds(o, x, y, n, scale_id, add_id):
    """n scales of x's rows into y's, then n adds of y's rows into x's: the adds' instance
    comes after the kernel is running (a ring of a few slots launches it at the first wait)."""
    rows = pj.shape(x, 0)
    for i in range(n):
        r = i % rows
        pj.submit(o, scale_id, (pj.input(pj.narrow(x, 0, r, r + 1)), pj.output(pj.narrow(y, 0, r, r + 1))),
                  (2.0,))
    for i in range(n):
        r = i % rows
        row = pj.narrow(y, 0, r, r + 1)
        pj.submit(o, add_id, (pj.input(row), pj.input(row), pj.output(pj.narrow(x, 0, r, r + 1))))


def scales_then_adds(o, x, y, n):
    o.compiled(_scales_then_adds, o.external(x), o.external(y), n, scale.id, add.id)


def test_a_new_instance_in_a_compiled_log_ends_the_kernel_and_the_log_goes_on():
    """The adds' first task is in a flushed log while the kernel runs without its instance: the
    kernel ends with every task before it retired, and the rest of the log (its producers
    published to the kernel that ended, retired) goes to the next. A second run is one kernel,
    every task from the tables."""
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=4)
    for run in range(2):
        got, y = x.copy(), np.zeros_like(x)
        launched = emulator.launches()
        result = rt.run(scales_then_adds, got, y, 40)
        assert emulator.launches() - launched == (2 if run == 0 else 1)
        assert np.array_equal(y, 2 * x) and np.array_equal(got, 4 * x)
    assert result.native_tasks == result.num_tasks == 80


def wide_adds(o, x, y, z):
    """Eight independent adds over 256 x 512 tiles (a launch of 32 blocks each: 32 pieces), then
    eight more that add x into each result in place: a piece run twice would add it twice."""
    X, Y, Z = (o.external(a) for a in (x, y, z))
    for i in range(len(x)):
        o.submit(add, pto.input(X[i]), pto.input(Y[i]), pto.output(Z[i]))
    for i in range(len(x)):
        o.submit(add, pto.input(Z[i]), pto.input(X[i]), pto.output(Z[i]))


@pytest.mark.parametrize("board", [64, 1])
def test_a_task_runs_as_the_pieces_its_launch_has_blocks(monkeypatch, board):
    """Tasks of 32 pieces: blocks waiting for a task take its pieces from the board, each with
    its blockIdx as its code sees it, each once, and the last to finish completes it, so its
    consumer starts after every piece. With a board of one entry most of the adds find it
    taken and run their pieces one after another on one block."""
    monkeypatch.setattr(persistent, "BOARD", board)
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal((8, 256, 512)).astype(np.float32) for _ in range(2))
    want = (x + y) + x
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    for _ in range(2):
        got = np.zeros_like(x)
        rt.run(wide_adds, x, y, got)
        assert np.array_equal(got, want)
    (state,) = rt.backend.persistent_states.values()
    # the 16 tasks' slots: each published as 32 pieces
    assert (state.records[:16, persistent_host.Field.PIECES] == 32).all()


@numba.njit(cache=True)
def _averaging(o, a, b, plan, scale_id, add_id):
    """native_plan's rows as tasks whose results stay within [-1, 1] and are the same bits
    whichever code computes them (products by 0.75 and 0.5 and sums, each rounded once), and
    depend on the order in which the tasks meet: op 0 scales a tile into another, op 1
    averages one into another (an add and a halving), ops 2 and 3 the same through a heap
    tile."""
    for i in range(plan.shape[0]):
        op, which, r, c, h, w, dr, dc = plan[i]
        src, dst = (a, b) if which == 0 else (b, a)
        source = pj.narrow(pj.narrow(src, 0, r, r + h), 1, c, c + w)
        target = pj.narrow(pj.narrow(dst, 0, dr, dr + h), 1, dc, dc + w)
        if op == 0:
            pj.submit(o, scale_id, (pj.input(source), pj.output(target)), (0.75,))
            continue
        if op >= 2:
            tile = pj.alloc(o, (h, w), pj.dtype(src))
            pj.submit(o, scale_id, (pj.input(source), pj.output(tile)), (0.75,))
            source = tile
        pj.submit(o, add_id, (pj.input(source), pj.input(target), pj.output(target)))
        pj.submit(o, scale_id, (pj.input(target), pj.output(target)), (0.5,))
        if op >= 2:
            pj.free(o, source)


def averaging(o, a, b, plan) -> None:
    o.compiled(_averaging, o.external(a), o.external(b), plan, scale.id, add.id)


def averaging_submits(o, a, b, plan) -> None:
    """The same tasks, through o.submit."""
    arrays = (o.external(a), o.external(b))
    for op, which, r, c, h, w, dr, dc in plan.tolist():
        source = arrays[which][r:r + h, c:c + w]
        target = arrays[1 - which][dr:dr + h, dc:dc + w]
        if op == 0:
            o.submit(scale, pto.input(source), pto.output(target), 0.75)
            continue
        if op >= 2:
            tile = o.alloc((h, w), pto.FLOAT32)
            o.submit(scale, pto.input(source), pto.output(tile), 0.75)
            source = tile
        o.submit(add, pto.input(source), pto.input(target), pto.output(target))
        o.submit(scale, pto.input(target), pto.output(target), 0.5)
        if op >= 2:
            o.free(source)


STRESS_ROWS = {"cuda": 12_000, "cuda-emulated": 2_000}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("orchestration", [averaging, averaging_submits], ids=["compiled", "python"])
def test_thousands_of_tiny_tasks_through_small_rings_equal_the_serial_executor_bit_for_bit(orchestration,
                                                                                          backend):
    """The protocol under load (on a GPU, every resident block racing for tasks): thousands of
    tasks of one or two tiles' work, each meeting the tasks before it through overlapping
    tiles of two small arrays (a task run before a producer, or twice, or never, changes the
    bits), through task rings of 2 to 256 slots and a heap of two tiles, twice on one runtime."""
    rng = np.random.default_rng(11)
    plan = native_plan(rng, STRESS_ROWS[backend])
    start = rng.uniform(-1, 1, (2, *PLAN_SHAPE)).astype(np.float32)
    want = start.copy()
    reference = pto.Runtime(backend="cpu", executor="serial").run(averaging, want[0], want[1], plan)
    assert np.isfinite(want).all() and 0 < np.abs(want - start).max() <= 2
    for window in (2, 16, 256):
        rt = pto.Runtime(backend=backend, executor="persistent", task_window=window, heap_bytes=2 * HEAP_TILE)
        for run in range(2):
            got = [rt.backend.to_device(x) for x in start]
            result = rt.run(orchestration, *got, plan)
            assert result.num_tasks == reference.num_tasks
            for index, (expected, array) in enumerate(zip(want, got)):
                assert rt.backend.to_host(array).tobytes() == expected.tobytes(), \
                    f"window {window}, run {run}: array {index} differs"

def test_a_heap_of_two_tiles_stalls_the_orchestrator_until_the_kernel_frees_one():
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", heap_bytes=2 * 64 * 64 * 4,
                     task_window=8)
    c = np.zeros((256, 256), np.float32)
    result = rt.run(tiled_matmul, a, b, c, tile=64)
    assert result.high_water["heap_bytes"] == 2 * 64 * 64 * 4 and result.stalls
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(c, want, atol=1e-4 * np.abs(want).max())


class Planted(Exception):
    pass


@numba.njit(cache=True)
def _doubles(o, x, y, rows, add_id):
    for i in range(rows):
        row, out = pj.narrow(x, 0, i, i + 1), pj.narrow(y, 0, i, i + 1)
        pj.submit(o, add_id, (pj.input(row), pj.input(row), pj.output(out)))


def doubles_then_raise(o, x, y, rows, compiled):
    if compiled:
        o.compiled(_doubles, o.external(x), o.external(y), rows, add.id)
    else:
        for i in range(rows):
            o.submit(add, pto.input(o.external(x)[i:i + 1]), pto.input(o.external(x)[i:i + 1]),
                     pto.output(o.external(y)[i:i + 1]))
    raise Planted("the orchestration failed after submitting")


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
@pytest.mark.parametrize("window, rows", [(1024, 1), (1024, 40), (4, 64)])
def test_what_was_submitted_before_a_raise_runs(window, rows, compiled):
    """docs/ERRORS.md: the tasks submitted before the orchestration raises run, whether the
    kernel was launched before the raise (a ring of 4 slots fills) or not (the run's first
    wait would have launched it), then the orchestration's error is raised and the runtime
    runs again."""
    x = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=window)
    for _ in range(2):
        y = np.zeros_like(x)
        with pytest.raises(Planted):
            rt.run(doubles_then_raise, x, y, rows, compiled)
        assert np.array_equal(y[:rows], 2 * x[:rows]) and not y[rows:].any()

def hold_the_stream(rt: pto.Runtime) -> None:
    """Put an event that is never reached on the persistent kernel's stream: a kernel launched
    behind it never starts."""
    emulator.lose_event(1)
    event = rt.backend.take_event()
    rt.backend.device.driver.call("cuEventRecord", event, rt.backend.stream(("persistent", 0)))


def test_a_kernel_that_makes_no_progress_is_a_deadlock_that_names_the_tasks_left(fresh_emulator, monkeypatch):
    monkeypatch.setattr(persistent, "PATIENCE", 0.5)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=4)
    hold_the_stream(rt)
    with pytest.raises(DeadlockError, match=r"no progress for 0.5 s while waiting for room in a ring: 4 "
                                            r"tasks unfinished \((add|scale|copy|zero) \(task 0\), .*"
                                            r"running: none \(published 4, wired 0, 0 of 4 in flight done\)"):
        rt.run(random_kernel_program, random_buffers(1), 1, 20)


def test_a_kernel_that_ends_between_the_hosts_two_looks_has_not_failed(monkeypatch):
    """At the run's end the host waits for the last tasks: it sees the awaited one unfinished,
    then the kernel (closed) finishes it and every other and ends before the host looks at its
    end event. A host thread held up between the two looks (here 50 ms) must find the task done,
    not fail the run (a review's race: 1 run in 300 on a loaded machine)."""
    check = persistent.PersistentExecutor._check_kernel

    def held_up(self, why, ticket):
        time.sleep(0.05)
        return check(self, why, ticket)

    monkeypatch.setattr(persistent.PersistentExecutor, "_check_kernel", held_up)

    def chain(o, x):
        row = o.external(x)[0:1]
        for _ in range(200):
            o.submit(scale, pto.input(row), pto.output(row), 1.0)

    x = np.ones((4, 16), np.float32)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=1024)
    for _ in range(2):
        assert rt.run(chain, x).num_tasks == 200


def test_a_kernel_that_faults_fails_the_run_and_the_backend_runs_again(fresh_emulator):
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    emulator.fault_kernel(1)
    with pytest.raises(PTOError, match="the persistent kernel failed with no task running: .*ILLEGAL_ADDR"):
        rt.run(random_kernel_program, random_buffers(2), 2, 20)
    emulator.reset()
    got = random_buffers(2)
    pto.Runtime(backend="cuda-emulated", executor="persistent").run(random_kernel_program, got, 2, 80)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, expected(2)))


def test_a_launch_the_driver_refuses_fails_the_run(fresh_emulator):
    emulator.fail_launch(1)
    with pytest.raises(PTOError, match="the persistent kernel failed with no task running: cuLaunchKernel "
                                       "failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        pto.Runtime(backend="cuda-emulated", executor="persistent").run(random_kernel_program,
                                                                        random_buffers(3), 3, 20)


def test_what_the_persistent_executor_cannot_run_is_named():
    with pytest.raises(PTOError, match=r'executor="persistent" runs the tasks in one CUDA kernel: it needs '
                                       r'backend="cuda" or "cuda-emulated", not "cpu"'):
        pto.Runtime(backend="cpu", executor="persistent")


ELEMENT_TYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


def scales_then_adds_of_each_type(o, pairs, n):
    for x, y in pairs:
        o.compiled(_scales_then_adds, o.external(x), o.external(y), n, scale.id, add.id)


def scales_then_adds_submitted(o, pairs, n):
    """scales_then_adds_of_each_type's tasks from Python, the element types interleaved, each
    scale by 0.1 (rounded to the type: a 16-bit instance computing in T, not ACC, would differ)."""
    views = [(o.external(x), o.external(y)) for x, y in pairs]
    for i in range(n):
        for x, y in views:
            r = i % x.shape[0]
            o.submit(scale, pto.input(x[r:r + 1]), pto.output(y[r:r + 1]), 0.1)
    for i in range(n):
        for x, y in views:
            r = i % x.shape[0]
            o.submit(add, pto.input(y[r:r + 1]), pto.input(y[r:r + 1]), pto.output(x[r:r + 1]))


@pytest.mark.parametrize("orchestration", [scales_then_adds_of_each_type, scales_then_adds_submitted],
                         ids=["compiled", "python"])
def test_tasks_of_several_element_types_run_in_one_kernel_equal_to_the_serial_executor(orchestration):
    """float32, float64, float16 and bfloat16 tasks in one run: one kernel over instances of
    each (its module gives each instance pto_isa.cuh's typed part in its own namespace, with
    its own T), each type's values bit for bit the serial CPU executor's (an instance reading
    another type's bits would not be); in a second run one kernel, every task from the tables."""
    start = np.random.default_rng(2).standard_normal((8, 16))

    def pairs():
        return [(start.astype(dtype), np.zeros(start.shape, dtype)) for dtype in ELEMENT_TYPES]

    want = pairs()
    pto.Runtime(backend="cpu", executor="serial").run(orchestration, want, 24)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=16)
    for run in range(2):
        got = pairs()
        launched = emulator.launches()
        result = rt.run(orchestration, got, 24)
        for dtype, mine, theirs in zip(ELEMENT_TYPES, got, want):
            for array, expected_array in zip(mine, theirs):
                assert array.dtype == dtype, dtype
                assert array.tobytes() == expected_array.tobytes(), f"{dtype}, run {run}"
    assert emulator.launches() - launched == 1
    assert result.native_tasks == result.num_tasks == 2 * 24 * len(ELEMENT_TYPES)
    assert {member.dtype for member in rt.backend.persistent_codes} == {np.dtype(t) for t in ELEMENT_TYPES}


def tiled_matmuls(o, operands):
    for a, b, c in operands:
        tiled_matmul(o, a, b, c, tile=64)


def test_float16_and_bfloat16_products_on_tensor_cores_run_in_one_kernel_beside_float32():
    """Tiled matmuls of float16 and bfloat16 (mma.sync of each type: one generated source, two
    instances) and float32 in one kernel: each within a few roundings of its type of the serial
    CPU executor's result (tests/test_cuda.py's tolerance for the stream executor)."""
    rng = np.random.default_rng(6)
    start = [(rng.standard_normal((128, 96)), rng.standard_normal((96, 80))) for _ in range(3)]
    types = [np.float16, ml_dtypes.bfloat16, np.float32]

    def operands():
        return [(a.astype(t), b.astype(t), np.zeros((128, 80), t)) for (a, b), t in zip(start, types)]

    want = operands()
    pto.Runtime(backend="cpu", executor="serial").run(tiled_matmuls, want)
    got = operands()
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    rt.run(tiled_matmuls, got)
    for t, (_, _, mine), (_, _, theirs) in zip(types, got, want):
        reference = theirs.astype(np.float64)
        rounding = 2.0**-11 if t == np.float16 else 2.0**-8 if t == ml_dtypes.bfloat16 else 2.0**-20
        np.testing.assert_allclose(mine.astype(np.float64), reference, rtol=0,
                                   atol=4 * rounding * np.abs(reference).max(), err_msg=str(t))
    sources = {}
    for member in rt.backend.persistent_codes:
        sources.setdefault(member.code.source, set()).add(member.dtype)
    assert {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)} in sources.values()


@pytest.fixture(scope="module")
def attention_module():
    """The module a float16 fused attention run makes (tensor-core instances whose tiles are
    shared memory references), with row-layout instances (add) of every element type beside
    them: its source."""
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    q = np.random.default_rng(0).standard_normal((2, 100, 32)).astype(np.float16)
    rt.run(flash_attention_fused, q, q, q, np.zeros_like(q), tile=64, causal=True)
    for dtype in ELEMENT_TYPES:
        rt.run(lambda o, x: o.submit(add, pto.input(o.external(x)), pto.input(o.external(x)),
                                     pto.output(o.external(x))), np.ones((4, 8), dtype))
    members = rt.backend.persistent_codes
    assert len(members) >= 5 and max(member.code.shared_bytes for member in members) > 0
    assert {member.dtype for member in members} == {np.dtype(t) for t in ELEMENT_TYPES}
    return persistent_module.write(members)


def test_an_instance_whose_tiles_leave_no_room_for_the_schedulers_words_is_refused_by_name():
    """The persistent kernel's block holds an instance's tiles and then the scheduler's piece
    words: an instance the CUDA backend sized for the GPU (cuda_abi.instance_shared of what a
    block may opt in to) fits; 16 bytes more is refused, naming its source."""
    ceiling = emulated_device.EmulatedDevice.block_shared
    room = cuda_abi.instance_shared(ceiling)
    fits = pto.CudaCode(Path("pto_k_0123.cu"), lambda shapes: 1, shared_bytes=room)
    persistent_module.check_shared(fits, ceiling)
    over = dataclasses.replace(fits, shared_bytes=room + 16)
    with pytest.raises(PTOError, match=rf"pto_k_0123.cu takes {room + 16} bytes .* over the {ceiling}"):
        persistent_module.check_shared(over, ceiling)


def test_the_hosts_record_of_the_task_records_is_the_kernels_field_by_field():
    """persistent_host.RECORDS (what the host writes) and pto_persistent_kernel.cuh's PtoRecords
    (what the kernel reads) name the same fields in the same order, each 8 bytes (a pointer or
    an unsigned long long): two fields of one type swapped would run, and read the wrong one."""
    header = (Path(persistent_module.__file__).parent / "pto_persistent_kernel.cuh").read_text()
    body = re.search(r"struct PtoRecords \{(.*?)\n\};", header, re.S).group(1)
    fields = re.findall(r"^\s+(const )?([\w ]+?)\s*(\*?)\s*(\w+);", body, re.M)
    assert tuple(name for *_, name in fields) == persistent_host.RECORDS.names
    assert all(pointer or kind == "unsigned long long" for _, kind, pointer, _ in fields), fields
    assert persistent_host.RECORDS.itemsize == 8 * len(fields)


def test_the_hosts_words_of_a_task_record_are_the_protocols_and_the_kernels():
    """persistent_host.Field (where the executor writes a record's instance and words, and reads
    its pieces) is the protocol's header (PTO_RECORD_*, in order) and the kernel's words after
    it (PTO_RECORD_INSTANCE, PTO_RECORD_WORDS)."""
    folder = Path(persistent_module.__file__).parent
    protocol = (folder / "persistent_protocol.h").read_text()
    header = re.search(r"enum \{\s*(PTO_RECORD_TICKET.*?)\};", protocol, re.S).group(1)
    names = re.findall(r"^\s*PTO_RECORD_(\w+)", header, re.M)
    kernel = (folder / "pto_persistent_kernel.cuh").read_text()
    assert "enum { PTO_RECORD_INSTANCE = PTO_RECORD_HEADER, PTO_RECORD_WORDS };" in kernel
    assert [*names[:-1], "INSTANCE", "WORDS"] == list(persistent_host.Field.__members__)
    assert [persistent_host.Field[name] for name in names[:-1]] == list(range(len(names) - 1))
    assert names[-1] == "HEADER" and persistent_host.Field.INSTANCE == len(names) - 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_module_compiles_for_the_gpu(attention_module, arch, tmp_path):
    """The module built by nvcc, with every warning an error, and no static shared memory: all
    of it is the launch's (tiles and piece words), which is what the backend opts in to."""
    command = ["nvcc", f"-arch={arch}", "-std=c++17", "-Werror", "all-warnings", "-Xptxas", "-v", "-c", "-o",
               str(tmp_path / "module.o"), "-x", "cu",
               str(attention_module)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Compiling entry function 'pto_persistent'" in done.stderr, done.stderr[-4000:]
    assert not re.search(r"[1-9]\d* bytes smem", done.stderr), done.stderr[-4000:]


@pytest.mark.parametrize("arch", [80, 90])
def test_the_module_compiles_under_nvrtc_as_cupy_loads_it(attention_module, arch):
    """What a GPU loads: CuPy's RawModule hands the module to NVRTC with the backend's options
    (CudaDevice.module_function) and its own. It compiles with nothing in the log but ptxas'
    report, whose one entry is the kernel's."""
    nvrtc.library_or_skip()
    backend_options = cuda_abi.nvrtc_options(attention_module.parent, None, persistent_module.NAME)
    options = (*nvrtc.cupy_options(backend_options, arch),
               "--ptxas-options=-v")
    ok, log = nvrtc.compile_cubin(attention_module.read_text(), options, attention_module.name)
    assert ok, log
    assert not [line for line in log.splitlines() if line.strip() and not line.startswith("ptxas")], log
    entries = re.findall(r"Compiling entry function '(\w+)'", log)
    assert entries == [cuda_abi.symbol(persistent_module.NAME)], log


def matmuls_then_a_new_instance(o, a, b, c, x, y, with_copy: bool) -> None:
    """Tasks that finish out of order (adds beside three accumulating 128 x 128 products), then,
    with `with_copy`, one of an instance the kernel has not got: the kernel ends with every
    task before it finished and retired, and the next starts its tickets afresh."""
    A, B, C, X, Y = (o.external(t) for t in (a, b, c, x, y))
    for _ in range(4):
        o.submit(add, pto.input(X), pto.input(X), pto.output(Y))
    acc = o.alloc((128, 128), A.dtype)
    o.submit(zero, pto.output(acc))
    for _ in range(3):
        o.submit(matmul_acc, pto.input(A), pto.input(B), pto.inout(acc))
    o.submit(add, pto.input(X), pto.input(X), pto.output(Y))
    if with_copy:
        o.submit(copy, pto.input(acc), pto.output(C))
    o.free(acc)


@pytest.mark.parametrize("window", [8, 16])
def test_a_kernel_ended_for_a_new_instance_retires_every_task_first(window):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
    x, y, c = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32), np.zeros((128, 128), np.float32)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=window)
    first = rt.run(matmuls_then_a_new_instance, a, b, c, x, y, False)
    second = rt.run(matmuls_then_a_new_instance, a, b, c, x, y, True)
    assert first.num_tasks == 9 and second.num_tasks == 10
    want = 3 * (a.astype(np.float64) @ b)
    np.testing.assert_allclose(c, want, atol=1e-4 * np.abs(want).max())
    assert (y == 2).all()


def test_a_kernel_it_cannot_run_is_refused_and_later_runs_are_not_spoilt(tmp_path):
    axpy = axpy_kernel(tmp_path)
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent")
    x, y = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(TaskError, match=r"axpy.*runs the generated CUDA code of PTO programs; .*axpy.cu is "
                                        r"not generated code"):
        rt.run(lambda o: o.submit(axpy, 2.0, pto.input(o.external(x)), 32, pto.output(o.external(y))))
    for _ in range(2):
        rt.run(lambda o: o.submit(add, pto.input(o.external(x)), pto.input(o.external(x)),
                                  pto.output(o.external(y))))
        assert (y == 2).all()
        y[:] = 0


def test_the_trace_draws_each_task_on_the_block_that_ran_it_after_its_producers(tmp_path):
    """trace= draws the kernel's tasks on a lane per block, from the times the blocks wrote (the
    device's clock, read as the host's): every task once, inside the run, none before the
    producers it waited for had ended, a block's one after another (the emulator's blocks run
    side by side, each on a thread)."""
    rt = pto.Runtime(backend="cuda-emulated", executor="persistent", task_window=8)
    path = tmp_path / "trace.json"
    started = time.perf_counter()
    result = rt.run(random_kernel_program, random_buffers(4), 4, 60, trace=path)
    took = (time.perf_counter() - started) * 1e6
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = {e["args"]["task"]: e for e in events if e["ph"] == "X"}
    assert len(spans) == result.num_tasks > 50 and result.num_edges > 20
    blocks = {f"persistent-block-{b}" for b in range(emulated_device.PERSISTENT_BLOCKS)}
    assert {lanes[e["tid"]] for e in spans.values()} <= blocks
    assert all(0 <= e["ts"] and e["ts"] + e["dur"] <= took for e in spans.values())
    for tid in lanes:  # a block runs one task at a time
        on_it = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans.values() if e["tid"] == tid)
        assert all(end <= start + 0.002 for (_, end), (start, _) in zip(on_it, on_it[1:]))
    for producer, consumer in result.graph.edges:
        assert spans[consumer]["ts"] >= spans[producer]["ts"] + spans[producer]["dur"] - 0.002
