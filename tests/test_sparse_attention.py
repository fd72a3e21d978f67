"""DeepSeek-style sparse attention (orchestration/sparse_attention.py): three graphs side by
side, against a float64 reference written from the maths; every schedule of spec 004 §4.1 on
the simulator and on threads bitwise equal to the serial executor; both indexer tiers."""

import copy

import numpy as np
import pytest
from pto_gpu.kernels.sparse import INDEXER, gather_blocks, lightning_indexer_chunked, lightning_indexer_dense
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.sparse_attention import (
    SCHEDULES,
    Sizes,
    run_sparse_attention,
    sparse_attention_inputs,
)

import pto_gpu as pto

SEQ_LENS = [64, 256, 96, 192, 32, 160]
WORKERS = {pto.CUBE: 2, pto.VECTOR: 2, pto.ACCELERATOR: 1, pto.AI_CPU: 1}
# Both tiers on these lengths: a query tile looking back over more than 64 keys is chunked.
SMALL_TIERS = pto.tiers([(64, lightning_indexer_dense), (None, lightning_indexer_chunked)])


@pytest.fixture(scope="module")
def serial():
    inputs = sparse_attention_inputs(SEQ_LENS)
    result = run_sparse_attention(pto.Runtime(backend="cpu", executor="serial"), inputs, record=True)
    return inputs, result


@pytest.fixture(scope="module")
def history():
    """Kernel times measured on threads: the simulator's cost models (the families have none)."""
    measured = pto.CostHistory()
    run_sparse_attention(pto.Runtime(backend="cpu", executor="parallel", workers=WORKERS, costs=measured),
                         sparse_attention_inputs(SEQ_LENS))
    return measured


def test_matches_the_float64_reference(serial):
    inputs, result = serial
    blocks = [n // 32 for n in SEQ_LENS]
    # Per query tile: init, normalise, 3 for its own block; after the first, 3 for the chosen
    # blocks, their gather and an indexer call; 3 + 3 projections per row tile.
    tiles_after_first = sum(b - 1 for b in blocks)
    assert result.num_tasks == sum(5 * b for b in blocks) + 5 * tiles_after_first + 6 * sum(blocks)
    for b, x in enumerate(inputs.x):
        out, chosen, margins = reference.sparse_attention(x, inputs.weights, inputs.sizes)
        # The float32 indexer picks the float64 one's blocks when no pick is a near tie: the
        # scores are sums of ~10^3 terms of order 1, where float32's error is far below 1.
        assert margins.size == 0 or margins.min() > 1.0
        np.testing.assert_array_equal(inputs.chosen[b], chosen)
        # float32 attention over <= 160 keys of unit-scale values: errors ~1e-6.
        np.testing.assert_allclose(inputs.out[b], out, rtol=1e-4, atol=2e-5)


def test_the_attention_graph_waits_for_both_others_through_the_tensormap(serial):
    _, result = serial
    graph = result.graph
    producers = graph.producers()
    tasks = {t.id: t for t in graph.tasks}
    gathers = [t for t in graph.tasks if t.kernel is gather_blocks]
    assert gathers
    for gather in gathers:
        feeding = {(tasks[p].tags["graph"], tasks[p].kernel.name) for p in producers[gather.id]}
        assert (1, "lightning_indexer_dense") in feeding  # the chosen blocks
        assert (0, "matmul") in feeding  # k and v
    # The indexer reads x only: nothing in it waits for the prolog.
    indexer = [t for t in graph.tasks if t.tags["graph"] == 1]
    assert all(tasks[p].tags["graph"] == 1 for t in indexer for p in producers[t.id])


@pytest.mark.parametrize("executor", ["sim", "parallel"])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_gives_the_serial_result(serial, history, executor, name):
    want, _ = serial
    inputs = sparse_attention_inputs(SEQ_LENS)
    rt = pto.Runtime(backend="cpu", executor=executor, workers=WORKERS, costs=history)
    result = run_sparse_attention(rt, inputs, schedule=SCHEDULES[name])
    for got, expected in zip(inputs.out + inputs.chosen, want.out + want.chosen):
        assert got.tobytes() == expected.tobytes()
    if executor == "sim":
        assert result.makespan > 0


def test_simulated_makespans_respect_the_workers_and_stages(history):
    """Whatever the measured costs: no schedule beats each class's work over its workers, the
    pipeline's stages each have one vector worker, and nothing takes longer than the work in
    series; and the four orders are not all alike."""
    makespans = {}
    for name, schedule in SCHEDULES.items():
        # A copy: a run adds what it measured to its history as it ends, and the bounds below
        # are of the costs it scheduled by (on a loaded machine they had moved past its makespan).
        rt = pto.Runtime(backend="cpu", executor="sim", workers=WORKERS, costs=copy.deepcopy(history))
        result = run_sparse_attention(rt, sparse_attention_inputs(SEQ_LENS), schedule=schedule, record=True)
        makespans[name] = span = result.makespan
        work: dict = {}
        for task in result.graph.tasks:
            stage = task.tags["stage"] if schedule.stages and task.worker == pto.VECTOR else None
            key = (task.worker, stage if stage in (schedule.stages or {}) else None)
            work[key] = work.get(key, 0.0) + history.cost(task, missing=None)
        for (worker, stage), seconds in work.items():
            workers = schedule.stages[stage][worker] if stage else WORKERS[worker]
            assert span >= seconds / workers * (1 - 1e-9), (name, worker, stage)
        assert span <= sum(work.values()) * (1 + 1e-9)
    assert len(set(makespans.values())) > 1


def test_both_indexer_tiers_choose_the_same_blocks(serial):
    want, _ = serial
    assert INDEXER.select(2048) is lightning_indexer_dense
    assert INDEXER.select(2049) is lightning_indexer_chunked
    inputs = sparse_attention_inputs(SEQ_LENS)
    rt = pto.Runtime(backend="cpu", executor="serial")
    result = run_sparse_attention(rt, inputs, SMALL_TIERS, record=True)
    used = {t.kernel.name for t in result.graph.tasks}
    assert {"lightning_indexer_dense", "lightning_indexer_chunked"} <= used
    for got, expected in zip(inputs.chosen, want.chosen):
        np.testing.assert_array_equal(got, expected)
    for got, expected in zip(inputs.out, want.out):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_sequences_must_be_whole_blocks():
    with pytest.raises(pto.ParamError, match=r"seq_lens=\[64, 40\]: each sequence is a positive number of "
                                             r"whole 32-row blocks"):
        sparse_attention_inputs([64, 40])


def test_a_chosen_block_out_of_range_fails_the_gather_by_name():
    def gather(o, chosen, k, out):
        C, K, OUT = (o.external(a) for a in (chosen, k, out))
        o.submit(gather_blocks, pto.input(C), pto.input(K), pto.input(K), pto.output(OUT[:32]),
                 pto.output(OUT[32:]), 32)

    chosen = np.array([[2]], np.int32)  # two blocks of keys: 2 is past them
    k, out = np.ones((64, 8), np.float32), np.zeros((64, 8), np.float32)
    with pytest.raises(pto.TaskError, match="gather_blocks: block 2 is outside the 2 blocks of 32 keys"):
        pto.Runtime(backend="cpu", executor="serial").run(gather, chosen, k, out)
    assert not out.any()


def test_sizes_are_the_inputs_shapes():
    inputs = sparse_attention_inputs([64], Sizes(hidden=32, heads=2, head_dim=8, top_k=1, block=16), seed=3)
    assert inputs.x[0].shape == (64, 32) and inputs.q[0].shape == (64, 16)
    assert inputs.chosen[0].shape == (4, 1)
    run_sparse_attention(pto.Runtime(backend="cpu", executor="serial"), inputs)
    out, chosen, _ = reference.sparse_attention(inputs.x[0], inputs.weights, inputs.sizes)
    np.testing.assert_array_equal(inputs.chosen[0], chosen)
    np.testing.assert_allclose(inputs.out[0], out, rtol=1e-4, atol=2e-5)
