"""The `pto-gpu` command: run one of the orchestrations here, print its statistics, write artefacts.

    pto-gpu run flash_attention --size 2048 --trace attention.json --graph attention.svg

Each run is checked against its numpy float64 reference (unless the executor is dry); the exit
status is 1 when the result is off by more than the workload's tolerance.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import numpy as np
from pto_gpu.orchestration import reference
from pto_gpu.orchestration.flash_attention import flash_attention
from pto_gpu.orchestration.llama import llama_layer, llama_layer_compiled, llama_layer_inputs
from pto_gpu.orchestration.matmul import tiled_matmul
from pto_gpu.orchestration.softmax import fused_softmax

import pto_gpu as pto
from pto_gpu.runtime import EXECUTORS


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A workload at one size, with host (numpy) arguments."""

    orchestration: Callable
    args: tuple
    options: dict
    output: Callable[[tuple], object]  # the output array among `args` (or a device copy of them)
    reference: Callable[[], np.ndarray]  # the float64 numpy result


@dataclasses.dataclass(frozen=True)
class Workload:
    summary: str  # what --size means is part of it
    default_size: int
    tolerance: float  # relative to the reference's largest magnitude; see tests/test_workloads.py
    prepare: Callable[[int, np.random.Generator], Prepared]


def _matmul(n, rng) -> Prepared:
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    return Prepared(tiled_matmul, (a, b, np.zeros((n, n), np.float32)), {"tile": 128}, lambda args: args[2],
                    lambda: a.astype(np.float64) @ b)


def _softmax(rows, rng) -> Prepared:
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    return Prepared(fused_softmax, (x, np.zeros_like(x)), {"tile_rows": 32}, lambda args: args[1],
                    lambda: reference.softmax(x))


def _flash_attention(seq, rng) -> Prepared:
    q, k, v = (rng.standard_normal((8, seq, 64)).astype(np.float32) for _ in range(3))
    return Prepared(flash_attention, (q, k, v, np.zeros_like(q)), {"tile": 128, "causal": True},
                    lambda args: args[3], lambda: reference.attention(q, k, v, causal=True))


def _llama(orchestration: Callable) -> Callable[[int, np.random.Generator], Prepared]:
    def prepare(seq, rng) -> Prepared:
        inputs = llama_layer_inputs(seq, hidden=1024, heads=16, ffn=2752, seed=int(rng.integers(1 << 31)))
        return Prepared(orchestration, (inputs,), {"adaptive": True}, lambda args: args[0]["out"],
                        lambda: reference.llama_layer(inputs))
    return prepare


def to_backend(backend, value):
    """`value` with every numpy array in it (or in its dict) moved to the backend's memory."""
    if isinstance(value, dict):
        return {key: to_backend(backend, item) for key, item in value.items()}
    return backend.to_device(value) if isinstance(value, np.ndarray) else value


WORKLOADS = {
    "matmul": Workload("tiled float32 matmul, size x size, 128-square tiles", 1024, 1e-4, _matmul),
    "softmax": Workload("row softmax of size x 256 float32, 32-row tiles", 4096, 1e-5, _softmax),
    "flash_attention": Workload("causal flash attention, 8 heads x size x 64, 128-row tiles", 1024, 1e-4,
                                _flash_attention),
    "llama": Workload("one LLaMA layer (hidden 1024, 16 heads, ffn 2752) over size tokens, adaptive "
                      "tiles", 256, 1e-4, _llama(llama_layer)),
    "llama_compiled": Workload("the llama workload, orchestrated by compiled (numba) code", 256, 1e-4,
                               _llama(llama_layer_compiled)),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pto-gpu", description="Run PTO task graphs on a GPU or CPU.")
    commands = top.add_subparsers(dest="command", required=True)
    catalogue = "\n".join(f"  {name:<16} {w.summary} (default size {w.default_size})"
                          for name, w in WORKLOADS.items())
    command = commands.add_parser(
        "run", help="run an orchestration and print its statistics",
        description="Run an orchestration, check it against numpy, and print the run's statistics.",
        epilog="orchestrations:\n" + catalogue, formatter_class=argparse.RawDescriptionHelpFormatter)
    option = command.add_argument
    option("name", choices=WORKLOADS, metavar="NAME", help="which orchestration (listed below)")
    option("--size", type=int, help="problem size, as each orchestration defines it below")
    option("--backend", choices=("auto", "cpu", "cuda"), default="auto",
           help="where kernels run (default: auto, the GPU when there is one)")
    option("--executor", choices=EXECUTORS, default="auto",
           help="stream: issue-ahead onto streams per worker class; parallel: worker threads; "
                "serial: one thread (the reference); dry: build the graph without running "
                "kernels (default: auto, stream on a GPU and parallel on the CPU)")
    option("--trace", type=Path, metavar="FILE",
           help="write the timeline as Chrome-trace JSON; open it in ui.perfetto.dev")
    option("--dump", type=Path, metavar="FILE", help="write the task dump (spec 003 §5.1) as text")
    option("--graph", type=Path, metavar="FILE",
           help="write the dependency graph: .dot as Graphviz source, .svg or .pdf drawn by dot")
    option("--runs", type=int, default=1, metavar="N",
           help="run N times and report the last: the first run also pays for page faults "
                "and loading compiled code (default: 1)")
    option("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    workload = WORKLOADS[args.name]
    size = workload.default_size if args.size is None else args.size
    if size < 1 or args.runs < 1:
        raise SystemExit(f"pto-gpu: --size ({size}) and --runs ({args.runs}) must be at least 1")
    if args.graph and args.graph.suffix not in (".dot", ".svg", ".pdf"):
        raise SystemExit(f"pto-gpu: --graph {args.graph} must end in .dot, .svg or .pdf")
    try:
        return run(args, workload, size)
    except pto.PTOError as error:  # a bad setting, or a run that failed: the message says which
        print(f"pto-gpu: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, workload: Workload, size: int) -> int:
    prepared = workload.prepare(size, np.random.default_rng(args.seed))
    rt = pto.Runtime(backend=args.backend, executor=args.executor)
    run_args = tuple(to_backend(rt.backend, arg) for arg in prepared.args)
    for index in range(args.runs):
        last = index == args.runs - 1
        record = last and (args.dump or args.graph) is not None
        with progress_bar(rt, sys.stderr):
            result = rt.run(prepared.orchestration, *run_args, record=record,
                            trace=args.trace if last else None, **prepared.options)
    print(result)
    if args.dump:
        result.graph.dump(args.dump)
    if args.graph:
        if args.graph.suffix == ".dot":
            args.graph.write_text(result.graph.to_dot())
        else:
            result.graph.render(args.graph)
    if args.executor == "dry":
        return 0
    got, expected = rt.backend.to_host(prepared.output(run_args)), prepared.reference()
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    ok = error <= workload.tolerance
    print(f"max error vs numpy float64, relative to its largest value: {error:.1e} "
          f"({'OK' if ok else 'MISMATCH'}, tolerance {workload.tolerance:.0e})")
    return 0 if ok else 1


@contextlib.contextmanager
def progress_bar(rt: pto.Runtime, stream: TextIO, delay: float = 0.5, every: float = 0.1,
                 width: int = 30) -> Iterator[None]:
    """Redraw `completed / submitted tasks` on `stream` while the body runs, if it is a terminal.

    Runs shorter than `delay` seconds draw nothing.
    """
    if not stream.isatty():
        yield
        return
    done = threading.Event()

    def draw() -> None:
        if done.wait(delay):
            return
        while not done.wait(every):
            completed, submitted = rt.progress
            filled = width * completed // max(submitted, 1)
            stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {completed:,} / {submitted:,} tasks")
            stream.flush()
        stream.write("\r\033[K")  # clear the bar's line

    drawer = threading.Thread(target=draw, name="pto-progress", daemon=True)
    drawer.start()
    try:
        yield
    finally:
        done.set()
        drawer.join()


if __name__ == "__main__":
    sys.exit(main())
