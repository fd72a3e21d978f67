"""One LLaMA-7B decoder layer (spec 003 §4.4): 16 tasks per row tile, 3 per attention pair.

Per tile: RMSNorm; Q, K, V projections; RoPE on q and k; flash-attention init and normalise;
output projection; residual; RMSNorm; gate and up projections; SwiGLU; down projection;
residual. Per (query tile, key tile) pair: scores, online-softmax update, output update.
Attention is causal by masking, over every pair, so the counts are the spec's:
16·N + 3·N² for N tiles (32-row tiles, or the adaptive tiling of tiling.adaptive_tiles).
"""

from __future__ import annotations

import numpy as np

import pto_gpu as pto
from kernels.elementwise import add
from kernels.llm import rmsnorm, rope, swiglu
from kernels.tiles import matmul
from orchestration.flash_attention import attend_tile
from orchestration.tiling import adaptive_tiles, fixed_tiles

EPS = 1e-6
WEIGHTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm", "ffn_norm")
WORKSPACES = ("q", "k", "v", "attn", "out")


def llama_layer_inputs(seq_len: int, hidden: int = 4096, heads: int = 32, ffn: int = 11008,
                       seed: int = 0, lazy: bool = False) -> dict:
    """The layer's input x, weights, and workspaces (q, k, v, attn) plus the output `out`.

    lazy=True gives np.empty arrays (no pages touched), for graph-only runs at large sizes.
    """
    if hidden % heads or (hidden // heads) % 2:
        raise ValueError(f"hidden={hidden} must split into {heads} heads of even size")
    shapes = {"x": (seq_len, hidden), "wq": (hidden, hidden), "wk": (hidden, hidden),
              "wv": (hidden, hidden), "wo": (hidden, hidden), "w_gate": (hidden, ffn),
              "w_up": (hidden, ffn), "w_down": (ffn, hidden), "attn_norm": (1, hidden),
              "ffn_norm": (1, hidden)}
    shapes.update({name: (seq_len, hidden) for name in WORKSPACES})
    if lazy:
        arrays = {name: np.empty(shape, np.float32) for name, shape in shapes.items()}
    else:
        rng = np.random.default_rng(seed)
        arrays = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
        arrays["x"][...] = rng.standard_normal(shapes["x"])
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            arrays[name][...] = rng.standard_normal(shapes[name]) / np.sqrt(shapes[name][0])
        for name in ("attn_norm", "ffn_norm"):
            arrays[name][...] = 1 + 0.1 * rng.standard_normal(shapes[name])
    arrays["heads"] = heads
    return arrays


def llama_layer(o: pto.Orchestrator, inputs: dict, adaptive: bool = False) -> None:
    t = {name: o.external(inputs[name]) for name in ("x", *WEIGHTS, *WORKSPACES)}
    heads = inputs["heads"]
    seq_len, hidden = t["x"].shape
    tiles = adaptive_tiles(seq_len) if adaptive else fixed_tiles(seq_len, 32)

    def per_head(tensor, first, rows):  # (rows, hidden) tile as (heads, rows, head_dim)
        return tensor[first:first + rows].reshape(rows, heads, hidden // heads).transpose(1, 0, 2)

    for first, rows in tiles:  # pre-attention: every tile independent
        rs = slice(first, first + rows)
        with o.scope():
            normed = o.alloc((rows, hidden))
            o.submit(rmsnorm, pto.input(t["x"][rs]), pto.input(t["attn_norm"]), pto.output(normed), EPS)
            for weight, out in (("wq", "q"), ("wk", "k"), ("wv", "v")):
                o.submit(matmul, pto.input(normed), pto.input(t[weight]), pto.output(t[out][rs]))
        o.submit(rope, pto.inout(t["q"][rs]), first, heads)
        o.submit(rope, pto.inout(t["k"][rs]), first, heads)

    q, k, v, attn = (per_head(t[name], 0, seq_len) for name in ("q", "k", "v", "attn"))
    for tile in tiles:  # attention: each query tile against every key tile, causally masked
        attend_tile(o, q, k, v, attn, tile, tiles, causal=True)

    for first, rows in tiles:  # post-attention: every tile independent again
        rs = slice(first, first + rows)
        with o.scope():
            projected = o.alloc((rows, hidden))
            residual = o.alloc((rows, hidden))
            normed = o.alloc((rows, hidden))
            o.submit(matmul, pto.input(t["attn"][rs]), pto.input(t["wo"]), pto.output(projected))
            o.submit(add, pto.input(t["x"][rs]), pto.input(projected), pto.output(residual))
            o.submit(rmsnorm, pto.input(residual), pto.input(t["ffn_norm"]), pto.output(normed), EPS)
            ffn = t["w_gate"].shape[1]
            gate = o.alloc((rows, ffn))
            up = o.alloc((rows, ffn))
            o.submit(matmul, pto.input(normed), pto.input(t["w_gate"]), pto.output(gate))
            o.submit(matmul, pto.input(normed), pto.input(t["w_up"]), pto.output(up))
            o.submit(swiglu, pto.inout(gate), pto.input(up))
            down = o.alloc((rows, hidden))
            o.submit(matmul, pto.input(gate), pto.input(t["w_down"]), pto.output(down))
            o.submit(add, pto.input(residual), pto.input(down), pto.output(t["out"][rs]))


def expected_tasks(num_tiles: int) -> int:
    """16 tasks per tile plus 3 per attention pair (spec 003 §4.4)."""
    return 16 * num_tiles + 3 * num_tiles ** 2
