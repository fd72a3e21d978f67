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
