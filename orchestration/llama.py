"""One LLaMA-7B decoder layer (spec 003 §4.4): 16 tasks per row tile, 3 per attention pair.

Per tile: RMSNorm; Q, K, V projections; RoPE on q and k; flash-attention init and normalise;
output projection; residual; RMSNorm; gate and up projections; SwiGLU; down projection;
residual. Per (query tile, key tile) pair: scores, online-softmax update, output update.
Attention is causal by masking, over every pair, so the counts are the spec's:
16·N + 3·N² for N tiles (32-row tiles, or the adaptive tiling of tiling.adaptive_tiles).
"""

from __future__ import annotations

import numba
import numpy as np
from pto_gpu.kernels.elementwise import add
from pto_gpu.kernels.llm import rmsnorm, rope, swiglu
from pto_gpu.kernels.tiles import matmul
from pto_gpu.orchestration.flash_attention import attend_tile, attend_tile_compiled, compiled_kernel_ids
from pto_gpu.orchestration.tiling import adaptive_tiles, fixed_tiles

import pto_gpu as pto
from pto_gpu import jit as pj

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


def llama_layer_compiled(o: pto.Orchestrator, inputs: dict, adaptive: bool = False) -> None:
    """llama_layer with its loops compiled (pto_gpu.jit): the same tasks and edges."""
    t = [o.external(inputs[name]) for name in ("x", *WEIGHTS, *WORKSPACES)]
    seq_len = t[0].shape[0]
    tiles = adaptive_tiles(seq_len) if adaptive else fixed_tiles(seq_len, 32)
    tiles = np.array(tiles, np.int64).reshape(-1, 2)
    kernel_ids = tuple(k.id for k in (rmsnorm, matmul, rope, add, swiglu))
    o.compiled(_llama_body, *t, tiles, inputs["heads"], kernel_ids, compiled_kernel_ids())


@numba.njit(cache=True)
def _llama_body(o, x, wq, wk, wv, wo, w_gate, w_up, w_down, attn_norm, ffn_norm, q, k, v, attn, out,
                tiles, heads, kernel_ids, flash_ids):
    norm_kernel, matmul_kernel, rope_kernel, add_kernel, swiglu_kernel = kernel_ids
    hidden = pj.shape(x, 1)
    ffn = pj.shape(w_gate, 1)
    dtype = pj.dtype(x)
    for i in range(len(tiles)):  # pre-attention
        first, rows = tiles[i, 0], tiles[i, 1]
        pj.scope_begin(o)
        normed = pj.alloc(o, (rows, hidden), dtype)
        pj.submit(o, norm_kernel, (pj.input(pj.narrow(x, 0, first, first + rows)), pj.input(attn_norm),
                                   pj.output(normed)), (EPS,))
        for weight, result in ((wq, q), (wk, k), (wv, v)):
            pj.submit(o, matmul_kernel, (pj.input(normed), pj.input(weight),
                                         pj.output(pj.narrow(result, 0, first, first + rows))))
        pj.scope_end(o)
        pj.submit(o, rope_kernel, (pj.inout(pj.narrow(q, 0, first, first + rows)),), (first, heads))
        pj.submit(o, rope_kernel, (pj.inout(pj.narrow(k, 0, first, first + rows)),), (first, heads))

    head_dim = hidden // heads
    q_heads, k_heads, v_heads, attn_heads = (_per_head(q, head_dim), _per_head(k, head_dim),
                                             _per_head(v, head_dim), _per_head(attn, head_dim))
    for i in range(len(tiles)):  # attention
        attend_tile_compiled(o, flash_ids, q_heads, k_heads, v_heads, attn_heads,
                             (tiles[i, 0], tiles[i, 1]), tiles, 1)

    for i in range(len(tiles)):  # post-attention
        first, rows = tiles[i, 0], tiles[i, 1]
        pj.scope_begin(o)
        projected = pj.alloc(o, (rows, hidden), dtype)
        residual = pj.alloc(o, (rows, hidden), dtype)
        normed = pj.alloc(o, (rows, hidden), dtype)
        pj.submit(o, matmul_kernel, (pj.input(pj.narrow(attn, 0, first, first + rows)), pj.input(wo),
                                     pj.output(projected)))
        pj.submit(o, add_kernel, (pj.input(pj.narrow(x, 0, first, first + rows)), pj.input(projected),
                                  pj.output(residual)))
        pj.submit(o, norm_kernel, (pj.input(residual), pj.input(ffn_norm), pj.output(normed)), (EPS,))
        gate = pj.alloc(o, (rows, ffn), dtype)
        up = pj.alloc(o, (rows, ffn), dtype)
        pj.submit(o, matmul_kernel, (pj.input(normed), pj.input(w_gate), pj.output(gate)))
        pj.submit(o, matmul_kernel, (pj.input(normed), pj.input(w_up), pj.output(up)))
        pj.submit(o, swiglu_kernel, (pj.inout(gate), pj.input(up)))
        down = pj.alloc(o, (rows, hidden), dtype)
        pj.submit(o, matmul_kernel, (pj.input(gate), pj.input(w_down), pj.output(down)))
        pj.submit(o, add_kernel, (pj.input(residual), pj.input(down),
                                  pj.output(pj.narrow(out, 0, first, first + rows))))
        pj.scope_end(o)


@numba.njit(cache=True)
def _per_head(tensor, head_dim):  # (seq, hidden) as (heads, seq, head_dim)
    return pj.swap(pj.split(tensor, 1, head_dim), 0, 1)


def expected_tasks(num_tiles: int) -> int:
    """16 tasks per tile plus 3 per attention pair (spec 003 §4.4)."""
    return 16 * num_tiles + 3 * num_tiles ** 2
