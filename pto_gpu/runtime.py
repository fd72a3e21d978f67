"""The Runtime: configuration, backend choice, `run`, which drives one orchestration, and
`capture`, which records one as a graph to replay."""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

from .backends import CapturedGraph
from .backends.cpu import CpuBackend
from .backends.cuda_abi import check_precision
from .core.state import CoreState, Sizes
from .costs import CostHistory
from .distributed.outcome import conclude
from .distributed.placement import Placement
from .dtypes import WorkerType
from .errors import PTOError, UsageError
from .executors import driver_streams
from .executors.driver_streams import DriverStreamExecutor
from .executors.native import Instances
from .executors.parallel import ParallelExecutor
from .executors.persistent import PersistentExecutor
from .executors.serial import DryExecutor, SerialExecutor
from .executors.sim import SimExecutor
from .executors.streams import StreamExecutor
from .executors.threads import WorkerThreads
from .graph import Graph
from .jit.context import ArgTables
from .kernel import Kernel
from .orchestrator import Orchestrator, Recorder
from .profile import Profile
from .result import Ranks, RunResult, busy_shares, kernel_times
from .schedule import Schedule, Windows
from .tasks import Scheduler
from .trace import rank_path, write_trace

log = logging.getLogger("pto_gpu")

EXECUTORS = ("auto", "parallel", "stream", "serial", "dry", "sim", "persistent")
BACKENDS = ("auto", "cpu", "cuda", "cuda-emulated")

_blas_libraries: tuple[int, ThreadpoolController] | None = None  # (len(sys.modules), their controller)
_blas_lock = threading.Lock()
_blas_runs = 0  # runs, captures and replays in progress, in any runtime of the process
_blas_limiter = None  # their one limit, restored when the last of them ends


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """threadpool_limits(1) for a run, capture or replay, whatever its executor, restoring the
    caller's setting after: the workers (threads, streams, the caller's thread) are the
    parallelism, and BLAS sums in another order with another thread count (OpenBLAS's Haswell
    kernels do), so one count everywhere keeps every executor's results the serial executor's.
    The limit is the process's (BLAS libraries have one count), so runtimes running at once in
    several threads share it: the first to start sets it, the last to end restores it. Over
    the thread pools loaded when the scan was made, which is made again once a module has been
    imported since (how a library with a pool of its own arrives). The scan took 1 ms."""
    global _blas_libraries, _blas_runs, _blas_limiter
    with _blas_lock:
        if _blas_runs == 0:
            if _blas_libraries is None or _blas_libraries[0] != len(sys.modules):
                _blas_libraries = (len(sys.modules), ThreadpoolController())
            _blas_limiter = _blas_libraries[1].limit(limits=1)
        _blas_runs += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_runs -= 1
            if _blas_runs == 0:
                _blas_limiter.restore_original_limits()


def default_workers(executor: str) -> dict[WorkerType, int]:
    """Threads per worker class (parallel executor), streams per worker class (stream), or
    simulated workers (sim: a fixed count, so a simulation means the same on every machine)."""
    per_class = 2 if executor in ("stream", "sim") else os.cpu_count() or 1
    return {WorkerType.CUBE: per_class, WorkerType.VECTOR: per_class, WorkerType.AI_CPU: 1,
            WorkerType.ACCELERATOR: 1}


def _worker_counts(workers: dict) -> dict[WorkerType, int]:
    """workers= by class: keys are classes (pto.CUBE, ...), their values or their names."""
    counts = {}
    for key, count in workers.items():
        try:
            worker = WorkerType[key] if isinstance(key, str) else WorkerType(key)
        except (KeyError, ValueError):
            raise PTOError(f"workers={workers}: {key!r} is not a worker class; the classes are "
                           f"{', '.join(w.name for w in WorkerType)}") from None
        if not isinstance(count, numbers.Integral) or count < 1:
            raise PTOError(f"workers={workers}: every worker class needs at least one worker")
        counts[worker] = count
    return counts


class Runtime:
    """Runs orchestration functions. See docs/DESIGN.md, "The public contract"."""

    def __init__(self, backend: str = "auto", executor: str = "auto", *,
                 heap_bytes: int = 64 << 20, task_window: int = 1024,
                 workers: dict[WorkerType | str, int] | None = None, buffer_window: int | None = None,
                 dep_pool: int | None = None, tensormap_entries: int | None = None,
                 validate: bool | None = None, costs: CostHistory | None = None, comm: object = None,
                 transport: str = "mpi", emulate: str | None = None, precision: str = "exact"):
        if executor not in EXECUTORS:
            raise PTOError(f"executor={executor!r}; choose one of {', '.join(EXECUTORS)}")
        if comm is not None and executor not in ("auto", "parallel", "serial"):
            raise PTOError(f"executor={executor!r} cannot run a distributed run (comm=) yet; use 'parallel' "
                           "or 'serial'")
        if comm is not None and backend == "cuda-emulated":
            raise PTOError("a distributed run (comm=) cannot use backend='cuda-emulated': its transfers are "
                           "host functions that only a GPU's backend runs; use backend='cpu' or 'cuda'")
        if transport not in ("mpi", "nccl"):
            raise PTOError(f"transport={transport!r}; choose 'mpi' or 'nccl'")
        check_precision(precision, "Runtime")
        self.sizes = Sizes(
            task_window=task_window,
            heap_bytes=heap_bytes,
            # Live buffers are bounded by the heap, not by the task window: a tiny window for
            # back-pressure should not also make the buffer table tiny.
            buffer_window=buffer_window or max(1024, 4 * task_window),
            dep_pool=dep_pool or 8 * task_window,
            tensormap_entries=tensormap_entries or 16 * task_window,
        )
        self._workers_given = _worker_counts(workers or {})
        self._threads = WorkerThreads()  # the parallel executor's, kept between runs
        # The runs' argument tables (2.5 MB at the default window), kept too: made anew, their
        # pages were faulted in again by every run (a sixth to a quarter of a one-tile run).
        self._arguments = ArgTables.allocate(self.sizes.task_window)
        self._instances = Instances()  # native workers' entries (executors/native.py), as learnt
        self._distributed = comm is not None
        self._ordered_transfers = self._distributed and transport == "nccl"  # placement.py's `ordered`
        accelerators = self._workers("parallel")[WorkerType.ACCELERATOR]
        if self._ordered_transfers and executor != "serial" and accelerators < 2:
            raise PTOError(f"workers={workers}: transport='nccl' needs at least 2 ACCELERATOR workers, one "
                           "free for sends while another waits for a receive (docs/ARCHITECTURE.md)")
        if self._distributed and backend != "cpu" and cuda_unavailable() is None:
            from .distributed.nccl import use_local_gpu

            use_local_gpu(comm)  # before the heap is allocated on the current device
        self.backend = _make_backend(backend, heap_bytes, emulate, precision)
        # On a GPU, issue-ahead onto streams; on the CPU, a thread pool. A distributed run's
        # transfers need its worker threads.
        if executor == "auto":
            executor = "stream" if self.backend.name != "cpu" and not self._distributed else "parallel"
        if executor == "persistent" and self.backend.name == "cpu":
            raise PTOError('executor="persistent" runs the tasks in one CUDA kernel: it needs backend="cuda" '
                           'or "cuda-emulated", not "cpu"')
        self.executor = executor
        self.workers = self._workers(self.executor)
        # A distributed run (comm=, an mpi4py communicator): see pto_gpu/distributed.
        self.placement = None if comm is None else Placement(_make_transport(comm, transport, self.backend))
        self._scheduler = Scheduler(CoreState.allocate(self.sizes))
        # Validation mode checks every scheduler invariant after every transition (slow).
        self._scheduler.validate = (os.environ.get("PTO_VALIDATE", "") not in ("", "0")
                                    if validate is None else validate)
        # Where this runtime's runs add what kernels took (costs.py), and the simulator and
        # critical-path schedules read costs of kernels without cost=; None: nothing is measured
        # (measuring costs every task a little).
        if costs is not None and not isinstance(costs, CostHistory):
            raise PTOError(f"costs={costs!r} is not a pto.CostHistory")
        self.costs = costs
        # Held by a run, capture or replay: one at a time, as they share the rings and tables. A
        # lock, not a flag, so that two threads calling run at once cannot both get in.
        self._busy = threading.Lock()

    def run(self, orchestration: Callable, *args, threshold: int = 0, record: bool = False,
            trace: str | Path | None = None, schedule: Schedule | None = None, **kwargs) -> RunResult:
        """Run `orchestration(o, *args, **kwargs)` to completion; every task has run on return.

        record=True keeps the logical graph in `result.graph`; trace=path also writes the
        run's timeline there as Chrome-trace JSON (and records the graph for its arrows).
        schedule= orders ready tasks (pto.Schedule; followed by executor="sim" and "parallel" so
        far; without one the simulator takes the critical path and the threads their FIFO order).
        """
        if schedule is not None and not isinstance(schedule, Schedule):
            raise PTOError(f"schedule={schedule!r} is not a pto.Schedule")
        if schedule is not None and self.executor not in ("sim", "parallel"):
            raise PTOError(f"schedule= is followed by executor='sim' and 'parallel' only so far, not "
                           f"{self.executor!r}")
        if threshold < 0:
            raise PTOError(f"threshold={threshold} must be >= 0")
        _check_orchestration("run", orchestration)
        if trace is not None and not isinstance(trace, (str, os.PathLike)):
            raise PTOError(f"trace={trace!r}: the path of the file to write the run's timeline to "
                           "(a str or Path), not a flag")
        if trace is not None and self.executor == "dry":
            raise PTOError("trace= draws when kernels ran, and the dry executor runs none; "
                           "use executor='serial' or 'parallel'")
        with self._exclusively("Runtime.run called while this runtime is already running an orchestration"):
            return self._run(orchestration, args, kwargs, threshold, record, trace, schedule=schedule)[0]

    def run_concurrent(self, graphs: Sequence[tuple], *, provides: Sequence[Sequence[str]] | None = None,
                       requires: Sequence[Sequence[str]] | None = None, **options) -> RunResult:
        """Run several orchestrations side by side, in one run: each `(orchestration, args)` or
        `(orchestration, args, kwargs)`. Their tasks share one TensorMap, so dependencies between
        graphs come from launch order (RAW, WAR and WAW need no declaration) and independent
        graphs overlap; the tasks of graph i carry the tag graph=i. `provides[i]` and
        `requires[i]` name what graph i makes and needs (spec 004's PROVIDES/REQUIRES): each
        required name must be provided by an earlier graph. `options` are run's (schedule=,
        record=, ...); one RunResult covers every graph."""
        entries = [_graph_entry(index, graph) for index, graph in enumerate(graphs)]
        _check_provisions(len(entries), provides, requires)

        def side_by_side(o: Orchestrator) -> None:
            for index, (orchestration, args, kwargs) in enumerate(entries):
                with o.tags(graph=index):
                    orchestration(o, *args, **kwargs)

        side_by_side.__name__ = " + ".join(getattr(e[0], "__name__", "graph") for e in entries)
        return self.run(side_by_side, **options)

    def capture(self, orchestration: Callable, *args, **kwargs) -> Replay:
        """Record `orchestration(o, *args, **kwargs)` as one graph of kernel launches, unrun.

        `replay()` on the result runs those launches again on the same memory, without the
        orchestrator, the dependency analysis or the executor: on CUDA one graph launch
        (cuBLAS is refused while capturing, so CUBE tiles use their own CUDA kernels), on the
        CPU the kernel calls in issue order. Only for orchestrations whose tasks and buffers
        do not depend on data; change inputs in place between replays: the graph reads and
        writes the memory it was captured over, never an array bound or put into an args dict
        afterwards. The graph keeps that memory alive (every external its tasks use, arrays
        made inside the orchestration included, and the heap), and the Replay keeps this
        Runtime alive: the caller need keep only the Replay (and the arrays it reads results
        from). The whole run must fit in the rings, since nothing is reclaimed while
        capturing; a ring that fills raises DeadlockError.
        """
        with self._exclusively("Runtime.capture called while this runtime is running an orchestration"):
            result, executor = self._run(orchestration, args, kwargs, 0, False, None, capture=True)
        return Replay(self, executor.graph, result)

    @contextlib.contextmanager
    def _exclusively(self, refusal: str) -> Iterator[None]:
        """Hold the runtime; UsageError(refusal) if a run, capture or replay holds it already."""
        if not self._busy.acquire(blocking=False):
            raise UsageError(refusal)
        try:
            yield
        finally:
            self._busy.release()

    @property
    def progress(self) -> tuple[int, int]:
        """(tasks completed, tasks submitted) so far in the current run; safe from another thread."""
        header = self._scheduler.state.head
        return int(header["completed"]), int(header["next_task"])

    def _run(self, orchestration, args, kwargs, threshold, record, trace, capture=False, schedule=None):
        """The run's RunResult and the executor that ran it."""
        record = record or trace is not None
        scheduler = self._scheduler
        scheduler.reset(record)
        placement = self.placement
        name = getattr(orchestration, "__name__", repr(orchestration))
        if placement is not None:
            if capture:
                raise PTOError("Runtime.capture cannot capture a distributed run (comm=)")
            placement.start(self.sizes, record)
        recorder = Recorder() if record and placement is None else None
        profile = Profile(tracing=trace is not None, measuring=self.costs is not None)
        self.backend.wait_for_caller()
        executor = o = None
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:  # from the distributed run's start: whatever fails after it, every rank hears of it
            if placement is not None:
                placement.transport.begin(name)
            executor = self._make_executor(threshold, profile, capture, schedule)
            windows = Windows(schedule.max_concurrent) if schedule and schedule.max_concurrent else None
            # A rank weighs a critical path over every rank's tasks (docs/SCHEDULES.md)
            every_task = placement is not None and schedule is not None and (
                schedule.order_by == "critical_path")
            o = Orchestrator(scheduler, self.backend, executor, recorder, self._arguments, windows, placement,
                             every_task)
            with _one_blas_thread():
                if placement is not None and placement.transport.ordered:  # what chains the transfers
                    placement.lane = o.external(self.backend.to_device(np.zeros(1, np.uint8)))
                orchestration(o, *args, **kwargs)
                o.write_back()
                o.close()
                executor.finish()
                scheduler.release_records()
                for array in o.dist_arrays:  # the rows it received are stale from here on
                    array.release_remote()
        except BaseException as error:
            if placement is not None:
                placement.transport.fail()  # first, so that no rank waits for this one
            if executor is not None:
                executor.abort()
            scheduler.reset(record, whole=True)  # nothing of an unwound run stays in the rings
            if placement is not None:
                placement.inbox.give_up()  # its workers have stopped: what they left posted
                concluded = conclude(placement.transport, error)
                if concluded is not error:  # another rank's failure: its cause, not this rank's waits
                    raise concluded from concluded.__cause__
            raise
        finally:
            if o is not None:
                o.close()
        if placement is not None and (error := conclude(placement.transport, None)) is not None:
            scheduler.reset(record, whole=True)
            raise error
        if placement is not None:
            for said in (placement.idle_ranks(), placement.heavy_traffic()):
                if said is not None:
                    warnings.warn(said, RuntimeWarning, stacklevel=3)
        seconds = time.perf_counter() - started
        cpu_seconds = {"caller": time.thread_time() - started_cpu}
        by_class = sorted(getattr(executor, "thread_cpu", {}).items())  # (in WorkerType's order)
        cpu_seconds.update((worker.name, spent) for worker, spent in by_class)
        measured = profile.measured()
        header = scheduler.state.head
        logical = placement.graph if placement is not None else recorder
        result = RunResult(
            orchestration=name,
            num_tasks=int(header["next_task"]) if placement is None else placement.submitted,
            num_edges=len(logical.edges) if placement is not None and logical else int(header["num_edges"]),
            seconds=seconds,
            backend=self.backend.name, executor="stream" if capture else self.executor,
            high_water=scheduler.high_water(),
            capacity=scheduler.capacity(), stalls=profile.stalls, kernels=kernel_times(profile),
            busy=busy_shares(profile, seconds), cpu_seconds=cpu_seconds,
            graph=Graph(logical.tasks, logical.edges) if logical else None,
            makespan=getattr(executor, "makespan", None),
            cross_waits=getattr(executor, "cross_waits", None),
            native_tasks=getattr(executor, "native_tasks", 0),
            native_launches=getattr(executor, "native_launches", 0),
            prediction_error=self.costs.prediction_error(measured) if self.costs else {},
            ranks=None if placement is None else Ranks(placement.rank, placement.size, placement.tasks_run,
                                                       placement.bytes_sent, placement.bytes_received,
                                                       placement.placed_by_compiled_code,
                                                       placement.transfers,
                                                       getattr(executor, "native_transfers", 0)),
        )
        if self.costs is not None:
            self.costs.merge(measured)
        if trace is not None:
            path = trace if placement is None else rank_path(trace, placement.rank)
            write_trace(path, profile, result.graph)
        return result, executor

    def _workers(self, executor: str) -> dict[WorkerType, int]:
        defaults = default_workers(executor)
        if self._ordered_transfers:
            defaults[WorkerType.ACCELERATOR] = 2
        return {**defaults, **self._workers_given}

    def _make_executor(self, threshold, profile, capture, schedule):
        if capture or self.executor == "stream":
            if not capture and driver_streams.serves(self.backend, profile, self._scheduler):
                return DriverStreamExecutor(self._scheduler, self.backend, profile, self._workers("stream"))
            return StreamExecutor(self._scheduler, self.backend, profile, self._workers("stream"), capture)
        if self.executor == "persistent":
            return PersistentExecutor(self._scheduler, self.backend, profile)
        arrivals = None if self.placement is None else self.placement.inbox
        if self.executor == "serial":
            return SerialExecutor(self._scheduler, self.backend, profile, arrivals)
        if self.executor == "dry":
            return DryExecutor(self._scheduler, self.backend, profile)
        if self.executor == "sim":
            return SimExecutor(self._scheduler, self.backend, profile, self.workers, schedule or Schedule(),
                               self.costs)
        return ParallelExecutor(self._scheduler, self.backend, profile, self.workers, self._threads,
                                self._instances, threshold, schedule, self.costs, arrivals)


def _check_orchestration(where: str, orchestration: object) -> None:
    """A kernel is callable too (on arrays), but an orchestration submits it."""
    if isinstance(orchestration, Kernel):
        raise PTOError(f"{where}: {orchestration.name} is a kernel, not an orchestration: run a function "
                       f"fn(o, *args) that submits it (o.submit({orchestration.name}, ...))")


def _graph_entry(index: int, graph: object) -> tuple[Callable, tuple, dict]:
    if not (isinstance(graph, tuple) and len(graph) in (2, 3) and callable(graph[0])
            and isinstance(graph[1], tuple | list) and (len(graph) == 2 or isinstance(graph[2], dict))):
        raise PTOError(f"run_concurrent: graph {index} is {graph!r}, not (orchestration, args) or "
                       "(orchestration, args, kwargs)")
    _check_orchestration(f"run_concurrent: graph {index}", graph[0])
    return graph[0], tuple(graph[1]), dict(graph[2]) if len(graph) == 3 else {}


def _check_provisions(count: int, provides, requires) -> None:
    """PROVIDES/REQUIRES: lists aligned with the graphs; every required name is provided by an
    earlier graph, and no name is provided twice."""
    lists = {"provides": provides or [()] * count, "requires": requires or [()] * count}
    for label, names in lists.items():
        if len(names) != count:
            raise PTOError(f"run_concurrent: {label} has {len(names)} entries for {count} graphs")
    provided: dict[str, int] = {}
    for index in range(count):
        for name in lists["requires"][index] or ():
            if name not in provided:
                raise PTOError(f"run_concurrent: graph {index} requires {name!r}, which no earlier graph "
                               f"provides (provided so far: {sorted(provided) or 'nothing'})")
        for name in lists["provides"][index] or ():
            if name in provided:
                raise PTOError(f"run_concurrent: graph {index} provides {name!r}, which graph "
                               f"{provided[name]} already provides")
            provided[name] = index


def _make_transport(comm: object, name: str, backend):
    if name == "nccl":
        if backend.name != "cuda":
            raise PTOError("transport='nccl' moves GPU memory: it needs the CUDA backend")
        from .distributed.nccl import NcclTransport

        return NcclTransport(comm)
    from .distributed.transport import MpiTransport

    return MpiTransport(comm)


def _make_backend(name: str, heap_bytes: int, emulate: str | None, precision: str):
    if name not in BACKENDS:
        raise PTOError(f"backend={name!r}; choose one of {', '.join(map(repr, BACKENDS))}")
    if emulate is not None and name != "cuda-emulated":
        raise PTOError(f"emulate={emulate!r} is an option of backend='cuda-emulated', not of "
                       f"backend={name!r}")
    if name == "cpu":
        return CpuBackend(heap_bytes)
    if name == "cuda-emulated":  # never chosen by "auto": it is for machines without a GPU
        from .backends.cuda import CudaBackend
        from .backends.emulated_device import EmulatedDevice

        return CudaBackend(EmulatedDevice(heap_bytes, emulate or "gpu-code"), precision=precision)
    reason = cuda_unavailable()
    if reason is None:
        from .backends.cuda import CudaBackend
        from .backends.cuda_device import CupyDevice  # imports CuPy, which the CPU path never needs

        return CudaBackend(CupyDevice(heap_bytes), precision=precision)
    if name == "cuda":
        raise PTOError(f"backend='cuda' cannot be used: {reason}; use backend='cpu' or 'auto'")
    log.info("pto-gpu: no CUDA (%s); using the CPU backend", reason)
    return CpuBackend(heap_bytes)


def cuda_unavailable() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    try:
        import cupy
    except ImportError:
        return "cupy is not installed"
    try:
        return None if cupy.cuda.is_available() else "cupy finds no CUDA device"
    except Exception as error:  # a broken driver install is "no GPU" too
        return f"cupy cannot reach CUDA ({error})"


class Replay:
    """A captured run (Runtime.capture): `replay()` runs it again and returns when it has run."""

    def __init__(self, runtime: Runtime, graph: CapturedGraph, result: RunResult):
        self._runtime = runtime  # the graph runs on its backend's heap and streams
        self._graph = graph  # holds the memory it reads and writes (StreamBackend.end_capture)
        self.result = result  # the capture's: tasks, edges and ring high-water marks

    @property
    def num_tasks(self) -> int:
        return self.result.num_tasks

    def replay(self) -> None:
        runtime = self._runtime
        with runtime._exclusively("replay() called while its runtime is running an orchestration; the "
                                  "graph uses the same heap"):
            runtime.backend.wait_for_caller()
            with _one_blas_thread():
                self._graph.replay()
