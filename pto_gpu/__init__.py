"""pto-gpu: PTO task graphs on a CUDA GPU, with a parallel CPU fallback.

    rt = pto.Runtime()
    result = rt.run(orchestration, *args)   # orchestration(o, *args) submits tasks via `o`
"""

from importlib.metadata import PackageNotFoundError, version

from .costs import CostHistory
from .distributed import DistArray, block_cyclic, block_cyclic_2d, block_rows
from .dtypes import DataType, WorkerType, element_size
from .errors import (
    DeadlockError,
    DoubleFreeError,
    InvariantError,
    LayoutError,
    LifecycleError,
    ParamError,
    PTOError,
    RankError,
    StaleVersionError,
    TaskError,
    UsageError,
    UseAfterFreeError,
)
from .graph import Graph
from .kernel import CudaCode, Kernel, kernel
from .orchestrator import Orchestrator
from .overlap import Overlap
from .params import Param, ParamKind, inout, input, output, scalar
from .result import KernelTime, Ranks, RunResult
from .runtime import Replay, Runtime
from .schedule import Schedule
from .tensor import Buffer, TensorDescriptor
from .tiers import Tiers, tiers

FLOAT32 = DataType.FLOAT32
FLOAT16 = DataType.FLOAT16
BFLOAT16 = DataType.BFLOAT16
FLOAT64 = DataType.FLOAT64
INT64 = DataType.INT64
INT32 = DataType.INT32
INT16 = DataType.INT16
INT8 = DataType.INT8
UINT64 = DataType.UINT64
UINT8 = DataType.UINT8
BOOL = DataType.BOOL

CUBE = WorkerType.CUBE
VECTOR = WorkerType.VECTOR
AI_CPU = WorkerType.AI_CPU
ACCELERATOR = WorkerType.ACCELERATOR

__all__ = [
    "ACCELERATOR", "AI_CPU", "BFLOAT16", "BOOL", "CUBE", "CostHistory", "CudaCode", "FLOAT16", "FLOAT32",
    "FLOAT64", "INT16", "INT32", "INT64", "INT8", "UINT64", "UINT8", "VECTOR", "Buffer", "DataType",
    "DeadlockError", "DoubleFreeError", "Graph", "InvariantError", "Kernel", "LayoutError", "LifecycleError",
    "KernelTime", "Orchestrator", "Overlap",
    "PTOError", "Param", "ParamError", "ParamKind", "RankError", "Ranks", "Replay", "RunResult", "Runtime",
    "Schedule", "block_cyclic", "block_cyclic_2d", "block_rows", "DistArray",
    "StaleVersionError", "TaskError", "TensorDescriptor", "Tiers", "UsageError", "UseAfterFreeError",
    "WorkerType", "element_size", "inout", "input", "kernel", "output", "scalar", "tiers",
]

try:
    __version__ = version("pto-gpu")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
