"""Spec 004 §4.1's four schedules on the DeepSeek-style sparse attention
(orchestration/sparse_attention.py: 8 sequences of 128 to 1024 rows, 64-row blocks, top 4,
hidden 512, 8 heads of 64), on threads (2 CUBE, 2 VECTOR, 1 ACCELERATOR worker). Per schedule,
the wall time of a run, and in extra_info the simulator's makespan for the same graph and
schedule from kernel times measured beforehand (predicted_s), and (measured median - predicted)
/ measured (prediction_error)."""

import pytest
from pto_gpu.orchestration.sparse_attention import (
    SCHEDULES,
    Sizes,
    run_sparse_attention,
    sparse_attention_inputs,
)

import pto_gpu as pto

SEQ_LENS = [512, 1024, 256, 768, 384, 640, 896, 128]
SIZES = Sizes(hidden=512, heads=8, head_dim=64, index_heads=4, index_dim=64, top_k=4, block=64)
WORKERS = {pto.CUBE: 2, pto.VECTOR: 2, pto.ACCELERATOR: 1, pto.AI_CPU: 1}


@pytest.fixture(scope="module")
def history():
    run_sparse_attention(pto.Runtime(backend="cpu", executor="parallel", workers=WORKERS),
                         sparse_attention_inputs(SEQ_LENS, SIZES))  # compiles every kernel instance
    measured = pto.CostHistory()
    rt = pto.Runtime(backend="cpu", executor="parallel", workers=WORKERS, costs=measured)
    for name in SCHEDULES:  # kernel times as each schedule's concurrency makes them
        run_sparse_attention(rt, sparse_attention_inputs(SEQ_LENS, SIZES), schedule=SCHEDULES[name])
    return measured


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules(benchmark, history, name):
    schedule = SCHEDULES[name]
    rt = pto.Runtime(backend="cpu", executor="parallel", workers=WORKERS)
    inputs = sparse_attention_inputs(SEQ_LENS, SIZES)
    benchmark.pedantic(run_sparse_attention, (rt, inputs), {"schedule": schedule}, rounds=7, iterations=1,
                       warmup_rounds=1)
    sim = pto.Runtime(backend="cpu", executor="sim", workers=WORKERS, costs=history)
    predicted = run_sparse_attention(sim, sparse_attention_inputs(SEQ_LENS, SIZES), schedule=schedule)
    measured = benchmark.stats.stats.median
    benchmark.extra_info.update(predicted_s=predicted.makespan, tasks=predicted.num_tasks,
                                cross_waits=predicted.cross_waits,
                                prediction_error=(measured - predicted.makespan) / measured)
