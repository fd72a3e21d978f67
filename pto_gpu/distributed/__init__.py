"""Several processes (and GPUs) running one orchestration: StarPU-MPI's model over MPI.

Layers, each importing only those below: `ownership` (ranks and distributions of rows),
`dist_array` (arrays each rank holds only its rows of),
`holdings` (which rank holds the newest version of each element), `transport` (moving
elements, telling ranks of failures: MPI) and `nccl` (GPU to GPU), `logical` (the graph a
single process would record), `placement` (where tasks run, the transfer tasks), `outcome`
(how a run ends on every rank). The orchestrator calls placement's hooks; the Runtime makes
the transport and ends each run through outcome.
"""

from .dist_array import DistArray
from .ownership import BlockCyclic, BlockCyclic2D, BlockRows, block_cyclic, block_cyclic_2d, block_rows

__all__ = ["BlockCyclic", "BlockCyclic2D", "BlockRows", "DistArray", "block_cyclic", "block_cyclic_2d",
           "block_rows"]
