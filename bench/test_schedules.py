"""Schedules on real threads (spec 004): the critical path against FIFO on the graph of
tests/test_schedules.py, 40 independent 5 ms tasks submitted before a 20-task chain, on 2
worker threads; kernels sleep (releasing the GIL), so the wall time is the schedule's. The
simulator's makespan for the same graph and schedule is extra_info["predicted_s"], and
extra_info["prediction_error"] is (measured median - predicted) / measured."""

import time

import numpy as np
import pytest

import pto_gpu as pto

SECONDS = 5e-3


@pto.kernel(worker=pto.VECTOR, cost=lambda x: SECONDS)
def sleeper(x):
    time.sleep(SECONDS)


def independents_then_chain(o, spread, chain):
    S, C = o.external(spread), o.external(chain)
    for i in range(40):
        o.submit(sleeper, pto.inout(S[i:i + 1]))
    for _ in range(20):
        o.submit(sleeper, pto.inout(C))


@pytest.mark.parametrize("order_by", ["critical_path", "fifo"])
def test_threads(benchmark, order_by):
    schedule = pto.Schedule(order_by=order_by)
    arrays = (np.zeros((40, 1), np.float32), np.zeros((1, 1), np.float32))
    rt = pto.Runtime(backend="cpu", executor="parallel", workers={pto.VECTOR: 2})
    benchmark.pedantic(rt.run, (independents_then_chain, *arrays), {"schedule": schedule},
                       rounds=5, iterations=1, warmup_rounds=1)
    sim = pto.Runtime(backend="cpu", executor="sim", workers={pto.VECTOR: 2})
    predicted = sim.run(independents_then_chain, *arrays, schedule=schedule).makespan
    measured = benchmark.stats.stats.median
    benchmark.extra_info.update(predicted_s=predicted, prediction_error=(measured - predicted) / measured)
