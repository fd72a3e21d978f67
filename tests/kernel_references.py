"""float64 numpy semantics of every kernel of pto_gpu.kernels, written independently of the
PTO programs they are generated from: the oracle of the kernel tests. Each takes the kernel's
arrays (float64 copies; outputs and in-place params are written) and scalars."""

import numpy as np


def tf32_rounded(x: np.ndarray) -> np.ndarray:
    """Finite float32 values rounded to TF32 as cvt.rna.tf32.f32 does (10 mantissa bits, to
    nearest, ties away from zero: add half of the 13 dropped bits to the bits and drop them),
    in float64."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)).view(np.float32).astype(np.float64)


def _rope(x, first_position, heads):
    rows, width = x.shape
    dim = width // heads
    half = dim // 2
    positions = np.arange(first_position, first_position + rows, dtype=np.float64)[:, None]
    angles = positions * 10000.0 ** (-np.arange(half) * 2.0 / dim)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    heads_view = x.reshape(rows, heads, dim)
    first, second = heads_view[..., :half].copy(), heads_view[..., half:].copy()
    heads_view[..., :half] = first * cos - second * sin
    heads_view[..., half:] = second * cos + first * sin


def _flash_scores(q, k, scores, q_start, k_start, causal):
    scores[...] = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[2])
    if causal:
        q_pos = np.arange(q_start, q_start + q.shape[1])[:, None]
        k_pos = np.arange(k_start, k_start + k.shape[1])[None, :]
        scores[:, k_pos > q_pos] = -np.inf


def _flash_softmax_update(scores, running_max, running_sum, rescale):
    new_max = np.maximum(running_max, scores.max(axis=2, keepdims=True))
    rescale[...] = np.exp(running_max - new_max)
    scores[...] = np.exp(scores - new_max)
    running_sum[...] = running_sum * rescale + scores.sum(axis=2, keepdims=True)
    running_max[...] = new_max


def _flash_attention_tile(q, k, v, out, q_start, causal):
    scores = np.empty((q.shape[0], q.shape[1], k.shape[1]))
    _flash_scores(q, k, scores, q_start, 0, causal)
    weights = np.exp(scores - scores.max(axis=2, keepdims=True))
    out[...] = weights / weights.sum(axis=2, keepdims=True) @ v


def _set(out, value):
    out[...] = value


REFERENCES = {
    "copy": lambda src, dst: _set(dst, src),
    "copy_batched": lambda src, dst: _set(dst, src),
    "zero": lambda out: _set(out, 0),
    "matmul": lambda a, b, out: _set(out, a @ b),
    "matmul_acc": lambda a, b, acc: _set(acc, acc + a @ b),
    "matmul_panels": lambda a, b, out: _set(out, a @ b),  # a (m, k) against each panel b[q]
    "matmul_panels_acc": lambda a, b, acc: _set(acc, acc + a @ b),
    "matmul_panels_add": lambda a, b, acc, out: _set(out, acc + a @ b),
    "add": lambda a, b, out: _set(out, a + b),
    "sub": lambda a, b, out: _set(out, a - b),
    "mul": lambda a, b, out: _set(out, a * b),
    "div": lambda a, b, out: _set(out, a / b),
    "exp": lambda a, out: _set(out, np.exp(a)),
    "log": lambda a, out: _set(out, np.log(a)),
    "sqrt": lambda a, out: _set(out, np.sqrt(a)),
    "silu": lambda a, out: _set(out, a / (1 + np.exp(-a))),
    "scale": lambda a, out, factor: _set(out, a * factor),
    "row_sum": lambda a, out: _set(out, a.sum(axis=1, keepdims=True)),
    "row_max": lambda a, out: _set(out, a.max(axis=1, keepdims=True)),
    "col_sum": lambda a, out: _set(out, a.sum(axis=0, keepdims=True)),
    "row_expand_sub": lambda a, b, out: _set(out, a - b),
    "row_expand_div": lambda a, b, out: _set(out, a / b),
    "row_expand_mul": lambda a, b, out: _set(out, a * b),
    "rmsnorm": lambda x, w, out, eps: _set(out, x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * w),
    "rope": _rope,
    "swiglu": lambda gate, up: _set(gate, gate / (1 + np.exp(-gate)) * up),
    "flash_init": lambda m, l, o: (_set(m, -np.inf), _set(l, 0), _set(o, 0)),
    "flash_scores": _flash_scores,
    "flash_softmax_update": _flash_softmax_update,
    "flash_pv": lambda p, v, rescale, out: _set(out, out * rescale + p @ v),
    "flash_normalise": lambda acc, l, out: _set(out, acc / l),
    "flash_attention_tile": _flash_attention_tile,
}
