"""RunResult: what a run did and what it cost, and the table `print(result)` shows."""

from __future__ import annotations

import dataclasses

from .graph import Graph
from .profile import Profile


@dataclasses.dataclass(frozen=True)
class KernelTime:
    tasks: int
    seconds: float  # total over its tasks

    @property
    def mean(self) -> float:
        return self.seconds / self.tasks


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This rank's share of a distributed run (Runtime(comm=...))."""

    rank: int
    size: int
    tasks_run: list[int]  # ids of the orchestration's tasks that ran on this rank
    bytes_sent: int  # by this rank's transfers, packed
    bytes_received: int
    # Of the tasks compiled code submitted, those it placed itself (jit/placing.py), not the
    # Python placement: a rank's count, since what it may place depends on what it sends.
    placed_by_compiled_code: int = 0
    transfers: int = 0  # this rank's sends and receives
    native_transfers: int = 0  # of those, the ones native code posted through MPI (executors/native.py)


@dataclasses.dataclass
class RunResult:
    orchestration: str
    num_tasks: int  # the orchestration's (a distributed run's transfers are not counted)
    # a distributed run's, unless recorded, also counts the edges of this rank's transfers; a run
    # that does not record leaves out edges to retired tasks whose TensorMap entries a full pool
    # evicted (core/tensormap.py), so its count may depend on the pool's size and on timing
    num_edges: int
    seconds: float  # wall time of the whole run: orchestration and execution
    backend: str
    executor: str
    high_water: dict[str, int]  # ring -> the most it held at once (tasks, bytes or entries)
    capacity: dict[str, int]  # ring -> its size, in the same units
    stalls: dict[str, float]  # ring -> seconds the orchestrator waited for room in it
    kernels: dict[str, KernelTime]  # kernel name -> tasks run and their time (none on a dry run)
    busy: dict[str, float]  # worker class -> share of (wall time x its workers) spent in kernels
    # CPU seconds the run's threads used: "caller" (the thread that called run: the orchestration,
    # the tasks it ran at submission, its wait; on the serial and sim executors, CPU backend, every
    # kernel), and on the parallel executor each worker class's threads (their native loops
    # included); not counted: stream threads, the CUDA emulator's, a pipelined core stage's
    cpu_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    graph: Graph | None = None
    makespan: float | None = None  # executor="sim": the simulated seconds from first start to last end
    # consumers that ran on another worker than a producer (sim; threads under affinity); on
    # the stream executors, the event waits a stream enqueued for a producer on another
    cross_waits: int | None = None
    # kernel -> (measured - predicted) / measured, over this run's calls the cost history (as it
    # was before the run) or a cost= model could predict
    prediction_error: dict[str, float] = dataclasses.field(default_factory=dict)
    ranks: Ranks | None = None  # a distributed run's: this rank's tasks and bytes
    # run by native workers, without the GIL (executors/native.py); on a CUDA driver's stream
    # executor, issued from the argument tables without the backend preparing their launch
    native_tasks: int = 0
    # the launches (and cuBLAS calls) the stream executor on a CUDA driver made: fewer than its
    # tasks where tasks of one instance went out as one (executors/driver_streams.py)
    native_launches: int = 0

    @property
    def tasks_run(self) -> list[int]:
        """Ids of the tasks that ran in this process: all of them, except in a distributed run."""
        return list(range(self.num_tasks)) if self.ranks is None else self.ranks.tasks_run

    def __str__(self) -> str:
        lines = [f"{self.orchestration}: {self.num_tasks:,} tasks, {self.num_edges:,} edges in "
                 f"{self.seconds * 1e3:.1f} ms ({self.backend} backend, {self.executor} executor)"]
        if self.ranks is not None:
            r = self.ranks
            lines.append(f"  rank {r.rank} of {r.size}: ran {len(r.tasks_run):,} tasks, "
                         f"sent {r.bytes_sent:,} B, received {r.bytes_received:,} B in {r.transfers:,} "
                         f"transfers ({r.native_transfers:,} posted by native code)")
        if self.makespan is not None:
            lines.append(f"  simulated makespan {self.makespan * 1e3:.3f} ms")
        if self.cross_waits is not None:
            lines.append(f"  waits on a producer that ran on another worker: {self.cross_waits:,}")
        if self.native_tasks:
            lines.append(f"  run natively (native workers, or launches from the argument tables): "
                         f"{self.native_tasks:,} tasks")
        if self.native_launches:
            lines.append(f"  in {self.native_launches:,} launches")
        lines.append("  CPU ms by thread: " + ", ".join(f"{who} {spent * 1e3:.2f}"
                                                         for who, spent in self.cpu_seconds.items()))
        if self.prediction_error:
            errors = ", ".join(f"{name} {e:+.0%}" for name, e in sorted(self.prediction_error.items()))
            lines.append(f"  cost prediction error (measured vs predicted): {errors}")
        if self.kernels:
            lines.append(f"  {'kernel':<24} {'tasks':>9} {'total ms':>10} {'mean us':>9}")
            for name, k in sorted(self.kernels.items(), key=lambda item: -item[1].seconds):
                lines.append(f"  {name:<24} {k.tasks:>9,} {k.seconds * 1e3:>10.2f} {k.mean * 1e6:>9.1f}")
            lines.append(f"  {'worker class':<24} {'busy':>9}")
            lines += [f"  {worker:<24} {share:>9.1%}" for worker, share in self.busy.items()]
        else:
            lines.append("  (no kernel ran: dry run)")
        lines.append(f"  {'ring':<24} {'high water':>12} {'capacity':>12} {'stalled ms':>11}")
        for ring, most in self.high_water.items():
            lines.append(f"  {ring:<24} {most:>12,} {self.capacity[ring]:>12,} "
                         f"{self.stalls.get(ring, 0.0) * 1e3:>11.2f}")
        return "\n".join(lines)


def kernel_times(profile: Profile) -> dict[str, KernelTime]:
    totals: dict[str, list] = {}
    for lane in profile.lanes:
        for name, (tasks, seconds) in lane.kernels.items():
            total = totals.setdefault(name, [0, 0.0])
            total[0] += tasks
            total[1] += seconds
    return {name: KernelTime(tasks, seconds) for name, (tasks, seconds) in totals.items()}


def busy_shares(profile: Profile, wall_seconds: float) -> dict[str, float]:
    """Per worker class that ran a task, its kernel time over wall time x the lanes serving it."""
    busy: dict = {}
    lanes: dict = {}
    for lane in profile.lanes:
        for worker, seconds in lane.busy.items():
            busy[worker] = busy.get(worker, 0.0) + seconds
            lanes[worker] = lanes.get(worker, 0) + 1
    return {worker.name: busy[worker] / (wall_seconds * lanes[worker])
            for worker in sorted(busy) if busy[worker] > 0}
