"""Composite tiles for LLM layers: RMSNorm, rotary embedding, SwiGLU, flash-attention blocks.

Attention kernels take (heads, rows, head_dim) views, so one task covers every head of a
tile. The flash-attention state of a query tile is its running max m and sum l, each
(heads, rows, 1), and its unnormalised output o. Each (query tile, key tile) pair is three
tasks: scores S = q·kᵀ/√d (masked when causal), the online-softmax update (S becomes
P = exp(S − m_new), l and m move on, `rescale` = exp(m_old − m_new)), and o = o·rescale + P·v.
"""

import math

import numpy as np
from pto_gpu.kernels import cuda, every_element, every_row

import pto_gpu as pto

LLM = "llm.cu"


@pto.kernel(worker=pto.VECTOR, shapes=("m n", "1 n", "m n"), cuda=cuda(LLM, every_row(0)))
def rmsnorm(x, weight, out, eps):
    mean_square = np.mean(np.square(x), axis=1, keepdims=True)
    np.multiply(x / np.sqrt(mean_square + eps), weight, out=out)


@pto.kernel(worker=pto.VECTOR, shapes=("m n",), cuda=cuda(LLM, lambda shapes: math.prod(shapes[0]) // 2))
def rope(x, first_position, heads):
    """Rotate each head's two halves by position-dependent angles (in place)."""
    rows, width = x.shape
    dim = width // heads
    half = dim // 2
    positions = np.arange(first_position, first_position + rows, dtype=np.float64)[:, None]
    angles = positions * 10000.0 ** (-np.arange(half) * 2.0 / dim)
    cos = np.cos(angles).astype(x.dtype)[:, None, :]
    sin = np.sin(angles).astype(x.dtype)[:, None, :]
    heads_view = x.reshape(rows, heads, dim)
    first, second = heads_view[..., :half], heads_view[..., half:]
    rotated = np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    x[...] = rotated.reshape(rows, width)


@pto.kernel(worker=pto.VECTOR, shapes=("m f", "m f"), cuda=cuda(LLM, every_element(0)))
def swiglu(gate, up):
    """gate = silu(gate) * up (in place)."""
    gate *= up / (1 + np.exp(-gate))


@pto.kernel(worker=pto.VECTOR, shapes=("h m 1", "h m 1", "h m d"), cuda=cuda(LLM, every_element(2)))
def flash_init(running_max, running_sum, out):
    running_max[...] = -np.inf
    running_sum[...] = 0
    out[...] = 0


@pto.kernel(worker=pto.CUBE, shapes=("h m d", "h n d", "h m n"), cuda=cuda(LLM, every_element(2)))
def flash_scores(q, k, scores, q_start, k_start, causal):
    np.matmul(q, k.transpose(0, 2, 1), out=scores)
    scores *= 1.0 / np.sqrt(q.shape[2])
    if causal:
        q_pos = np.arange(q_start, q_start + q.shape[1])[:, None]
        k_pos = np.arange(k_start, k_start + k.shape[1])[None, :]
        scores[:, k_pos > q_pos] = -np.inf


@pto.kernel(worker=pto.VECTOR, shapes=("h m n", "h m 1", "h m 1", "h m 1"), cuda=cuda(LLM, every_row(0)))
def flash_softmax_update(scores, running_max, running_sum, rescale):
    new_max = np.maximum(running_max, scores.max(axis=2, keepdims=True))
    np.exp(running_max - new_max, out=rescale)
    np.exp(scores - new_max, out=scores)
    running_sum *= rescale
    running_sum += scores.sum(axis=2, keepdims=True)
    running_max[...] = new_max


@pto.kernel(worker=pto.CUBE, shapes=("h m n", "h n d", "h m 1", "h m d"), cuda=cuda(LLM, every_element(3)))
def flash_pv(probabilities, v, rescale, out):
    out *= rescale
    out += probabilities @ v


@pto.kernel(worker=pto.VECTOR, shapes=("h m d", "h m 1", "h m d"), cuda=cuda(LLM, every_element(2)))
def flash_normalise(acc, running_sum, out):
    np.divide(acc, running_sum, out=out)
