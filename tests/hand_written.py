"""The LLaMA layer and flash attention written by hand against the Python orchestrator API: the
oracle for orchestration/programs/llama.pto, run interpreted and compiled. It shares no code
with the ISA compiler, and allocates and frees as the program does (a local tensor freed right
after its last use), so the recorded graphs, addresses included, must be identical."""

from __future__ import annotations

from pto_gpu.kernels.elementwise import add
from pto_gpu.kernels.llm import (
    flash_init,
    flash_normalise,
    flash_pv,
    flash_scores,
    flash_softmax_update,
    rmsnorm,
    rope,
    swiglu,
)
from pto_gpu.kernels.tiles import matmul
from pto_gpu.orchestration.tiling import adaptive_tiles, fixed_tiles

import pto_gpu as pto

EPS = 1e-6


def llama_layer(o: pto.Orchestrator, inputs: dict, adaptive: bool = False) -> None:
    names = ("x", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm", "ffn_norm",
             "q", "k", "v", "attn", "out")
    t = {name: o.external(inputs[name]) for name in names}
    heads = inputs["heads"]
    seq_len, hidden = t["x"].shape
    tiles = adaptive_tiles(seq_len) if adaptive else fixed_tiles(seq_len, 32)

    for first, rows in tiles:
        rs = slice(first, first + rows)
        normed = o.alloc((rows, hidden))
        o.submit(rmsnorm, pto.input(t["x"][rs]), pto.input(t["attn_norm"]), pto.output(normed), EPS)
        for weight, out in (("wq", "q"), ("wk", "k"), ("wv", "v")):
            o.submit(matmul, pto.input(normed), pto.input(t[weight]), pto.output(t[out][rs]))
        o.free(normed)
        o.submit(rope, pto.inout(t["q"][rs]), first, heads)
        o.submit(rope, pto.inout(t["k"][rs]), first, heads)

    def per_head(tensor):  # (seq, hidden) as (heads, seq, head_dim)
        return tensor.reshape(seq_len, heads, hidden // heads).transpose(1, 0, 2)

    q, k, v, attn = (per_head(t[name]) for name in ("q", "k", "v", "attn"))
    widest = min(64 if adaptive else 32, seq_len)
    for q_tile in tiles:
        attend_tile(o, q, k, v, attn, q_tile, tiles, widest, causal=True)

    ffn = t["w_gate"].shape[1]
    for first, rows in tiles:
        rs = slice(first, first + rows)
        projected, residual, normed = (o.alloc((rows, hidden)) for _ in range(3))
        o.submit(matmul, pto.input(t["attn"][rs]), pto.input(t["wo"]), pto.output(projected))
        o.submit(add, pto.input(t["x"][rs]), pto.input(projected), pto.output(residual))
        o.free(projected)
        o.submit(rmsnorm, pto.input(residual), pto.input(t["ffn_norm"]), pto.output(normed), EPS)
        gate, up = o.alloc((rows, ffn)), o.alloc((rows, ffn))
        o.submit(matmul, pto.input(normed), pto.input(t["w_gate"]), pto.output(gate))
        o.submit(matmul, pto.input(normed), pto.input(t["w_up"]), pto.output(up))
        o.free(normed)
        o.submit(swiglu, pto.inout(gate), pto.input(up))
        o.free(up)
        down = o.alloc((rows, hidden))
        o.submit(matmul, pto.input(gate), pto.input(t["w_down"]), pto.output(down))
        o.free(gate)
        o.submit(add, pto.input(residual), pto.input(down), pto.output(t["out"][rs]))
        o.free(residual)
        o.free(down)


def attend_tile(o: pto.Orchestrator, q, k, v, out, q_tile, kv_tiles, widest: int, causal: bool) -> None:
    q_start, q_rows = q_tile
    heads, _, dim = q.shape
    running_max, running_sum = o.alloc((heads, q_rows, 1)), o.alloc((heads, q_rows, 1))
    acc = o.alloc((heads, q_rows, dim))
    all_scores = o.alloc((heads, q_rows, widest))
    rescale = o.alloc((heads, q_rows, 1))
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
    for tensor in (running_max, all_scores, rescale):
        o.free(tensor)
    o.submit(flash_normalise, pto.input(acc), pto.input(running_sum),
             pto.output(out[:, q_start:q_start + q_rows]))
    o.free(running_sum)
    o.free(acc)


def flash_attention(o: pto.Orchestrator, q, k, v, out, tile: int = 64, causal: bool = False) -> None:
    Q, K, V, OUT = (o.external(a) for a in (q, k, v, out))
    tiles = fixed_tiles(Q.shape[1], tile)
    for q_tile in tiles:
        kv_tiles = [t for t in tiles if not causal or t[0] < q_tile[0] + q_tile[1]]
        attend_tile(o, Q, K, V, OUT, q_tile, kv_tiles, min(tile, Q.shape[1]), causal)
