"""Flash attention over (heads, seq, head_dim) arrays: query tiles against key/value tiles
with the online softmax, any seq_len (the last tile may be partial)."""

import pto_gpu as pto
from kernels.llm import flash_init, flash_normalise, flash_pv, flash_scores, flash_softmax_update
from orchestration.tiling import fixed_tiles


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
