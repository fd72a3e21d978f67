"""Distributed runs (issue 18): the 2048² tiled matmul on 2 ranks against 1 (orchestrated from
Python, and by programs/matmul.pto's compiled code, which places most tasks itself), the added
latency of a small cross-rank transfer against mpi4py's own; the memory a rank holds of a
pto.DistArray (issue 45).

Each case starts `mpiexec -n N python -m bench.mpi_programs.timing ...` with OMP_NUM_THREADS=1
(every rank one thread per worker class, so N ranks use N cores), which times its rounds itself
and prints them; the benchmark's own time is the whole launch, and the figures are in
extra_info. One rank and two are launched in turn, PAIRS times, and the figures are the medians
of the pairs, with the range of their ratios: a shared 2-vCPU machine moves by more between one
launch and the next than the changes they are to show. Targets (issue 45): matmul 2 ranks >=
1.7x 1 rank; the 2048² tiled Cholesky in 256² tiles on a 2-D block-cyclic grid, 2 ranks >= 1.5x
1 rank; a transfer adds at most 10 µs to MPI's latency (ping-pong hop on 2 ranks - hop on 1 rank
- MPI's one-way time, the hops timed as they execute, the graph built beforehand; the hops of
runs that build the graph as they go are in extra_info too), with a Python kernel (`latency`)
and a generated one that native workers run (`latency-native`); no busy core while a rank waits
(`waiting_cpu_share`: a rank's CPU seconds over the wall seconds of a run in which it waits 0.2
s for another rank's data). `tile-copies` times MPI alone moving the matmul's tiles. The
matmul and Cholesky cases also report each group of threads' CPU seconds (RunResult.cpu_seconds:
the caller, each worker class), of the rank that spent the most."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside the interpreter (pip install "
                                                              "mpich)")


def timing(ranks: int, what: str, tile: int, order: str | None = None) -> dict:
    """`order`: the Cholesky's Schedule(order_by=...), or none."""
    # A rank per core, as MPI runs are usually launched: unbound, the OS moved the ranks'
    # threads between the two cores, which cost the 2-rank matmul ~15% (docs/BENCHMARKS.md).
    command = [str(MPIEXEC), "-bind-to", "core", "-n", str(ranks), sys.executable, "-m",
               "bench.mpi_programs.timing", what, str(tile), *([order] if order else [])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


PAIRS = 3


def median_figures(runs: list[dict]) -> dict:
    """Each figure's median over the runs (of a figure by group of threads, each group's)."""
    figures = {}
    for name, first in runs[0].items():
        if isinstance(first, dict):  # (a class whose threads never started in a run: 0 there)
            groups = sorted({group for run in runs for group in run[name]})
            figures[name] = {group: statistics.median(run[name].get(group, 0.0) for run in runs)
                             for group in groups}
        else:
            figures[name] = statistics.median(run[name] for run in runs)
    return figures


def test_dist_array_memory_per_rank(benchmark):
    """pto.DistArray of 8192² float32 over 2 ranks (issue 45's target: each rank's own array
    memory at most 55% of the whole): the bytes each rank holds after scatter and after a run
    whose tiles read the other rank's rows. The benchmark's time is the whole launch."""
    figures = {}
    benchmark.pedantic(lambda: figures.update(timing(2, "memory", 256)), rounds=1, iterations=1)
    whole = figures["whole_bytes"]
    benchmark.extra_info.update(whole_mib=whole / 2**20, run_s=figures["seconds"],
                                share_after_scatter=max(figures["bytes_after_scatter"]) / whole,
                                share_after_run=max(figures["bytes_after_run"]) / whole)


def test_mpi_moving_the_matmul_s_tiles(benchmark):
    """MPICH alone moving the 2-rank 2048² matmul's B tiles (256²) as the run does, each rank
    its 32 sends and 32 receives at once: in place, with the runtime's datatype for a strided
    region, against the same bytes packed. What a run's transfers cost its ranks' cores before
    the runtime does anything, and what packing before a send could save at most."""
    figures = {}
    benchmark.pedantic(lambda: figures.update(timing(2, "tile-copies", 256)), rounds=1, iterations=1)
    benchmark.extra_info.update({f"{name}_s": figures[f"{name}_seconds"] for name in
                                 ("strided", "strided_cpu", "packed", "packed_cpu")})


def test_cholesky_on_two_ranks_by_schedule(benchmark):
    """The 2-rank tiled Cholesky 2048² / 256 without a schedule, under order_by="fifo" and under
    the critical path (which weighs every rank's tasks), launched in turn PAIRS times: the
    median seconds of each."""
    orders = (None, "fifo", "critical_path")
    runs: dict[str | None, list[float]] = {order: [] for order in orders}

    def in_turn() -> None:
        for _ in range(PAIRS):
            for order in orders:
                runs[order].append(timing(2, "cholesky", 256, order)["seconds"])

    benchmark.pedantic(in_turn, rounds=1, iterations=1)
    benchmark.extra_info.update({f"{order or 'no_schedule'}_s": statistics.median(seconds)
                                 for order, seconds in runs.items()})


@pytest.mark.parametrize("what, tile", [("matmul", 256), ("matmul", 512), ("matmul-compiled", 256),
                                        ("cholesky", 256), ("latency", 0), ("latency-native", 0)],
                         ids=["matmul-256", "matmul-512", "matmul-compiled-256", "cholesky-256", "latency",
                              "latency-native"])
def test_two_ranks_against_one(benchmark, what, tile):
    pairs = []

    def in_turn() -> None:
        pairs.extend((timing(1, what, tile), timing(2, what, tile)) for _ in range(PAIRS))

    benchmark.pedantic(in_turn, rounds=1, iterations=1)
    one, two = (median_figures([pair[ranks] for pair in pairs]) for ranks in (0, 1))
    if not what.startswith("latency"):
        speedups = sorted(a["seconds"] / b["seconds"] for a, b in pairs)
        benchmark.extra_info.update(one_rank_s=one["seconds"], two_ranks_s=two["seconds"],
                                    speedup=statistics.median(speedups), speedup_low=speedups[0],
                                    speedup_high=speedups[-1],
                                    one_rank_cpu_s=one["cpu_seconds"], two_ranks_cpu_s=two["cpu_seconds"],
                                    one_rank_cpu_by_thread_s=one["cpu_by_thread"],
                                    two_ranks_cpu_by_thread_s=two["cpu_by_thread"])
        if "orchestration_seconds" in one:  # the slowest rank's, median round
            benchmark.extra_info.update(one_rank_orchestration_s=one["orchestration_seconds"],
                                        two_ranks_orchestration_s=two["orchestration_seconds"])
    else:
        added = two["execution_per_hop_us"] - one["execution_per_hop_us"] - two["mpi_one_way_us"]
        benchmark.extra_info.update(hop_one_rank_us=one["per_hop_us"], hop_two_ranks_us=two["per_hop_us"],
                                    executed_hop_one_rank_us=one["execution_per_hop_us"],
                                    executed_hop_two_ranks_us=two["execution_per_hop_us"],
                                    mpi_one_way_us=two["mpi_one_way_us"], added_by_a_transfer_us=added,
                                    waiting_cpu_share=two["waiting_cpu_share"])
