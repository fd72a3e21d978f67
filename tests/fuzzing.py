"""Random orchestrations for differential testing against the serial executor and the
independent dependency oracle (oracle.py).

A program is drawn from a seed: strided and transposed slices of a few external buffers
(and of aliasing views of them in other dtypes and strides), both overlap levels, alloc / free
/ scopes / versions, and input / output / inout params of VECTOR kernels and of kernels that run
on CUBE or VECTOR (placed by HEFT), whose every output depends on every input. Besides
256-512 B buffers there are owners of 8 KiB to 1 MiB, sliced into small tiles as well as
large windows, so that regions hash by their 4 KiB TensorMap blocks, long ones by the owner's
wide chain (docs/ARCHITECTURE.md, "TensorMap hashing"). `describe` lists the ops, for failure
reports.

`native_plan` draws programs of the kernel library's generated kernels instead, which native
workers run without the GIL: `compiled_plan` submits one from compiled code, `python_plan`
the same tasks through o.submit.
"""

from __future__ import annotations

import numba
import numpy as np
from pto_gpu.kernels.elementwise import add, scale
from pto_gpu.kernels.llm import swiglu

import pto_gpu as pto
from pto_gpu import jit as pj


def _combine(n_inputs, *views):
    """Every output depends on every input: out = out / 2 + sum(inputs) + 1 (cast back)."""
    with np.errstate(all="ignore"):  # reinterpreted bytes make NaNs and infs, deterministically
        total = sum(float(v.sum(dtype=np.float64)) for v in views[:n_inputs]) % 1000.0 + 1.0
        for out in views[n_inputs:]:
            out[...] = (out * 0.5 + total).astype(out.dtype)


# Either class: the sim and thread executors place each of its tasks by earliest finish (HEFT).
combine_either = pto.kernel(worker=(pto.CUBE, pto.VECTOR), name="combine_either", mixed_dtypes=True)(_combine)
combine_vector = pto.kernel(worker=pto.VECTOR, name="combine_vector", mixed_dtypes=True)(_combine)


@pto.kernel(worker=pto.VECTOR)
def stamp(out, value):
    out[...] = value


def make_buffers() -> list[np.ndarray]:
    return [np.arange(64, dtype=np.float64).reshape(8, 8) / 7, np.ones((8, 8)), np.zeros((4, 16), np.float32),
            np.linspace(0, 1, 512 * 512, dtype=np.float32).reshape(512, 512),  # 1 MiB: 256 blocks
            np.zeros((96, 80)),  # 60 KiB: 15 blocks
            np.arange(4096, dtype=np.int16).reshape(64, 64)]  # 8 KiB: 2 blocks


def _aliases(buffers) -> list[np.ndarray]:
    """Views of the buffers that the runtime must resolve to their owners."""
    first, big, mid = buffers[0], buffers[3], buffers[4]
    return [first[2:, :], first.view(np.float32), first.view(np.uint8)[:, :32],
            big.view(np.float64), big[1::3, 8:], big.view(np.uint8)[100:300, 1000:], mid.view(np.int32).T]


def _slice(rng, t):
    key = []
    for n in t.shape:
        start = int(rng.integers(0, n))
        if rng.random() < 0.4:  # a tile of a few elements: what a big owner's blocks hash
            stop = min(n, start + int(rng.integers(1, 17)))
        else:
            stop = int(rng.integers(start + 1, n + 1))
        key.append(slice(start, stop, int(rng.integers(1, 3))))
    view = t[tuple(key)]
    if rng.random() < 0.2:
        view = view.T
    if rng.random() < 0.2:
        view = view.with_overlap(pto.Overlap.BOUNDING_BOX)
    return view


# One heap buffer shape per program: 512 B (one block) or 32 or 128 KiB (8 or 32 blocks). Mixed
# sizes would let the ring's placement, which depends on when earlier buffers die, decide
# whether a heap of the serial high-water mark is big enough, and executors could disagree.
HEAP_SHAPES = [((8, 8), pto.FLOAT64), ((16, 512), pto.FLOAT32), ((64, 512), pto.FLOAT32)]


def random_program(o, buffers, seed: int, n_ops: int, log: list | None = None) -> None:
    rng = np.random.default_rng(seed)
    heap_shape = HEAP_SHAPES[int(rng.integers(len(HEAP_SHAPES)))]
    externals = [o.external(b) for b in buffers + _aliases(buffers)]
    live = []

    def note(*what):
        if log is not None:
            log.append(" ".join(str(w) for w in what))

    for _ in range(n_ops):
        r = rng.random()
        if r < 0.12:
            t = o.alloc(*heap_shape)
            note("alloc", t.buffer.key)
            o.submit(stamp, pto.output(t), float(rng.integers(10)))
            live.append(t)
        elif r < 0.2 and live:
            t = live.pop(int(rng.integers(len(live))))
            note("free", t.buffer.key)
            o.free(t)
        elif r < 0.25 and live:
            i = int(rng.integers(len(live)))
            live[i] = o.version_inc(live[i])
            note("version_inc", live[i].buffer.key, "->", live[i].version)
        elif r < 0.3:
            with o.scope():
                t = o.alloc(*heap_shape)
                target = _slice(rng, externals[int(rng.integers(len(externals)))])
                note("scope: alloc", t.buffer.key, "stamp, combine into", target)
                o.submit(stamp, pto.output(t), 3.0)
                o.submit(combine_vector, 1, pto.input(t), pto.inout(target))
        else:
            pool = externals + live
            n_in, n_out = int(rng.integers(0, 3)), int(rng.integers(1, 3))
            picks = [_slice(rng, pool[int(rng.integers(len(pool)))]) for _ in range(n_in + n_out)]
            kinds = [pto.input] * n_in + [pto.inout if rng.random() < 0.5 else pto.output
                                          for _ in range(n_out)]
            kernel = combine_either if rng.random() < 0.5 else combine_vector
            note(kernel.name, *(f"{k.__name__}({t!r})" for k, t in zip(kinds, picks)))
            o.submit(kernel, n_in, *(k(t) for k, t in zip(kinds, picks)))
    for t in live:
        o.free(t)


def run(executor: str, seed: int, n_ops: int, threshold: int = 0, schedule: pto.Schedule | None = None,
        **config):
    """Run one program; (buffers after, RunResult or the DeadlockError raised)."""
    buffers = make_buffers()
    rt = pto.Runtime(backend="cpu", executor=executor, validate=True, **config)
    try:
        result = rt.run(random_program, buffers, seed, n_ops, record=True, threshold=threshold,
                        schedule=schedule)
    except pto.DeadlockError as error:
        return buffers, error
    return buffers, result


def describe(seed: int, n_ops: int) -> str:
    log: list[str] = []
    pto.Runtime(backend="cpu", executor="dry").run(random_program, make_buffers(), seed, n_ops, log)
    return "\n".join(f"  {i:3d}: {line}" for i, line in enumerate(log))


# --- programs of generated kernels, for native workers ------------------------------------------
# A plan row: (op, source array, rows, cols, height, width, destination rows, cols), between
# two (16, 32) float32 arrays: the destination is in the other array, so tasks meet only
# through regions. Ops 0-2 are one task (scale, add, swiglu); op 3 is scale into a heap tile
# allocated for it, add of that tile into the destination, and the tile's free.
PLAN_SHAPE = (16, 32)
HEAP_TILE = 4 * 16 * 4  # bytes of the largest heap tile


def native_plan(rng: np.random.Generator, rows: int) -> np.ndarray:
    plan = []
    for _ in range(rows):
        h, w = int(rng.choice([2, 4])), int(rng.choice([8, 16]))
        plan.append([rng.integers(0, 4), rng.integers(0, 2), rng.integers(0, 17 - h), rng.integers(0, 33 - w),
                     h, w, rng.integers(0, 17 - h), rng.integers(0, 33 - w)])
    return np.array(plan, np.int64)


@numba.njit(cache=True)
def _planned(o, a, b, plan, scale_id, add_id, swiglu_id):
    for i in range(plan.shape[0]):
        op, which, r, c, h, w, dr, dc = plan[i]
        src, dst = (a, b) if which == 0 else (b, a)
        source = pj.narrow(pj.narrow(src, 0, r, r + h), 1, c, c + w)
        target = pj.narrow(pj.narrow(dst, 0, dr, dr + h), 1, dc, dc + w)
        if op == 0:
            pj.submit(o, scale_id, (pj.input(source), pj.output(target)), (0.75,))
        elif op == 1:
            pj.submit(o, add_id, (pj.input(source), pj.input(target), pj.output(target)))
        elif op == 2:
            pj.submit(o, swiglu_id, (pj.inout(target), pj.input(source)))
        else:
            tile = pj.alloc(o, (h, w), pj.dtype(src))
            pj.submit(o, scale_id, (pj.input(source), pj.output(tile)), (0.75,))
            pj.submit(o, add_id, (pj.input(tile), pj.input(target), pj.output(target)))
            pj.free(o, tile)


def compiled_plan(o, a, b, plan) -> None:
    """The plan submitted by compiled code."""
    o.compiled(_planned, o.external(a), o.external(b), plan, scale.id, add.id, swiglu.id)


def python_plan(o, a, b, plan) -> None:
    """The same tasks, through o.submit."""
    arrays = (o.external(a), o.external(b))
    for op, which, r, c, h, w, dr, dc in plan.tolist():
        source = arrays[which][r:r + h, c:c + w]
        target = arrays[1 - which][dr:dr + h, dc:dc + w]
        if op == 0:
            o.submit(scale, pto.input(source), pto.output(target), 0.75)
        elif op == 1:
            o.submit(add, pto.input(source), pto.input(target), pto.output(target))
        elif op == 2:
            o.submit(swiglu, pto.inout(target), pto.input(source))
        else:
            tile = o.alloc((h, w), pto.FLOAT32)
            o.submit(scale, pto.input(source), pto.output(tile), 0.75)
            o.submit(add, pto.input(tile), pto.input(target), pto.output(target))
            o.free(tile)
