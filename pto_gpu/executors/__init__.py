"""Executors: who runs the tasks of a run, and when.

serial: each task at submission, on the caller's thread (the reference every other
executor is tested against). dry: each task retires at submission without running its
kernel (graph building only). parallel: worker threads per worker class.
"""

from __future__ import annotations

from ..errors import TaskError
from ..scheduler import Task


def run_kernel(backend, task: Task) -> None:
    """Run one task's kernel on the backend; a failure becomes TaskError with the cause chained."""
    try:
        backend.run(task)
    except Exception as cause:
        raise TaskError(task.id, task.kernel.name, task.describe_params(), cause) from cause
