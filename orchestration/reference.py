"""float64 numpy references for the workloads, written from the maths, not from the kernels."""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, dtype=np.float64) -> np.ndarray:
    x = x.astype(dtype, copy=False)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, causal: bool = False, dtype=np.float64) -> np.ndarray:
    """softmax(q kᵀ / √d) v per head; q, k, v are (heads, seq, head_dim).

    dtype=np.float32 gives the monolithic numpy implementation that benchmarks time.
    """
    q, k, v = (a.astype(dtype, copy=False) for a in (q, k, v))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[1]
        scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    return softmax(scores, dtype) @ v


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotary(x, heads):
    """Rotate each head's halves by angle position · 10000^(-2i/d)."""
    seq, width = x.shape
    dim = width // heads
    half = dim // 2
    angle = np.arange(seq)[:, None] * 10000.0 ** (-np.arange(half) * 2.0 / dim)
    h = x.reshape(seq, heads, dim)
    a, b = h[..., :half], h[..., half:]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(seq, width)


def llama_layer(inputs: dict, eps: float = 1e-6) -> np.ndarray:
    w = {name: np.asarray(value, np.float64) for name, value in inputs.items() if name != "heads"}
    heads = inputs["heads"]
    x = w["x"]
    seq, hidden = x.shape
    normed = rms_norm(x, w["attn_norm"], eps)
    q, k, v = rotary(normed @ w["wq"], heads), rotary(normed @ w["wk"], heads), normed @ w["wv"]

    def split(a):
        return a.reshape(seq, heads, hidden // heads).transpose(1, 0, 2)

    attended = attention(split(q), split(k), split(v), causal=True).transpose(1, 0, 2).reshape(seq, hidden)
    residual = x + attended @ w["wo"]
    normed = rms_norm(residual, w["ffn_norm"], eps)
    gate, up = normed @ w["w_gate"], normed @ w["w_up"]
    return residual + (gate / (1 + np.exp(-gate)) * up) @ w["w_down"]


def sparse_attention(x, weights, sizes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One sequence of DeepSeek-style block-sparse attention (orchestration/sparse_attention.py):
    the output; per query block, its top-k earlier key blocks by the lightning indexer's scores
    (-1 where fewer); and, per block with blocks left out, the k-th score's margin over the next."""
    x = x.astype(np.float64)
    w = {name: a.astype(np.float64) for name, a in weights.items()}
    seq, block, heads = x.shape[0], sizes.block, sizes.heads
    q, k, v = (x @ w[name] for name in ("wq", "wk", "wv"))
    q_index = (x @ w["wq_index"]).reshape(seq, sizes.index_heads, sizes.index_dim)
    k_index, w_index = x @ w["wk_index"], x @ w["w_index"]
    # I[t, s] = sum_j w[t, j] relu(q[t, j] . k[s])
    index = np.einsum("tj,tjs->ts", w_index, np.maximum(np.einsum("tjd,sd->tjs", q_index, k_index), 0))
    blocks = seq // block
    chosen = np.full((blocks, sizes.top_k), -1)
    margins = []
    out = np.zeros_like(q)
    for tile in range(blocks):
        rows = slice(tile * block, (tile + 1) * block)
        scores = index[rows, :tile * block].reshape(block, tile, block).sum(axis=(0, 2))
        ranked = sorted(range(tile), key=lambda c: -scores[c])
        picked = sorted(ranked[:sizes.top_k])
        chosen[tile, :len(picked)] = picked
        if 0 < sizes.top_k < len(ranked):
            margins.append(scores[ranked[sizes.top_k - 1]] - scores[ranked[sizes.top_k]])
        keys = np.concatenate([np.arange(c * block, (c + 1) * block) for c in picked + [tile]])
        for head in range(heads):
            cols = slice(head * sizes.head_dim, (head + 1) * sizes.head_dim)
            s = q[rows, cols] @ k[keys, cols].T / np.sqrt(sizes.head_dim)
            visible = keys[None, :] <= np.arange(tile * block, (tile + 1) * block)[:, None]
            out[rows, cols] = softmax(np.where(visible, s, -np.inf)) @ v[keys, cols]
    return out, chosen, np.array(margins)
