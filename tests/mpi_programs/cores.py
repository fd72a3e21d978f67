"""Run under mpiexec (tests/test_mpi.py): prints "CORES <n>" on every rank, the cores the
parallel executor counts for it (executors/parallel.py's process_cores), so a test knows
whether `-bind-to core` gave each rank one.

    mpiexec -bind-to core -n 2 python -m tests.mpi_programs.cores
"""

from pto_gpu.executors.parallel import process_cores

if __name__ == "__main__":
    print(f"CORES {process_cores()}", flush=True)
