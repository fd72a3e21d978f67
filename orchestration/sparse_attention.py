"""DeepSeek-V3.2-style sparse attention (spec 004 §5 and §8) over a batch of sequences of
different lengths, as three graphs run side by side on one runtime (`rt.run_concurrent`):

    mla_prolog              q, k, v = x·Wq, x·Wk, x·Wv, per row tile
    lightning_indexer       the index projections of x (local tensors), then per query tile the
                            indexer kernel of its tier (kernels.sparse.INDEXER, by the keys it
                            looks back over) choosing the top-k earlier key blocks
    sparse_flash_attention  per query tile, the chosen blocks gathered, then flash attention over
                            them and, causally, over the tile's own block

The indexer does not read what the prolog writes, so the two overlap; the attention graph waits
for both through the shared TensorMap, with no dependency declared (provides/requires only name
them, and are checked). Sequences are whole blocks; query tiles are blocks too, and a query
tile's keys are its chosen earlier blocks (all of them while there are at most top_k) and its own.
Every task is tagged with its batch, its interleave group (GROUP batches) and its stage, which
is what the four schedules of spec 004 §4.1 (SCHEDULES) sort and place by.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from pto_gpu.kernels.llm import flash_init, flash_normalise, flash_pv, flash_scores, flash_softmax_update
from pto_gpu.kernels.sparse import INDEXER, gather_blocks
from pto_gpu.kernels.tiles import matmul

import pto_gpu as pto
from pto_gpu.tiers import Tiers

GROUP = 4  # batches per interleave group (spec 004 §4.1: INTERLEAVE(batch_idx, GROUP_SIZE=4))


@dataclasses.dataclass(frozen=True)
class Sizes:
    hidden: int = 128
    heads: int = 4
    head_dim: int = 32
    index_heads: int = 4
    index_dim: int = 32
    top_k: int = 4  # earlier key blocks a query tile attends to, besides its own
    block: int = 32  # rows of a query tile and of a key block


@dataclasses.dataclass
class SparseAttentionInputs:
    """Inputs (x per sequence, the weights), workspaces (q, k, v, chosen) and outputs (out)."""

    sizes: Sizes
    x: list[np.ndarray]
    weights: dict[str, np.ndarray]  # wq, wk, wv, wq_index, wk_index, w_index
    q: list[np.ndarray]
    k: list[np.ndarray]
    v: list[np.ndarray]
    chosen: list[np.ndarray]  # (blocks, top_k) int32 per sequence: block i's chosen blocks, -1 unused
    out: list[np.ndarray]


def sparse_attention_inputs(seq_lens: list[int], sizes: Sizes = Sizes(),
                            seed: int = 0) -> SparseAttentionInputs:
    if not seq_lens or any(n <= 0 or n % sizes.block for n in seq_lens):
        raise pto.ParamError(f"seq_lens={seq_lens}: each sequence is a positive number of whole "
                             f"{sizes.block}-row blocks")
    rng = np.random.default_rng(seed)
    width = sizes.heads * sizes.head_dim

    def weight(columns: int) -> np.ndarray:
        return (rng.standard_normal((sizes.hidden, columns)) / np.sqrt(sizes.hidden)).astype(np.float32)

    weights = {"wq": weight(width), "wk": weight(width), "wv": weight(width),
               "wq_index": weight(sizes.index_heads * sizes.index_dim), "wk_index": weight(sizes.index_dim),
               "w_index": weight(sizes.index_heads)}
    x = [rng.standard_normal((n, sizes.hidden)).astype(np.float32) for n in seq_lens]
    return SparseAttentionInputs(
        sizes, x, weights,
        *([np.zeros((n, width), np.float32) for n in seq_lens] for _ in range(3)),
        [np.full((n // sizes.block, sizes.top_k), -1, np.int32) for n in seq_lens],
        [np.zeros((n, width), np.float32) for n in seq_lens])


def chosen_count(sizes: Sizes, tile: int) -> int:
    """How many earlier key blocks query tile `tile` attends to."""
    return min(sizes.top_k, tile)


def _stage(o: pto.Orchestrator, batch: int, stage: str):
    return o.tags(batch=batch, group=batch // GROUP, stage=stage)


def _project(o: pto.Orchestrator, x, weight, out, block: int) -> None:
    for first in range(0, x.shape[0], block):
        rows = slice(first, first + block)
        o.submit(matmul, pto.input(x[rows]), pto.input(weight), pto.output(out[rows]))


def mla_prolog(o: pto.Orchestrator, inputs: SparseAttentionInputs) -> None:
    weights = {name: o.external(inputs.weights[name]) for name in ("wq", "wk", "wv")}
    for batch, x in enumerate(inputs.x):
        with _stage(o, batch, "prolog"):
            for name in ("q", "k", "v"):
                out = o.external(getattr(inputs, name)[batch])
                _project(o, o.external(x), weights["w" + name], out, inputs.sizes.block)


def lightning_indexer(o: pto.Orchestrator, inputs: SparseAttentionInputs, tiers: Tiers = INDEXER) -> None:
    s = inputs.sizes
    weights = {name: o.external(inputs.weights[name]) for name in ("wq_index", "wk_index", "w_index")}
    for batch, x in enumerate(inputs.x):
        with _stage(o, batch, "indexer"), o.scope():
            X, chosen = o.external(x), o.external(inputs.chosen[batch])
            seq = x.shape[0]
            q = o.alloc((seq, s.index_heads * s.index_dim))
            k = o.alloc((seq, s.index_dim))
            w = o.alloc((seq, s.index_heads))
            for local, name in ((q, "wq_index"), (k, "wk_index"), (w, "w_index")):
                _project(o, X, weights[name], local, s.block)
            for tile in range(1, seq // s.block):
                rows, keys = slice(tile * s.block, (tile + 1) * s.block), tile * s.block
                o.submit(tiers.select(keys), pto.input(q[rows]), pto.input(k[:keys]), pto.input(w[rows]),
                         pto.output(chosen[tile:tile + 1, :chosen_count(s, tile)]), s.block)


def _per_head(tensor: pto.TensorDescriptor, heads: int) -> pto.TensorDescriptor:
    """(seq, heads·dim) as (heads, seq, dim)."""
    seq, width = tensor.shape
    return tensor.reshape(seq, heads, width // heads).transpose(1, 0, 2)


def sparse_flash_attention(o: pto.Orchestrator, inputs: SparseAttentionInputs) -> None:
    s = inputs.sizes
    for batch in range(len(inputs.x)):
        with _stage(o, batch, "attention"):
            q, k, v, chosen, out = (o.external(getattr(inputs, name)[batch])
                                    for name in ("q", "k", "v", "chosen", "out"))
            for tile in range(q.shape[0] // s.block):
                with o.scope():
                    _attend_tile(o, s, q, k, v, chosen, out, tile)


def _attend_tile(o: pto.Orchestrator, s: Sizes, q, k, v, chosen, out, tile: int) -> None:
    first, rows, n = tile * s.block, slice(tile * s.block, (tile + 1) * s.block), chosen_count(s, tile)
    q_tile, out_tile = _per_head(q[rows], s.heads), _per_head(out[rows], s.heads)
    running_max, running_sum, rescale = (o.alloc((s.heads, s.block, 1)) for _ in range(3))
    acc = o.alloc((s.heads, s.block, s.head_dim))
    o.submit(flash_init, pto.output(running_max), pto.output(running_sum), pto.output(acc))
    steps = [(_per_head(k[rows], s.heads), _per_head(v[rows], s.heads), 1)]  # its own block, causally
    if n:
        k_chosen, v_chosen = o.alloc((n * s.block, k.shape[1])), o.alloc((n * s.block, v.shape[1]))
        o.submit(gather_blocks, pto.input(chosen[tile:tile + 1, :n]), pto.input(k[:first]),
                 pto.input(v[:first]), pto.output(k_chosen), pto.output(v_chosen), s.block)
        steps.insert(0, (_per_head(k_chosen, s.heads), _per_head(v_chosen, s.heads), 0))
    for keys, values, causal in steps:
        # Earlier blocks are wholly visible: only the tile's own block needs positions.
        scores = o.alloc((s.heads, s.block, keys.shape[1]))
        o.submit(flash_scores, pto.input(q_tile), pto.input(keys), pto.output(scores), first, first, causal)
        o.submit(flash_softmax_update, pto.inout(scores), pto.inout(running_max), pto.inout(running_sum),
                 pto.output(rescale))
        o.submit(flash_pv, pto.input(scores), pto.input(values), pto.input(rescale), pto.inout(acc))
    o.submit(flash_normalise, pto.input(acc), pto.input(running_sum), pto.output(out_tile))


def run_sparse_attention(rt: pto.Runtime, inputs: SparseAttentionInputs, tiers: Tiers = INDEXER,
                         **options) -> pto.RunResult:
    """The three graphs side by side; `options` are run_concurrent's (schedule=, record=, ...)."""
    return rt.run_concurrent(
        [(mla_prolog, (inputs,)), (lightning_indexer, (inputs, tiers)), (sparse_flash_attention, (inputs,))],
        provides=[("q", "k", "v"), ("chosen",), ()], requires=[(), (), ("q", "k", "v", "chosen")], **options)


# Spec 004 §4.1's strategies, on this example's tags (graph: 0 prolog, 1 indexer, 2 attention).
SCHEDULES = {
    # task-major: each graph's tasks before the next's, batch by batch within
    "default": pto.Schedule(order_by=("graph", "batch")),
    # finish a batch before the next, on its own workers (KV-cache locality)
    "batch_locality": pto.Schedule(order_by=("batch", "graph"), affinity="batch"),
    # groups of GROUP batches, task-major within a group
    "interleaved": pto.Schedule(order_by=("group", "graph", "batch")),
    # indexer and attention on their own vector workers, batch by batch. Spec §4.1 also caps
    # the batches in flight (CONCURRENT_BATCHES), a max_concurrent window here; but a window
    # holds back submission and the graphs are submitted one after another, so it would make
    # each graph wait for the previous graph's earlier batches to finish: the graphs in turn.
    "pipeline": pto.Schedule(order_by=("batch", "graph"), stages={"indexer": {pto.VECTOR: 1},
                                                                   "attention": {pto.VECTOR: 1}}),
}
