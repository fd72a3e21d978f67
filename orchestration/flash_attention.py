"""Flash attention over (heads, seq, head_dim) arrays: query tiles against key/value tiles
with the online softmax, any seq_len (the last tile may be partial)."""

import numba
from pto_gpu.kernels.llm import flash_init, flash_normalise, flash_pv, flash_scores, flash_softmax_update
from pto_gpu.orchestration.tiling import fixed_tiles

import pto_gpu as pto
from pto_gpu import jit as pj


def attend_tile(o: pto.Orchestrator, q, k, v, out, q_tile, kv_tiles, causal: bool) -> None:
    """One query tile against key/value tiles; q/k/v/out are (heads, seq, head_dim) descriptors."""
    q_start, q_rows = q_tile
    heads, _, dim = q.shape
    widest = max(rows for _, rows in kv_tiles)
    with o.scope():
        running_max = o.alloc((heads, q_rows, 1), q.dtype)
        running_sum = o.alloc((heads, q_rows, 1), q.dtype)
        acc = o.alloc((heads, q_rows, dim), q.dtype)
        # One score buffer per query tile, not per pair: the heap reclaims in allocation order,
        # so per-pair buffers would pile up behind the tile's long-lived state. Reusing it
        # costs no parallelism, since the online softmax orders the pairs anyway.
        all_scores = o.alloc((heads, q_rows, widest), q.dtype)
        rescale = o.alloc((heads, q_rows, 1), q.dtype)
        o.submit(flash_init, pto.output(running_max), pto.output(running_sum), pto.output(acc))
        q_view = q[:, q_start:q_start + q_rows]
        for k_start, k_rows in kv_tiles:
            scores = all_scores[:, :, :k_rows]
            o.submit(flash_scores, pto.input(q_view), pto.input(k[:, k_start:k_start + k_rows]),
                     pto.output(scores), q_start, k_start, int(causal))
            o.submit(flash_softmax_update, pto.inout(scores), pto.inout(running_max),
                     pto.inout(running_sum), pto.output(rescale))
            o.submit(flash_pv, pto.input(scores), pto.input(v[:, k_start:k_start + k_rows]),
                     pto.input(rescale), pto.inout(acc))
        o.submit(flash_normalise, pto.input(acc), pto.input(running_sum),
                 pto.output(out[:, q_start:q_start + q_rows]))


def flash_attention(o: pto.Orchestrator, q, k, v, out, tile: int = 64, causal: bool = False) -> None:
    Q, K, V, OUT = (o.external(a) for a in (q, k, v, out))
    tiles = fixed_tiles(Q.shape[1], tile)
    for q_tile in tiles:
        # Causal: key tiles wholly after the query tile contribute nothing, so they are skipped.
        kv_tiles = [t for t in tiles if not causal or t[0] < q_tile[0] + q_tile[1]]
        attend_tile(o, Q, K, V, OUT, q_tile, kv_tiles, causal)


@numba.njit(cache=True)
def attend_tile_compiled(o, kernel_ids, q, k, v, out, q_tile, kv_tiles, causal):
    """attend_tile for compiled orchestrations: the same tasks, from njit code.

    kernel_ids: the ids of flash_init, flash_scores, flash_softmax_update, flash_pv and
    flash_normalise; kv_tiles: an (n, 2) array of (first row, rows).
    """
    init, scores_kernel, update, pv, normalise = kernel_ids
    q_start, q_rows = q_tile
    heads, dim = pj.shape(q, 0), pj.shape(q, 2)
    widest = kv_tiles[:, 1].max()
    dtype = pj.dtype(q)
    pj.scope_begin(o)
    running_max = pj.alloc(o, (heads, q_rows, 1), dtype)
    running_sum = pj.alloc(o, (heads, q_rows, 1), dtype)
    acc = pj.alloc(o, (heads, q_rows, dim), dtype)
    all_scores = pj.alloc(o, (heads, q_rows, widest), dtype)
    rescale = pj.alloc(o, (heads, q_rows, 1), dtype)
    pj.submit(o, init, (pj.output(running_max), pj.output(running_sum), pj.output(acc)))
    q_view = pj.narrow(q, 1, q_start, q_start + q_rows)
    for t in range(len(kv_tiles)):
        k_start, k_rows = kv_tiles[t, 0], kv_tiles[t, 1]
        scores = pj.narrow(all_scores, 2, 0, k_rows)
        pj.submit(o, scores_kernel, (pj.input(q_view), pj.input(pj.narrow(k, 1, k_start, k_start + k_rows)),
                                     pj.output(scores)), (q_start, k_start, causal))
        pj.submit(o, update, (pj.inout(scores), pj.inout(running_max), pj.inout(running_sum),
                              pj.output(rescale)))
        pj.submit(o, pv, (pj.input(scores), pj.input(pj.narrow(v, 1, k_start, k_start + k_rows)),
                          pj.input(rescale), pj.inout(acc)))
    pj.submit(o, normalise, (pj.input(acc), pj.input(running_sum),
                             pj.output(pj.narrow(out, 1, q_start, q_start + q_rows))))
    pj.scope_end(o)


def compiled_kernel_ids() -> tuple[int, ...]:
    """The kernel ids attend_tile_compiled takes, in its order."""
    return tuple(k.id for k in (flash_init, flash_scores, flash_softmax_update, flash_pv, flash_normalise))
