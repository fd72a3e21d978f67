"""Fault injection: kernels that raise at random points, in random worker classes, with safe
and pipelined runs, on the parallel and stream executors. Every time: TaskError for a task
that failed, no descendant of a failed task runs, no worker is left running, the rings are
empty once the run unwinds, and the next run on the same Runtime matches the serial executor."""

import numpy as np
from conftest import CONCURRENT_EXECUTORS, running_workers
from hypothesis import given, settings
from hypothesis import strategies as st

import pto_gpu as pto

ran: list[int] = []


def _step(task_number, fail, *views):
    ran.append(task_number)
    if fail:
        raise RuntimeError(f"injected failure in task {task_number}")
    views[-1][...] += sum(float(v.sum()) for v in views[:-1]) + 1


step_cube = pto.kernel(worker=pto.CUBE, name="step_cube")(_step)
step_vector = pto.kernel(worker=pto.VECTOR, name="step_vector")(_step)


def program(o, x, seed, n_tasks, failing):
    """Tasks read a few random rows and update one; those in `failing` raise."""
    rng = np.random.default_rng(seed)
    X = o.external(x)
    for number in range(n_tasks):
        reads = [pto.input(X[int(r)]) for r in rng.integers(0, len(x), int(rng.integers(0, 3)))]
        kernel = step_cube if rng.random() < 0.5 else step_vector
        o.submit(kernel, number, int(number in failing), *reads, pto.inout(X[int(rng.integers(len(x)))]))


def descendants(edges, roots):
    children: dict[int, list[int]] = {}
    for producer, consumer in edges:
        children.setdefault(producer, []).append(consumer)
    seen, stack = set(), list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tasks=st.integers(1, 80), data=st.data(),
       threshold=st.sampled_from([0, 1, 8]), window_log2=st.integers(2, 8),
       executor=st.sampled_from(CONCURRENT_EXECUTORS))
def test_injected_failures(seed, n_tasks, data, threshold, window_log2, executor):
    failing = set(data.draw(st.lists(st.integers(0, n_tasks - 1), min_size=1, max_size=3)))
    graph = pto.Runtime(backend="cpu", executor="dry").run(
        program, np.zeros((6, 4)), seed, n_tasks, set(), record=True).graph
    rt = pto.Runtime(backend="cpu", executor=executor, task_window=1 << window_log2, validate=True)
    ran.clear()
    try:
        rt.run(program, np.zeros((6, 4)), seed, n_tasks, failing, threshold=threshold)
        raise AssertionError("no TaskError")
    except pto.TaskError as error:
        reported = error.task_id
    assert reported in failing and reported in ran
    failed = failing & set(ran)
    assert not descendants(graph.edges, failed) & set(ran)
    assert not running_workers(rt)
    header = rt._scheduler.state.head
    assert header["next_task"] == header["last_alive"] == 0 and header["dep_used"] == 0
    assert header["heap_head"] == header["heap_tail"] and not any(rt._scheduler.records)
    # The same runtime runs the next program correctly.
    expected, got = np.zeros((6, 4)), np.zeros((6, 4))
    pto.Runtime(backend="cpu", executor="serial").run(program, expected, seed + 1, n_tasks, set())
    rt.run(program, got, seed + 1, n_tasks, set(), threshold=threshold)
    assert expected.tobytes() == got.tobytes()


def test_failure_in_the_serial_executor_also_unwinds():
    rt = pto.Runtime(backend="cpu", executor="serial")
    ran.clear()
    try:
        rt.run(program, np.zeros((6, 4)), 3, 20, {5})
    except pto.TaskError as error:
        assert error.task_id == 5
    assert ran == list(range(6))
    assert rt._scheduler.state.head["next_task"] == 0
