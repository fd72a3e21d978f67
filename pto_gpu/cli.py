"""The `pto-gpu` command (also `python -m pto_gpu`): run a workload from the catalogue in
pto_gpu.orchestration.workloads, print its statistics, write artefacts; and the PTO assembly
tools of spec 003 §3.3.

    pto-gpu run flash_attention --size 2048 --trace attention.json --graph attention.svg
    mpiexec -n 2 pto-gpu run matmul --ranks      # one run over the ranks of an MPI launch
    pto-gpu merge-traces run.json run.rank0.json run.rank1.json
    pto-gpu run softmax.pto --shape input=64x64 --shape output=64x64 --scalar num_tiles=8 --check
    pto-gpu compile softmax.pto --emit cuda      # pto (canonical form), python, cpu, cuda or ptx
    pto-gpu parse programs/                      # writes <name>_builder.py beside each .pto

Each workload run is checked against its numpy float64 reference (unless the executor is dry);
the exit status is 1 when the result is off by more than the workload's tolerance. A .pto run
prints a checksum of each memref its orchestration writes; with --check, the exit status is 1
when those differ by a bit from a run on the serial executor.

This is the application layer on top of the runtime: it imports the catalogue (and with it
kernels/ and orchestration/) only when it runs, so that `import pto_gpu` never loads them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from .distributed.ownership import block_rows
from .errors import PTOError
from .runtime import BACKENDS, EXECUTORS, Runtime
from .trace import merge, rank_path

if TYPE_CHECKING:
    from pto_gpu.orchestration.workloads import Workload

    from .isa import Function, Module

# The options of `run` that only a FILE.pto takes (their dest names).
PROGRAM_OPTIONS = ("entry", "shape", "scalar", "compiled", "check", "save")
# What --shape and --scalar name, and the form of their values.
ASSIGNMENTS = {"--shape": ("memref", "ROWSxCOLS"), "--scalar": ("scalar parameter", "VALUE")}


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

    def orchestration(value: str) -> str:
        if value.endswith(".pto") or value in workloads:
            return value
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (a name listed below, or a FILE.pto)")

    option("name", type=orchestration, metavar="NAME",
           help="which orchestration (listed below), or a FILE.pto to run an Orchestration function of")
    option("--size", type=int, help="problem size, as each orchestration defines it below")
    option("--backend", choices=BACKENDS, default="auto",
           help="where kernels run (default: auto, the GPU when there is one; cuda-emulated: the CUDA "
                "backend over the CUDA emulator, each kernel's GPU code built for the host)")
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
    option("--ranks", action="store_true",
           help="run over every rank of the MPI launch (mpiexec -n N pto-gpu run NAME --ranks; needs "
                "mpi4py): rank 0 checks the result and prints its statistics with every rank's tasks "
                "and bytes; --trace FILE also gets each rank's FILE.rankR.json, merged into FILE")
    option = command.add_argument_group(
        "FILE.pto", "Every memref (outputs too) is filled with standard-normal values from --seed, in "
        "declaration order.").add_argument
    option("--entry", metavar="NAME", help="the Orchestration function to run (default: the file's only one)")
    option("--shape", action="append", default=[], metavar="NAME=ROWSxCOLS",
           help="the shape of memref NAME; one for each memref of the entry")
    option("--scalar", action="append", default=[], metavar="NAME=VALUE",
           help="the value of scalar parameter NAME; one for each scalar parameter of the entry")
    option("--compiled", action="store_true",
           help="run the generated numba orchestration instead of the interpreted one")
    option("--check", action="store_true",
           help="run it again on the serial executor; exit 1 unless the outputs are bitwise equal")
    option("--save", type=Path, metavar="DIR",
           help="write each memref's input as DIR/NAME.in.npy and each written one's result as "
                "DIR/NAME.out.npy")
    command = commands.add_parser(
        "compile", help="print a .pto file's canonical form, builder code or generated code",
        description="Parse and verify a .pto file, then print it as EMIT: its canonical form (pto), "
                    "the builder code that rebuilds it (python), or the generated numba (cpu) or CUDA "
                    "(cuda) code of its InCore functions, or the PTX the CUDA backend loads (ptx).")
    command.add_argument("file", type=Path, metavar="FILE.pto")
    command.add_argument("--emit", choices=("pto", "python", "cpu", "cuda", "ptx", "orchestration"),
                         default="pto",
                         help="what to print (default: pto); ptx: the PTX the CUDA backend loads, made by "
                              "NVRTC (no GPU needed); orchestration: the numba code an Orchestration "
                              "function compiles to (prog.orchestration(name, compiled=True))")
    command.add_argument("--function", metavar="NAME",
                         help="cpu/cuda/ptx: only this InCore function, orchestration: only this "
                              "Orchestration function (default: every one)")
    command.add_argument("--arch", default="sm_90", metavar="sm_XX",
                         help="ptx: the GPU architecture (default: sm_90)")
    command = commands.add_parser(
        "parse", help="write the builder code of every .pto file in a directory",
        description="For every DIR/*.pto, write DIR/<stem>_builder.py: isa.FunctionBuilder code that "
                    "rebuilds the same module (spec 003 §3.3).")
    command.add_argument("directory", type=Path, metavar="DIR")
    command = commands.add_parser(
        "merge-traces", help="merge the ranks' traces of a distributed run into one timeline",
        description="Write OUT: the Chrome-trace files IN (rank 0's first, as `run --trace` writes "
                    "them: FILE.rank0.json, ...), a process per rank.")
    command.add_argument("out", type=Path, metavar="OUT")
    command.add_argument("inputs", type=Path, nargs="+", metavar="IN")
    return top


def main(argv: list[str] | None = None) -> int:
    from pto_gpu.orchestration.workloads import WORKLOADS  # here, not at the top: see the docstring

    args = parser(WORKLOADS).parse_args(argv)
    if args.command == "merge-traces":
        try:
            args.out.write_text(json.dumps(merge(args.inputs)))
        except (OSError, ValueError, KeyError) as error:
            print(f"pto-gpu: {error}", file=sys.stderr)
            return 2
        return 0
    if args.command in ("compile", "parse"):
        try:
            if args.command == "compile":
                return compile_file(args.file, args.emit, args.function, args.arch)
            return parse_directory(args.directory)
        except (OSError, PTOError) as error:  # an unreadable file, or a .pto error as file:line:col
            print(f"pto-gpu: {error}", file=sys.stderr)
            return 2
    program = args.name.endswith(".pto")
    if program:
        stray = ["--size"] if args.size is not None else []
    else:
        stray = [f"--{dest}" for dest in PROGRAM_OPTIONS if getattr(args, dest)]
    if program and args.ranks:
        stray.append("--ranks")
    if stray:
        raise SystemExit(f"pto-gpu: {', '.join(stray)}: only for {'a workload' if program else 'a FILE.pto'}")
    workload = None if program else WORKLOADS[args.name]
    size = workload.default_size if workload and args.size is None else args.size
    if (size is not None and size < 1) or args.runs < 1:
        raise SystemExit(f"pto-gpu: --size ({size}) and --runs ({args.runs}) must be at least 1")
    if args.graph and args.graph.suffix not in (".dot", ".svg", ".pdf"):
        raise SystemExit(f"pto-gpu: --graph {args.graph} must end in .dot, .svg or .pdf")
    try:  # a bad setting or file, or a failed run: the message says which
        return run_program(args, Path(args.name)) if program else run(args, workload, size)
    except (OSError, PTOError) as error:
        print(f"pto-gpu: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, workload: Workload, size: int) -> int:
    from pto_gpu.orchestration.workloads import to_backend

    comm = None
    if args.ranks:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    prepared = workload.prepare(size, np.random.default_rng(args.seed))
    rt = Runtime(backend=args.backend, executor=args.executor, comm=comm)
    run_args = tuple(to_backend(rt.backend, arg) for arg in prepared.args)
    _, result = run_and_report(args, rt, prepared.orchestration, lambda: run_args, **prepared.options)
    if args.executor == "dry":
        return 0
    got = rt.backend.to_host(prepared.output(run_args))
    if comm is not None:
        got = gather_output(comm, got, workload.distributed, result)
        if comm.Get_rank() != 0:
            return comm.bcast(None, root=0)
    expected = prepared.reference()
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    ok = error <= workload.tolerance
    print(f"max error vs numpy float64, relative to its largest value: {error:.1e} "
          f"({'OK' if ok else 'MISMATCH'}, tolerance {workload.tolerance:.0e})")
    status = 0 if ok else 1
    return status if comm is None else comm.bcast(status, root=0)


def gather_output(comm, output: np.ndarray, distributed: bool, result) -> np.ndarray | None:
    """On rank 0, the output as its owners hold it (rows in blocks, or all on rank 0), after a
    line per rank of what it ran and moved; None elsewhere."""
    parts = comm.gather((output, result.ranks), root=0)
    if comm.Get_rank() != 0:
        return None
    for ranks in (r for _, r in parts):
        print(f"  rank {ranks.rank}: ran {len(ranks.tasks_run):,} tasks, sent {ranks.bytes_sent:,} B, "
              f"received {ranks.bytes_received:,} B")
    if not distributed:
        return output
    owners = block_rows(len(parts)).row_owners(output.shape[0])
    assembled = output.copy()
    for rank, (part, _) in enumerate(parts):
        assembled[owners == rank] = part[owners == rank]
    return assembled


def run_and_report(args: argparse.Namespace, rt: Runtime, orchestration: Callable,
                   arguments: Callable[[], tuple], **options) -> tuple:
    """Run `orchestration` --runs times, each on `arguments()`; print the last run's statistics,
    write its artefacts (--trace, --dump, --graph) and return its arguments and result."""
    for index in range(args.runs):
        last = index == args.runs - 1
        record = last and (args.dump or args.graph) is not None
        run_args = arguments()
        with progress_bar(rt, sys.stderr):
            result = rt.run(orchestration, *run_args, record=record, trace=args.trace if last else None,
                            **options)
    if rt.placement is not None:  # a distributed run: rank 0 reports, and merges the traces
        if args.trace:
            rt.placement.transport.barrier()  # every rank has written its own
        if rt.placement.rank != 0:
            return run_args, result
        if args.trace:
            paths = [rank_path(args.trace, rank) for rank in range(rt.placement.size)]
            args.trace.write_text(json.dumps(merge(paths)))
    print(result)
    if args.dump:
        result.graph.dump(args.dump)
    if args.graph:
        if args.graph.suffix == ".dot":
            args.graph.write_text(result.graph.to_dot())
        else:
            result.graph.render(args.graph)
    return run_args, result


def run_program(args: argparse.Namespace, path: Path) -> int:
    """`run FILE.pto`: the entry on seeded random inputs (fresh copies for each of the --runs),
    then a checksum line for each memref it writes."""
    from . import isa

    module = read_module(path)
    function = entry(module, args.entry, path)
    arrays, scalars = program_inputs(function, args.shape, args.scalar, np.random.default_rng(args.seed))
    flows = isa.directions(function, module)  # a memref is written if a call writes it
    written = [name for name, flow in flows.items() if flow is not isa.Direction.INPUT]
    orchestration = isa.compile(module).orchestration(function.name, compiled=args.compiled)
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        for name, array in arrays.items():
            np.save(args.save / f"{name}.in.npy", array)

    def inputs(rt: Runtime) -> tuple:
        return (*(rt.backend.to_device(array.copy()) for array in arrays.values()), *scalars)

    rt = Runtime(backend=args.backend, executor=args.executor)
    last, _ = run_and_report(args, rt, orchestration, lambda: inputs(rt))
    if args.executor == "dry":
        return 0
    results = {name: rt.backend.to_host(array) for name, array in zip(arrays, last) if name in written}
    for name, array in results.items():
        print(f"  {name} {'x'.join(map(str, array.shape))}: sum {float(array.sum(dtype=np.float64)):.9g}, "
              f"max abs {float(np.abs(array).max()):.9g}")
        if args.save:
            np.save(args.save / f"{name}.out.npy", array)
    if not args.check:
        return 0
    serial = Runtime(backend=args.backend, executor="serial")
    again = inputs(serial)
    serial.run(orchestration, *again)
    differ = [name for name, array in zip(arrays, again)
              if name in results and serial.backend.to_host(array).tobytes() != results[name].tobytes()]
    if differ:
        print(f"check: not bitwise equal to the serial executor's result: {', '.join(differ)}",
              file=sys.stderr)
        return 1
    print("check: every output is bitwise equal to the serial executor's")
    return 0


def entry(module: Module, name: str | None, path: Path) -> Function:
    """The Orchestration function `name`, or with None the module's only one."""
    names = [f.name for f in module.functions.values() if not f.in_core]
    if name is None and len(names) == 1:
        return module.functions[names[0]]
    if not names:
        in_core = ", ".join(f"@{f.name}" for f in module.functions.values())
        raise PTOError(f"{path}: has no Orchestration function to run, only InCore ones ({in_core}); "
                       f"`pto-gpu compile {path} --emit cpu|cuda|ptx` shows their code")
    if name not in names:
        problem = "choose the Orchestration function with --entry" if name is None else \
            f"--entry {name}: no Orchestration function @{name}"
        raise PTOError(f"{path}: {problem} (it has: {', '.join(f'@{n}' for n in names) or 'none'})")
    return module.functions[name]


def program_inputs(function: Function, shapes: list[str], values: list[str],
                   rng: np.random.Generator) -> tuple[dict[str, np.ndarray], list[int | float]]:
    """The arrays of `function`'s memrefs by name (standard-normal values from `rng`, in
    declaration order) and its scalar parameters' values, from the --shape and --scalar items."""
    params = [s for s in function.scalars if s.param]
    given = assignments(function, "--shape", shapes, [m.name for m in function.memrefs])
    arrays = {}
    for memref in function.memrefs:
        if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*){0,3}", given[memref.name]):
            raise PTOError(f"--shape {memref.name}={given[memref.name]}: expected ROWSxCOLS (up to 4 dims), "
                           "such as 64x64")
        shape = tuple(int(n) for n in given[memref.name].split("x"))
        arrays[memref.name] = rng.standard_normal(shape).astype(memref.dtype.numpy)
    given = assignments(function, "--scalar", values, [s.name for s in params])
    scalars = []
    for scalar in params:
        number = int if scalar.dtype.numpy.kind in "biu" else float
        try:
            scalars.append(number(given[scalar.name]))
        except ValueError:
            raise PTOError(f"--scalar {scalar.name}={given[scalar.name]}: not a number of type "
                           f"{scalar.dtype.name.lower()}") from None
    return arrays, scalars


def assignments(function: Function, option: str, items: list[str], names: list[str]) -> dict[str, str]:
    """The `NAME=VALUE` items of `option` as {NAME: VALUE}: exactly one for each of `names`."""
    kind, form = ASSIGNMENTS[option]
    given: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals:
            raise PTOError(f"{option} {item}: expected NAME={form}")
        if name not in names:
            raise PTOError(f"{option} {item}: @{function.name} has no {kind} {name} "
                           f"(its {kind}s: {', '.join(names) or 'none'})")
        if name in given:
            raise PTOError(f"{option} {name}: given twice")
        given[name] = value
    missing = [f"{option} {name}={form}" for name in names if name not in given]
    if missing:
        raise PTOError(f"@{function.name}: missing {', '.join(missing)}")
    return given


def read_module(path: Path):
    """The verified module of a .pto file; its errors start with path:line:column."""
    from . import isa

    try:
        return isa.parse(path.read_text())  # verified
    except isa.ISAError as error:  # the message starts with line:column, where there is one
        separator = ":" if re.match(r"\d+:\d+:", str(error)) else ": "
        raise isa.ISAError(f"{path}{separator}{error}") from None


def compile_file(path: Path, emit: str, function: str | None, arch: str = "sm_90") -> int:
    from . import isa
    from .isa import cpu_codegen, cuda_codegen

    module = read_module(path)
    if emit == "pto":
        print(isa.print_module(module), end="")
    elif emit == "python":
        print(isa.to_python(module), end="")
    elif emit == "orchestration":
        from .isa.orchestration_codegen import orchestration_source

        orchestrations = [f.name for f in module.functions.values() if not f.in_core]
        if function is not None and function not in orchestrations:
            raise PTOError(f"{path}: no Orchestration function {function!r}; it has: "
                           f"{', '.join(orchestrations) or 'none'}")
        if not orchestrations:
            raise PTOError(f"{path}: has no Orchestration function, only InCore ones")
        names = [function] if function else orchestrations
        print("\n".join(orchestration_source(module, name)[0] for name in names), end="")
    else:
        own = [f.name for f in module.functions.values() if f.in_core and f.library is None]
        if function is not None and function not in own:
            raise PTOError(f"{path}: no InCore function {function!r} of its own; it has: "
                           f"{', '.join(own) or 'none'}")
        names = [function] if function else own
        if not names:
            libraries = sorted(f.library for f in module.functions.values() if f.library is not None)
            raise PTOError(f"{path}: no InCore function of its own to emit {emit} for; its kernels are "
                           f"library functions ({', '.join(libraries) or 'none'}), whose code is made per "
                           "call's shapes: see pto_gpu.isa.gpu_code")
        if emit == "ptx":
            kernels = isa.compile(module).kernels
            for name in names:
                memrefs = module.functions[name].memrefs
                dtype = memrefs[0].dtype.numpy if memrefs else np.float32
                print(isa.gpu_code(kernels[name], [m.shape for m in memrefs], dtype, arch=arch), end="")
            return 0
        generate = cpu_codegen.cpu_source if emit == "cpu" else cuda_codegen.cuda_source
        print("\n".join(generate(module, name) for name in names), end="")
    return 0


def parse_directory(directory: Path) -> int:
    from . import isa

    files = sorted(directory.glob("*.pto"))
    if not files:
        raise PTOError(f"{directory}: no .pto files")
    for path in files:
        target = path.with_name(f"{path.stem}_builder.py")
        target.write_text(isa.to_python(read_module(path)))
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
