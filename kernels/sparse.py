"""Kernels of block-sparse attention (DeepSeek-V3.2-style, spec 004 §8) that choose and move
data by its value: the lightning indexer, which scores the key blocks before a query tile and
keeps the top k, in two tiers by the number of keys, and the gather of the chosen blocks.

The indexer's score of key s for query t is DeepSeek's Σ_j w[t, j] · ReLU(q[t, j] · k[s]) over
the index heads j; a key block's score is the sum over its keys and the tile's queries. The
top k are the highest scores, the lower block first on a tie, written in increasing block
order. These are numpy kernels, so they run on the CPU only: the PTO ISA has no addressing by
value yet, from which their CUDA code would be generated.
"""

from __future__ import annotations

import numpy as np

import pto_gpu as pto


def _block_scores(q: np.ndarray, k: np.ndarray, weights: np.ndarray, block: int,
                  chunk_blocks: int) -> np.ndarray:
    """The score of each `block`-row block of k, `chunk_blocks` blocks at a time (the
    workspace is tile rows × index heads × chunk keys), in float64."""
    rows, heads = weights.shape
    q = q.reshape(rows, heads, -1).astype(np.float64)
    weights = weights.astype(np.float64)
    blocks = k.shape[0] // block
    scores = np.empty(blocks)
    for first in range(0, blocks, chunk_blocks):
        last = min(blocks, first + chunk_blocks)
        keys = k[first * block:last * block].astype(np.float64)
        per_key = np.einsum("th,ths->ts", weights, np.maximum(np.einsum("thd,sd->ths", q, keys), 0.0))
        scores[first:last] = per_key.reshape(rows, last - first, block).sum(axis=(0, 2))
    return scores


def _top_blocks(scores: np.ndarray, chosen: np.ndarray) -> None:
    order = np.argsort(-scores, kind="stable")  # stable: the lower block wins a tie
    chosen[0, :] = np.sort(order[:chosen.shape[1]])


def _check_blocks(keys: int, block: int, chosen: np.ndarray) -> None:
    if block <= 0 or keys % block or chosen.shape[1] > keys // block:
        raise pto.ParamError(f"lightning indexer: {keys} keys are not whole blocks of {block}, or fewer "
                             f"than the {chosen.shape[1]} blocks to choose")


@pto.kernel(worker=pto.VECTOR, shapes=("t hd", "s d", "t h", "1 n"), mixed_dtypes=True)
def lightning_indexer_dense(q, k, weights, chosen, block):
    """The short tier: every key's score in one product (workspace: tile × heads × keys)."""
    _check_blocks(k.shape[0], block, chosen)
    _top_blocks(_block_scores(q, k, weights, block, max(1, k.shape[0] // block)), chosen)


CHUNK_BLOCKS = 16


@pto.kernel(worker=pto.VECTOR, shapes=("t hd", "s d", "t h", "1 n"), mixed_dtypes=True)
def lightning_indexer_chunked(q, k, weights, chosen, block):
    """The long tier: CHUNK_BLOCKS key blocks at a time, so the workspace stays bounded."""
    _check_blocks(k.shape[0], block, chosen)
    _top_blocks(_block_scores(q, k, weights, block, CHUNK_BLOCKS), chosen)


# Spec 004 §6's tiers: by the keys a query tile looks back over.
INDEXER = pto.tiers([(2048, lightning_indexer_dense), (None, lightning_indexer_chunked)])


@pto.kernel(worker=pto.ACCELERATOR, shapes=("1 n", "s w", "s w", "nb w", "nb w"), mixed_dtypes=True)
def gather_blocks(chosen, k, v, k_out, v_out, block):
    """Copy the chosen `block`-row blocks of k and v, in the order given, one after another."""
    for position, index in enumerate(chosen[0]):
        if not 0 <= index < k.shape[0] // block:
            raise pto.ParamError(f"gather_blocks: block {index} is outside the {k.shape[0] // block} "
                                 f"blocks of {block} keys")
        rows = slice(position * block, (position + 1) * block)
        k_out[rows] = k[index * block:(index + 1) * block]
        v_out[rows] = v[index * block:(index + 1) * block]
