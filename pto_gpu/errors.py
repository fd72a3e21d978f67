"""The exception hierarchy: every error the runtime raises on purpose is a PTOError."""


class PTOError(Exception):
    """Base class of every error raised by pto-gpu."""


class DeadlockError(PTOError):
    """A ring is too small for what the orchestration keeps live; waiting would never end."""


class TaskError(PTOError):
    """A kernel raised while running a task; the original exception is chained."""

    def __init__(self, task_id: int, kernel: str, params: str, cause: BaseException):
        super().__init__(
            f"task {task_id} ({kernel}) failed: {type(cause).__name__}: {cause}\n  params: {params}"
        )
        self.task_id = task_id
        self.kernel = kernel

    @classmethod
    def of(cls, task, cause: BaseException) -> "TaskError":
        """The error for `task` (a scheduler Task), whose kernel raised `cause`."""
        return cls(task.public_id, task.kernel.name, task.describe_params(), cause)


class RankError(PTOError):
    """Another rank of a distributed run failed (its error is in the message), or the ranks
    disagree about the run (communicator size, owners out of range)."""


class LifecycleError(PTOError):
    """Misuse of a buffer's lifecycle (use after free, double free, freeing an external)."""


class UseAfterFreeError(LifecycleError):
    """A freed buffer was passed to a task, sliced into a new param, or allocated over."""


class DoubleFreeError(LifecycleError):
    """`free` was called twice on one buffer."""


class StaleVersionError(PTOError):
    """A tensor handle older than the newest version written to its memory was used."""


class LayoutError(PTOError):
    """A slice, reshape or allocation that the descriptor's layout cannot express."""


class ParamError(PTOError):
    """A task param of the wrong kind, or a raw array where a tensor was expected."""


class UsageError(PTOError):
    """An API call made in a state that does not allow it (submit outside a run, nested runs)."""


class InvariantError(PTOError):
    """Validation mode found the scheduler's state inconsistent: a bug in pto-gpu."""
