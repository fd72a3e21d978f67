"""The `pto-gpu` command (also `python -m pto_gpu`): run a workload from the catalogue in
pto_gpu.orchestration.workloads, print its statistics, write artefacts; and the PTO assembly
tools of spec 003 §3.3.

    pto-gpu run flash_attention --size 2048 --trace attention.json --graph attention.svg
    pto-gpu compile softmax.pto --emit cuda      # pto (canonical form), python, cpu or cuda
    pto-gpu parse programs/                      # writes <name>_builder.py beside each .pto

Each run is checked against its numpy float64 reference (unless the executor is dry); the exit
status is 1 when the result is off by more than the workload's tolerance.

This is the application layer on top of the runtime: it imports the catalogue (and with it
kernels/ and orchestration/) only when it runs, so that `import pto_gpu` never loads them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from .errors import PTOError
from .runtime import EXECUTORS, Runtime

if TYPE_CHECKING:
    from pto_gpu.orchestration.workloads import Workload


def parser(workloads: Mapping[str, Workload]) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pto-gpu", description="Run PTO task graphs on a GPU or CPU.")
    commands = top.add_subparsers(dest="command", required=True)
    catalogue = "\n".join(f"  {name:<16} {w.summary} (default size {w.default_size})"
                          for name, w in workloads.items())
    command = commands.add_parser(
        "run", help="run an orchestration and print its statistics",
        description="Run an orchestration, check it against numpy, and print the run's statistics.",
        epilog="orchestrations:\n" + catalogue, formatter_class=argparse.RawDescriptionHelpFormatter)
    option = command.add_argument
    option("name", choices=workloads, metavar="NAME", help="which orchestration (listed below)")
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
    command = commands.add_parser(
        "compile", help="print a .pto file's canonical form, builder code or generated code",
        description="Parse and verify a .pto file, then print it as EMIT: its canonical form (pto), "
                    "the builder code that rebuilds it (python), or the generated numba (cpu) or CUDA "
                    "(cuda) code of its InCore functions.")
    command.add_argument("file", type=Path, metavar="FILE.pto")
    command.add_argument("--emit", choices=("pto", "python", "cpu", "cuda"), default="pto",
                         help="what to print (default: pto)")
    command.add_argument("--function", metavar="NAME",
                         help="cpu/cuda: only this InCore function (default: every one)")
    command = commands.add_parser(
        "parse", help="write the builder code of every .pto file in a directory",
        description="For every DIR/*.pto, write DIR/<stem>_builder.py: isa.FunctionBuilder code that "
                    "rebuilds the same module (spec 003 §3.3).")
    command.add_argument("directory", type=Path, metavar="DIR")
    return top


def main(argv: list[str] | None = None) -> int:
    from pto_gpu.orchestration.workloads import WORKLOADS  # here, not at the top: see the docstring

    args = parser(WORKLOADS).parse_args(argv)
    if args.command in ("compile", "parse"):
        try:
            if args.command == "compile":
                return compile_file(args.file, args.emit, args.function)
            return parse_directory(args.directory)
        except (OSError, PTOError) as error:  # an unreadable file, or a .pto error as file:line:col
            print(f"pto-gpu: {error}", file=sys.stderr)
            return 2
    workload = WORKLOADS[args.name]
    size = workload.default_size if args.size is None else args.size
    if size < 1 or args.runs < 1:
        raise SystemExit(f"pto-gpu: --size ({size}) and --runs ({args.runs}) must be at least 1")
    if args.graph and args.graph.suffix not in (".dot", ".svg", ".pdf"):
        raise SystemExit(f"pto-gpu: --graph {args.graph} must end in .dot, .svg or .pdf")
    try:
        return run(args, workload, size)
    except PTOError as error:  # a bad setting, or a run that failed: the message says which
        print(f"pto-gpu: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, workload: Workload, size: int) -> int:
    from pto_gpu.orchestration.workloads import to_backend

    prepared = workload.prepare(size, np.random.default_rng(args.seed))
    rt = Runtime(backend=args.backend, executor=args.executor)
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


def read_module(path: Path):
    """The verified module of a .pto file; its errors start with path:line:column."""
    from . import isa

    try:
        module = isa.parse(path.read_text())
    except isa.ISAError as error:  # the message starts with line:column
        raise isa.ISAError(f"{path}:{error}") from None
    try:
        isa.verify_module(module)
    except isa.ISAError as error:
        raise isa.ISAError(f"{path}: {error}") from None
    return module


def compile_file(path: Path, emit: str, function: str | None) -> int:
    from .isa import cpu_codegen, cuda_codegen

    module = read_module(path)
    if emit == "pto":
        print(module.to_pto(), end="")
    elif emit == "python":
        print(module.to_python(), end="")
    else:
        names = [function] if function else [f.name for f in module.functions.values() if f.in_core]
        generate = cpu_codegen.cpu_source if emit == "cpu" else cuda_codegen.cuda_source
        print("\n".join(generate(module, name) for name in names), end="")
    return 0


def parse_directory(directory: Path) -> int:
    files = sorted(directory.glob("*.pto"))
    if not files:
        raise PTOError(f"{directory}: no .pto files")
    for path in files:
        target = path.with_name(f"{path.stem}_builder.py")
        target.write_text(read_module(path).to_python())
        print(f"{path} -> {target}")
    return 0


@contextlib.contextmanager
def progress_bar(rt: Runtime, stream: TextIO, delay: float = 0.5, every: float = 0.1) -> Iterator[None]:
    """While the body runs, show `rt.progress` (completed of submitted tasks) as a tqdm bar on
    `stream`, polled every `every` seconds; its total grows as the orchestration submits.

    Drawn only when `stream` is a terminal and the run lasts longer than `delay` seconds, and
    cleared at the end. Without tqdm (the `progress` extra) nothing is drawn, and nothing said:
    the bar is a convenience, and a notice on every run would be noise in the output of a
    command whose stderr otherwise carries only errors.
    """
    if not stream.isatty():
        yield
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield
        return
    # miniters=0, mininterval=0: redraw at every poll, also when only the total has grown (tqdm
    # would otherwise wait for the count to move); `delay` still holds the first drawing back.
    bar = tqdm(total=0, unit="task", file=stream, leave=False, delay=delay, miniters=0, mininterval=0)
    done = threading.Event()

    def poll() -> None:
        while not done.wait(every):
            completed, submitted = rt.progress
            bar.total = submitted
            bar.update(completed - bar.n)

    poller = threading.Thread(target=poll, name="pto-progress", daemon=True)
    poller.start()
    try:
        yield
    finally:
        done.set()
        poller.join()
        bar.close()
