"""Native workers: the ready tasks of compiled kernels run and complete without the GIL.

A task is *native* when its arguments are in the run's argument tables (jit/context.py: every
compiled submit writes them, and so does a Python submit of a kernel these lanes run) and its
kernel has NativeCode (kernel.py: the kernel families the ISA compiler generates, the kernels
`isa.compile` makes of a user's program or `.pto` file, the matmuls' BLAS library, and
`pto.kernel(..., njit=True)`):
a worker thread then pops it, calls its kernel's native entry (pto_gpu/native_abi.py) and
completes it in the core, all in one nogil numba loop (`drain`), and goes on with the
consumers that made ready; Python sees the loop only every `budget` tasks and SLICE_NS.
Everything else runs the Python way (executors/parallel.py), and the two hand tasks to each other:

  - the ready native tasks of each worker class wait in a ring here (`ready`); the
    orchestrator's log flush (jit/host.py) and the executor's flush (`queue`) push those
    ready at submission, and every completion, native or not, pushes the native consumers
    it makes ready;
  - a native loop that makes a non-native task ready, or meets an instance it has no entry
    for yet, puts it in `handoff` and returns: the executor builds its record and queues it
    for a Python worker, which runs it (compiling the instance) and `learn`s its entry.

Concurrency: the core's tables, the rings and the instance table change only under the core
lock (core/lock.py), which every core entry takes once `locking` is set; the kernel runs
outside it. A native loop never takes the executor's lock (it runs without the GIL); the
executor reads the rings' counters without the core lock only to decide whether to wake or
wait, which a later look under its own lock settles (parallel.py's `_idle_locked`).

A distributed run's transfers (kernel.SEND, RECEIVE) are native too where the MPI library
allows (distributed/transport.py): a loop that makes one ready runs it next, whatever its
class, as a Python worker runs such a task itself (Task.inline), and posts it through MPI
(mpi_abi.py) instead of calling an entry; the task then waits in `Posting` until MPI says it
has completed. Loops test the posted transfers when their ring runs dry and every POLL_EVERY
tasks, and so does the executor's idle worker that holds the poll (`poll`); whoever sees one
complete completes it and routes what that made ready. A Python worker posts those its
completion makes ready as it completes (`complete`), and others with `post`.
A transfer compiled code entered ready at submission (jit/api.py) is queued at the log's
flush, on its class's ring, as compiled code's other tasks are.

Entries are found by an instance key (the kernel, its tensors' dtype and shapes, each
scalar's kind and the structural scalars' values: what picks a kernel family's instance) in an
open-addressing table; entries learnt are kept for the process's later runs.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from numba import njit

from ..core.complete import complete_held, start_held
from ..core.lock import acquire, compare_and_swap, monotonic_ns, release, store_release, yield_core
from ..dtypes import WorkerType
from ..errors import InvariantError, TaskError
from ..jit.context import ArgTables
from ..jit.descriptor import D_BASE, D_OFFSET
from ..kernel import SEND, Kernel
from ..mpi_abi import mpi_post, mpi_testsome
from ..native_call import call_entry, compiled_entry
from ..params import ParamKind
from ..profile import Lane
from ..tasks import Scheduler, Task
from .instance_keys import INSTANCES, KERNEL_INFO, KEY_WIDTH, find, instance_key

# A native loop runs at least `budget` tasks and SLICE_NS before Python looks (completions
# counted, hand-offs queued, sleepers woken): each look takes the GIL and the executor's lock,
# and costs ~0.2 ms of a worker's time when the orchestrator runs too. For tasks of 27 us (the
# 2048² panel matmul's), a budget of 64 made that 8% of its run; 256, 3%. But the orchestrator
# refills a full task ring only as loops report completions, so a class's loops together run at
# most half the window between reports (`budget`), and at least MIN_BUDGET tasks each.
BUDGET = 256
MIN_BUDGET = 64
SLICE_NS = 1_000_000
# A native loop that has run this long returns as soon as it makes ready a task that a sleeping
# worker could take, so that the executor wakes it: waking costs a Python round trip (~5 us),
# worth it for tasks of that size, not for the tiny tasks of a loop that has just started.
WAKE_AFTER_NS = 20_000
# ... if a core is free for that worker (fewer workers take one than the process has: `busy`):
# else the woken worker would only take turns on a core with this loop, and each hand-over
# between classes costs a round trip through Python on both threads (~110 us on the 2-core VM,
# beside BLAS tiles that leave Python's objects out of cache: the 2048² matmul's 64 copies, of
# another class than its products, took 7 ms of its ~140 on one core). Then the loop returns
# to wake it after this long at the latest, a scheduler's time slice, so that another class's
# task (one another rank waits for, say) waits no longer than the OS would have made it.
SHARE_NS = 5_000_000
NO_ENTRY = -1  # an instance that runs the Python way (half precision, an empty batch)
CLASSES = len(WorkerType)
POLL_EVERY = 16  # a loop with transfers posted tests them at least once every so many tasks
# A loop whose ring runs dry with transfers posted tests them, yielding the core between
# tests, this long before it returns (then the executor's poll waits, sleeping): a hop to
# another rank and back is tens of microseconds, and a return to Python and back costs ~10.
WAIT_POSTED_NS = 50_000

CONTROL = np.dtype([
    ("head", np.int64, (CLASSES,)),  # per worker class: next ready task to pop
    ("tail", np.int64, (CLASSES,)),  # per worker class: where the next ready task goes
    ("handoff_head", np.int64),
    ("handoff_tail", np.int64),
    ("sleeping", np.int64, (CLASSES,)),  # per worker class: workers waiting for a task (set by Python)
    ("busy", np.int64),  # workers that take a core: running a task or a loop (set by Python)
    ("cores", np.int64),  # the process's cores
    ("failed", np.int64),  # the first task whose kernel raised in a native loop, or -1
    ("isend", np.int64),  # MPI's functions (NativeMpi), where transfers are native
    ("irecv", np.int64),
    ("testsome", np.int64),
    ("posted", np.int64),  # transfers posted and not yet seen complete: Posting.slots[:posted]
    ("posts", np.int64),  # transfers posted, in all
    ("posting_lock", np.int64),  # held to call MPI and to change Posting (`_take_posting`)
], align=True)
_POSTING_LOCK = CONTROL.fields["posting_lock"][1]

_LEARNT: dict[bytes, int] = {}  # instance key -> entry address (or NO_ENTRY), for the process


class Posting(NamedTuple):
    """The transfers native code has posted (module docstring), under the posting lock
    (CONTROL.posting_lock, below the core's: MPI is called with it held, never the core's)."""

    requests: np.ndarray  # int32 per task slot: the MPI request of the transfer in it
    slots: np.ndarray  # the slots of the posted transfers (CONTROL.posted of them)
    testing: np.ndarray  # int32: their requests, as MPI_Testsome takes them
    indices: np.ndarray  # int32: MPI_Testsome's completed positions
    count: np.ndarray  # int32 [1]: how many
    finished: np.ndarray  # the slots of those
    statuses: np.ndarray  # bytes: MPI_Testsome's statuses

    @classmethod
    def allocate(cls, window: int, status_bytes: int) -> Posting:
        return cls(np.zeros(window, np.int32), np.zeros(window, np.int64), np.zeros(window, np.int32),
                   np.zeros(window, np.int32), np.zeros(1, np.int32), np.zeros(window, np.int64),
                   np.zeros(window * status_bytes, np.uint8))


class WorkerScratch(NamedTuple):
    ready: np.ndarray  # completion scratch (consumers made ready)
    key: np.ndarray  # an instance key
    stats: np.ndarray  # per kernel: tasks run natively, their ns
    transfers: np.ndarray  # [1]: of a loop's completions, how many were transfers


# --- the rings ---------------------------------------------------------------------------------


@njit(cache=True, _nrt=False, inline="always")
def _is_native(tasks, kernel_info, arg_task, window, task_id):
    slot = task_id & (window - 1)
    if arg_task[slot] != task_id:
        return False
    kernel = tasks[slot].kernel  # one declared after the lanes were made runs the Python way
    return kernel < len(kernel_info) and kernel_info[kernel].native


@njit(cache=True, _nrt=False, inline="always")
def _is_native_transfer(tasks, kernel_info, arg_task, window, task_id):
    return _is_native(tasks, kernel_info, arg_task, window, task_id) and \
        kernel_info[tasks[task_id & (window - 1)].kernel].transfer != 0


@njit(cache=True, _nrt=False, inline="always")
def _push_ready(tasks, control, ready, window, task_id):
    worker = tasks[task_id & (window - 1)].worker
    c = control[0]
    ready[worker, c.tail[worker] & (window - 1)] = task_id
    c.tail[worker] += 1


@njit(cache=True, _nrt=False, inline="always")
def _push_handoff(control, handoff, task_id):
    c = control[0]
    handoff[c.handoff_tail & (len(handoff) - 1)] = task_id
    c.handoff_tail += 1


@njit(cache=True, _nrt=False, inline="always")
def _push_next(control, ready, window, worker, task_id):
    """Put a ready task at the front of its ring: the one its worker pops next."""
    c = control[0]
    c.head[worker] -= 1
    ready[worker, c.head[worker] & (window - 1)] = task_id


@njit(cache=True, _nrt=False, inline="always")
def _route(header, tasks, control, ready, handoff, kernel_info, arg_task, scratch, n, hand_off, worker):
    """Push the native ones of the n tasks in scratch[:n] on their rings, the first of class
    `worker` (-1: none) at the front, and native transfers at the front of `worker`'s, before
    it (run next by its loop; from Python, worker -1, they stay, for `_complete` to post); the
    others go to `handoff` if `hand_off` (always, from a loop), else stay in scratch
    (compacted to the front); how many stay."""
    window = header[0].window
    kept = 0
    mine = worker  # `worker` is cleared once a task of its class has gone to the front
    transfers = 0
    for i in range(n):
        task_id = scratch[i]
        if _is_native_transfer(tasks, kernel_info, arg_task, window, task_id):
            if mine >= 0:
                transfers += 1  # pushed below, in front of whatever this pass puts first
                continue
            native = False
        else:
            native = _is_native(tasks, kernel_info, arg_task, window, task_id)
        if native:
            if tasks[task_id & (window - 1)].worker == worker:
                _push_next(control, ready, window, worker, task_id)
                worker = -1
            else:
                _push_ready(tasks, control, ready, window, task_id)
        elif hand_off:
            _push_handoff(control, handoff, task_id)
        else:
            scratch[kept] = task_id
            kept += 1
    # scratch is intact (a loop's route hands off); pushed from the last made ready to the
    # first, each in front of those before it: the first runs first, in submission order
    for i in range(n - 1 if transfers else -1, -1, -1):
        task_id = scratch[i]
        if _is_native_transfer(tasks, kernel_info, arg_task, window, task_id):
            _push_next(control, ready, window, mine, task_id)
    return kept


@njit(cache=True, _nrt=False)
def _admit(header, tasks, control, ready, kernel_info, arg_task, log, logged):
    """The log flush: queue the native tasks ready at submission, leave the native ones not ready
    (their last producer's completion queues them), and compact the others to the front of the
    log for the executor; how many those are."""
    acquire(header)
    window = header[0].window
    kept = 0
    for i in range(logged):
        task_id = log[i, 0]
        if _is_native(tasks, kernel_info, arg_task, window, task_id):
            if log[i, 1]:
                _push_ready(tasks, control, ready, window, task_id)
        else:
            log[kept, 0] = task_id
            log[kept, 1] = log[i, 1]
            kept += 1
    release(header)
    return kept


@njit(cache=True, _nrt=False)
def _complete(header, tasks, buffers, deps, control, ready, kernel_info, args, posting, task_id, scratch):
    """A Python worker's completion: the native consumers made ready go on their rings, and the
    native transfers among them are started and posted here, on this thread, as a loop posts
    those it makes ready (a hop's send, which Python would otherwise dispatch to this thread
    again), if the posting lock is free: this runs with the GIL, so it must not wait for a
    test that holds the lock (one may be copying a large message, or be a Python stand-in
    for MPI that needs the GIL); else Python posts it. The others are left in scratch[:n], n
    returned. -1 if MPI could not post one (control.failed names it)."""
    acquire(header)
    window = header[0].window
    n = complete_held(header, tasks, buffers, deps, task_id, scratch)
    kept = _route(header, tasks, control, ready, scratch, kernel_info, args.task, scratch, n, False, -1)
    i = 0
    while i < kept:
        transfer_id = scratch[i]
        if not (_is_native_transfer(tasks, kernel_info, args.task, window, transfer_id)
                and _take_posting(control, False)):
            i += 1
            continue
        for j in range(i, kept - 1):  # out of the others, which keep their order
            scratch[j] = scratch[j + 1]
        kept -= 1
        if _start_and_post(header, tasks, control, kernel_info, args, posting, transfer_id, window, True):
            kept = -1
            break
    release(header)
    return kept


@njit(cache=True, _nrt=False)
def _take_handoffs(header, control, handoff, out):
    """Move the handed-off task ids to out[:n]; n."""
    acquire(header)
    c = control[0]
    n = 0
    while c.handoff_head != c.handoff_tail:
        out[n] = handoff[c.handoff_head & (len(handoff) - 1)]
        c.handoff_head += 1
        n += 1
    release(header)
    return n


# --- instances ---------------------------------------------------------------------------------


@njit(cache=True, _nrt=False)
def _known(header, tasks, kernel_info, args, keys, addresses, filled, task_id, key):
    """Write a task's instance key to `key`; whether the table has the instance, or has no
    room for it, or the task has no key (then there is nothing to learn)."""
    acquire(header)
    known = True
    if instance_key(tasks, kernel_info, args, header[0].window, task_id, key):
        full = 2 * filled[0] >= len(addresses)  # at most half full: probes stay short
        known = full or addresses[find(keys, addresses, key)] != 0
    release(header)
    return known


@njit(cache=True, _nrt=False)
def _enter(header, keys, addresses, filled, key, address):
    """Enter an instance's key with its entry (once: another thread may have just done it)."""
    acquire(header)
    slot = find(keys, addresses, key)
    if addresses[slot] == 0:
        for i in range(len(key)):
            keys[slot, i] = key[i]
        addresses[slot] = address
        filled[0] += 1
    release(header)


# --- the loop ----------------------------------------------------------------------------------


@njit(cache=True, _nrt=False, nogil=True)
def _drain(header, tasks, buffers, deps, control, ready, handoff, kernel_info, args, keys, addresses, posting,
           worker, scratch, key, stats, transfers, budget):
    """Run and complete the ready native tasks of class `worker` until there are none, a task
    needs Python (handed off), a kernel raised or a transfer failed (control.failed), or
    `budget` have run in at least SLICE_NS, posting transfers and completing those MPI has
    finished (`_test_posted`); how many completed, transfers[0] of them transfers.
    stats[kernel] += (tasks, ns)."""
    window = header[0].window
    c = control[0]
    done = 0
    transfers[0] = 0
    entered = monotonic_ns()
    ended = entered
    # The lock is held at the top of the loop: a completion and the pop that follows it are one
    # hold, so the consumer _route put first is this loop's next task, not another worker's.
    acquire(header)
    since_poll = 0
    waiting_since = 0  # when the ring ran dry with transfers posted
    while c.handoff_head == c.handoff_tail:  # else Python has a task
        if c.posted and (c.head[worker] == c.tail[worker] or since_poll >= POLL_EVERY):
            since_poll = 0
            release(header)
            polled = _test_posted(header, tasks, buffers, deps, control, ready, handoff, kernel_info,
                                  args.task, posting, scratch, worker, False)
            acquire(header)
            if polled < 0:
                break
            done += polled
            transfers[0] += polled
            ended = monotonic_ns()
            if _time_to_return(c, worker, done, budget, entered, ended):
                break
            if c.head[worker] == c.tail[worker] and c.posted and c.handoff_head == c.handoff_tail \
                    and not _sleeper_could_take(c, worker):
                waiting_since = waiting_since or ended
                if ended - waiting_since < WAIT_POSTED_NS:  # data due soon: wait here, not in Python
                    release(header)
                    yield_core()
                    acquire(header)
                    continue
        if c.head[worker] == c.tail[worker] or c.handoff_head != c.handoff_tail:
            break
        waiting_since = 0
        task_id = ready[worker, c.head[worker] & (window - 1)]
        c.head[worker] += 1
        slot = task_id & (window - 1)
        since_poll += 1
        transfer = kernel_info[tasks[slot].kernel].transfer
        if transfer:
            if _start_and_post(header, tasks, control, kernel_info, args, posting, task_id, window, False):
                break
            ended = monotonic_ns()
            if _time_to_return(c, worker, done, budget, entered, ended):
                break
            continue
        address = 0
        if instance_key(tasks, kernel_info, args, window, task_id, key):
            address = addresses[find(keys, addresses, key)]
        if address <= 0:  # not learnt yet, or no entry: the Python way
            _push_handoff(control, handoff, task_id)
            break
        start_held(header, tasks, task_id)
        release(header)

        began = monotonic_ns()
        status = call_entry(address, args.desc[slot].ctypes.data, args.scalar_kind[slot].ctypes.data,
                            args.int[slot].ctypes.data, args.float[slot].ctypes.data)
        kernel = tasks[slot].kernel
        ended = monotonic_ns()
        acquire(header)
        if status != 0:  # not completed: its consumers never run; Python raises its TaskError
            if c.failed < 0:
                c.failed = task_id
            break
        stats[kernel, 0] += 1
        stats[kernel, 1] += ended - began
        n = complete_held(header, tasks, buffers, deps, task_id, scratch)
        _route(header, tasks, control, ready, handoff, kernel_info, args.task, scratch, n, True, worker)
        done += 1
        if _time_to_return(c, worker, done, budget, entered, ended):
            break
    release(header)
    return done


@njit(cache=True, _nrt=False, inline="always")
def _time_to_return(c, worker, done, budget, entered, ended):
    """Whether a loop returns to Python now: it has run its budget over at least SLICE_NS, or
    it has run a while (WAKE_AFTER_NS; SHARE_NS if no core is free) and made ready a task a
    sleeping worker could take."""
    ran = ended - entered
    return (done >= budget and ran >= SLICE_NS) or (
        ran >= (WAKE_AFTER_NS if c.busy < c.cores else SHARE_NS) and _sleeper_could_take(c, worker))


@njit(cache=True, _nrt=False, inline="always")
def _take_posting(control, wait):
    """Take the posting lock (wait: spin, yielding, until it is free); whether it was taken."""
    address = control.ctypes.data + _POSTING_LOCK
    while not compare_and_swap(address, 0, 1):
        if not wait:
            return False
        yield_core()
    return True


@njit(cache=True, _nrt=False, inline="always")
def _give_posting(control):
    store_release(control.ctypes.data + _POSTING_LOCK, 0)


@njit(cache=True, _nrt=False, inline="always")
def _post(control, args, posting, task_id, window, transfer):
    """Post a started transfer through MPI and add it to `posting`, under the posting lock (not
    the core's); MPI's error code. Its arguments: the region, then (index, peer, tag,
    datatype, comm)."""
    _take_posting(control, True)
    error = _post_held(control, args, posting, task_id, window, transfer)
    _give_posting(control)
    return error


@njit(cache=True, _nrt=False, inline="always")
def _start_and_post(header, tasks, control, kernel_info, args, posting, task_id, window, posting_held):
    """Start a ready native transfer (the core's lock held, and held again on return) and post
    it without the core's lock (MPI may copy a large message), under the posting lock: taken
    here, or held already (`posting_held`); MPI's error code, the task noted in
    control.failed if it could not post it (the first such)."""
    start_held(header, tasks, task_id)
    transfer = kernel_info[tasks[task_id & (window - 1)].kernel].transfer
    release(header)
    if not posting_held:
        _take_posting(control, True)
    error = _post_held(control, args, posting, task_id, window, transfer)
    _give_posting(control)
    acquire(header)
    if error != 0 and control[0].failed < 0:
        control[0].failed = task_id
    return error


@njit(cache=True, _nrt=False, inline="always")
def _post_held(control, args, posting, task_id, window, transfer):
    """`_post`, the posting lock held."""
    c = control[0]
    slot = task_id & (window - 1)
    region = args.desc[slot, 0]
    error = mpi_post(c.isend if transfer == SEND else c.irecv, region[D_BASE] + region[D_OFFSET],
                     args.int[slot, 3], args.int[slot, 1], args.int[slot, 2], args.int[slot, 4],
                     posting.requests[slot:].ctypes.data)
    if error == 0:
        posting.slots[c.posted] = slot
        c.posted += 1
        c.posts += 1
    return error


@njit(cache=True, _nrt=False, inline="always")
def _test_posted(header, tasks, buffers, deps, control, ready, handoff, kernel_info, arg_task, posting,
                 scratch, worker, wait):
    """Complete the posted transfers MPI has finished, routing what they make ready as `_route`
    does with hand-offs; how many, or -1 (control.failed set) if MPI failed. MPI is tested
    under the posting lock (0 if another thread holds it and not `wait`), the completions
    made under the core's too: a test may copy a large message, which the core's lock, held
    by every completion, must not wait for. Called without the core's lock."""
    if not _take_posting(control, wait):
        return 0
    c = control[0]
    n = c.posted
    for i in range(n):
        posting.testing[i] = posting.requests[posting.slots[i]]
    error = mpi_testsome(c.testsome, n, posting.testing.ctypes.data, posting.count.ctypes.data,
                         posting.indices.ctypes.data, posting.statuses.ctypes.data)
    finished = posting.count[0] if error == 0 else -1
    if error != 0:  # MPI says no more: the run fails
        c.posted = _forget_finished(posting, n)
        acquire(header)
        if c.failed < 0 and n > 0:
            c.failed = arg_task[posting.finished[0]]
        release(header)
    if finished > 0:  # (MPI_UNDEFINED, negative: none was active)
        for j in range(finished):
            posting.finished[j] = posting.slots[posting.indices[j]]
            posting.slots[posting.indices[j]] = -1
        kept = 0
        for i in range(n):
            if posting.slots[i] >= 0:
                posting.slots[kept] = posting.slots[i]
                kept += 1
        c.posted = kept
        acquire(header)
        for j in range(finished):
            made = complete_held(header, tasks, buffers, deps, arg_task[posting.finished[j]], scratch)
            _route(header, tasks, control, ready, handoff, kernel_info, arg_task, scratch, made, True, worker)
        release(header)
    _give_posting(control)
    return -1 if error != 0 else max(finished, 0)


@njit(cache=True, _nrt=False, inline="always")
def _forget_finished(posting, n):
    """After an MPI_Testsome of the n posted requests that failed (MPI_ERR_IN_STATUS: one of
    those it finished failed): drop those it finished, in error or not, whose handles it has
    freed (and nulled in `testing`), so that the failed run cancels only what MPI still holds
    (a freed handle may be another request's by then); how many are left. posting.finished[0]
    is the slot to blame: the first of those, else the first posted."""
    posting.finished[0] = posting.slots[0]
    kept = 0
    blamed = False
    for i in range(n):
        slot = posting.slots[i]
        if posting.testing[i] != posting.requests[slot]:
            if not blamed:
                posting.finished[0], blamed = slot, True
        else:
            posting.slots[kept] = slot
            kept += 1
    return kept


@njit(cache=True, _nrt=False, nogil=True)
def _post_one(header, tasks, control, kernel_info, args, posting, task_id):
    """A Python worker's transfer: start and post it; MPI's error code."""
    acquire(header)
    window = header[0].window
    start_held(header, tasks, task_id)
    transfer = kernel_info[tasks[task_id & (window - 1)].kernel].transfer
    release(header)
    return _post(control, args, posting, task_id, window, transfer)


@njit(cache=True, _nrt=False, nogil=True)
def _poll(header, tasks, buffers, deps, control, ready, handoff, kernel_info, arg_task, posting, scratch):
    """The executor's poll: `_test_posted`, what it makes ready handed to Python or queued on
    the rings; how many completed, or -1 if MPI failed."""
    return _test_posted(header, tasks, buffers, deps, control, ready, handoff, kernel_info, arg_task,
                        posting, scratch, -1, True)


@njit(cache=True, _nrt=False, inline="always")
def _sleeper_could_take(c, worker):
    """Whether a class has more ready tasks than this loop takes next, and a worker asleep."""
    for other in range(CLASSES):
        if c.sleeping[other] and c.tail[other] - c.head[other] > (other == worker):
            return True
    return False


def budget(window: int, workers: int) -> int:
    """How many tasks each of a class's `workers` native loops runs before it reports (with
    SLICE_NS): BUDGET, less where they would together run more than half the task window."""
    return max(MIN_BUDGET, min(BUDGET, window // (2 * max(1, workers))))


class Instances:
    """A runtime's instance table: instance keys and their entries' addresses (NO_ENTRY: none),
    at most half full so that probes stay short. Kept between its runs: made for each, its
    0.7 MB were paged in again and the process's entries entered again, a sixth of a small
    run's time. What other runtimes of the process learn enters at the next run (`update`)."""

    def __init__(self):
        self.keys = np.zeros((INSTANCES, KEY_WIDTH), np.int64)
        self.addresses = np.zeros(INSTANCES, np.int64)
        self.filled = np.zeros(1, np.int64)
        self._seen = 0  # how many of _LEARNT's entries `update` has looked at
        self._updated = False

    def update(self) -> None:
        """Enter the process's entries learnt since the last call (between runs: no worker reads)."""
        if not self._updated:
            # find is called from Python here only: load its machine code at the first run with
            # native lanes, not in the middle of a later one (5 ms of a process's second run).
            # With a key as below: read-only, a specialisation of its own.
            find(self.keys, self.addresses, np.frombuffer(self.keys[0].tobytes(), np.int64))
            self._updated = True
        if len(_LEARNT) == self._seen:
            return
        learnt = list(_LEARNT.items())  # a copy: another thread's runtime may be learning
        for key, address in learnt[self._seen:]:
            row = np.frombuffer(key, np.int64)
            slot = find(self.keys, self.addresses, row)
            if self.addresses[slot] == 0 and 2 * self.filled[0] < INSTANCES:  # not one this runtime learnt
                self.keys[slot] = row
                self.addresses[slot] = address
                self.filled[0] += 1
        self._seen = len(learnt)


class NativeLanes:
    """The rings, instance table and argument tables native workers share, over one run's
    argument tables (filled by its compiled and Python submits); the executor's handle on them."""

    takes_edges = False  # the lanes of a compiled session (jit/host.py) that follow producers

    def __init__(self, scheduler: Scheduler, args: ArgTables, kernels: list[Kernel], instances: Instances,
                 cores: int):
        self._scheduler = scheduler
        state = scheduler.state
        window = state.sizes.task_window
        self._args = args
        self._kernels = kernels
        self.control = np.zeros(1, CONTROL)
        self.control["failed"] = -1
        self._head, self._tail = self.control["head"][0], self.control["tail"][0]
        self._sleeping = self.control["sleeping"][0]
        self.control["cores"] = cores  # (loops wake a sleeping worker soon only beside a free one)
        self._busy = self.control["busy"]
        self._handoff_counters = (self.control["handoff_head"], self.control["handoff_tail"])
        self._ready = np.zeros((CLASSES, window), np.int64)
        self._handoff = np.zeros(window, np.int64)
        self._taken = np.zeros(window, np.int64)
        self._kernel_info = np.zeros(max(1, len(kernels)), KERNEL_INFO)
        for kernel in kernels:
            if kernel.native is not None and len(kernel.workers) == 1:
                info = self._kernel_info[kernel.id]
                info["native"] = 1
                info["scalars"] = kernel.native.scalars
                info["structural"][list(kernel.native.structural)] = 1
                info["transfer"] = kernel.native.transfer
        self._posting = Posting.allocate(1, 1)  # of the same types: nothing posts before `use_mpi`
        instances.update()
        self._keys, self._addresses, self._filled = instances.keys, instances.addresses, instances.filled
        self._entries: dict = {}  # njit function -> its compiled entry (`_call`)

    def _call(self, function, *args):
        """function(*args) through its compiled entry for these arguments' types (the same at
        every call), without numba's type dispatch: a few µs a call over these many tables,
        which the Python side pays at every return from a loop and Python completion."""
        entry = self._entries.get(function)
        if entry is None:
            entry = self._entries[function] = compiled_entry(function, *args)
        return entry(*args)

    # --- the executor's side -------------------------------------------------------------------
    def admit(self, log: np.ndarray, logged: int) -> int:
        """Take the native tasks out of a flushed log (log[:logged]); how many others are left
        at its front."""
        s = self._scheduler.state
        return _admit(s.header, s.tasks, self.control, self._ready, self._kernel_info, self._args.task, log,
                      logged)

    def queue(self, task_ids: list[int]) -> None:
        """Queue tasks of `kernel_ids` whose arguments a Python submit wrote, ready at submission."""
        log = np.ones((len(task_ids), 2), np.int64)
        log[:, 0] = task_ids
        if self.admit(log, len(task_ids)):  # a task left out would never run: the run would hang
            raise InvariantError(f"tasks {log[:, 0].tolist()} were queued as native without native arguments")

    @property
    def kernel_ids(self) -> frozenset[int]:
        """The kernels whose Python-submitted tasks these lanes run, given their arguments
        (ArgWriter): those whose native code cannot raise (NativeCode.may_raise), and the
        transfers once `use_mpi` has been called."""
        info = self._kernel_info
        mpi = bool(self.control["isend"][0])
        return frozenset(k.id for k in self._kernels[:len(info)] if info[k.id]["native"]
                         and not k.native.may_raise and (mpi or not info[k.id]["transfer"]))

    def use_mpi(self, isend: int, irecv: int, testsome: int, status_bytes: int) -> None:
        """Post the run's transfers through these MPI functions (transport.NativeMpi)."""
        c = self.control[0]
        c["isend"], c["irecv"], c["testsome"] = isend, irecv, testsome
        self._posting = Posting.allocate(len(self._handoff), status_bytes)

    @property
    def posts(self) -> int:
        """Transfers native code has posted, in all."""
        return int(self.control["posts"][0])

    @property
    def posted(self) -> int:
        """Transfers posted and not yet seen complete (read without the lock: a hint)."""
        return int(self.control["posted"][0])

    def post(self, task_id: int) -> int:
        """Start a native transfer on this (Python) thread and post it (`poll` completes it);
        MPI's error code."""
        s = self._scheduler.state
        return self._call(_post_one, s.header, s.tasks, self.control, self._kernel_info, self._args,
                          self._posting, task_id)

    def poll(self, scratch: np.ndarray) -> int:
        """Complete the posted transfers MPI has finished, without the GIL: their native
        consumers queued, the others handed to Python (`handoffs`); how many completed."""
        s = self._scheduler.state
        return self._call(_poll, s.header, s.tasks, s.buffers, s.deps, self.control, self._ready,
                          self._handoff, self._kernel_info, self._args.task, self._posting, scratch)

    def posted_requests(self) -> tuple[list[int], list[int], list]:
        """The MPI requests of the receives, and of the sends, still posted (a stopped run's, its
        workers gone), and the buffers those sends read."""
        slots = self._posting.slots[:self.posted]
        sending = self._kernel_info["transfer"][self._scheduler.state.tasks["kernel"][slots]] == SEND
        requests = self._posting.requests[slots]
        senders = self._args.task[slots[sending]].tolist()
        read = [self._scheduler.task(task_id).params[0].value.buffer for task_id in senders]
        return requests[~sending].tolist(), requests[sending].tolist(), read

    def has_work(self, worker: WorkerType) -> bool:
        """Whether class `worker` has ready native tasks (read without the lock: a hint)."""
        return self._tail[worker] != self._head[worker]

    def any_work(self) -> bool:
        """Whether any class has ready native tasks (a hint, as `has_work`): one test of the
        rings' ends as bytes, ~0.1 µs, where asking each class took 1.4 µs, after every task
        a Python worker runs."""
        return self._tail.tobytes() != self._head.tobytes()

    def busy(self, workers: int) -> None:
        """How many workers take a core now (the executor's count): loops wake a sleeping
        worker soon only while fewer do than the process has cores (SHARE_NS)."""
        self._busy[0] = workers

    def sleeping(self, worker: WorkerType, change: int) -> None:
        """A worker of class `worker` starts (+1) or stops (-1) waiting for a task: native loops
        that make one ready then return, so that the executor wakes it."""
        self._sleeping[worker] += change

    def failed(self) -> int | None:
        """The task whose kernel raised in a native loop (the first), if one did."""
        task_id = int(self.control["failed"][0])
        return None if task_id < 0 else task_id

    def has_handoffs(self) -> bool:
        head, tail = self._handoff_counters
        return head[0] != tail[0]

    def handoffs(self) -> list[int]:
        """The tasks native loops handed to Python since the last call."""
        s = self._scheduler.state
        n = self._call(_take_handoffs, s.header, self.control, self._handoff, self._taken)
        return self._taken[:n].tolist()

    def drain(self, worker: WorkerType, scratch: WorkerScratch, budget: int) -> int:
        """Run ready native tasks of class `worker` on this thread, without the GIL; how many
        completed (their kernels' counts and ns added to scratch.stats), scratch.transfers[0]
        of them transfers."""
        s = self._scheduler.state
        return self._call(_drain, s.header, s.tasks, s.buffers, s.deps, self.control, self._ready,
                          self._handoff, self._kernel_info, self._args, self._keys, self._addresses,
                          self._posting, int(worker), scratch.ready, scratch.key, scratch.stats,
                          scratch.transfers, budget)

    def scratch(self, ready: np.ndarray) -> WorkerScratch:
        """A worker thread's own scratch for `drain` (`ready`: its completion scratch)."""
        stats = np.zeros((len(self._kernel_info), 2), np.int64)
        return WorkerScratch(ready, np.zeros(KEY_WIDTH, np.int64), stats, np.zeros(1, np.int64))

    def tally(self, scratch: WorkerScratch, lane: Lane) -> None:
        """Move a worker's counts of native runs to its profile lane."""
        stats = scratch.stats
        for kernel in np.flatnonzero(stats[:, 0]).tolist():
            k = self._kernels[kernel]
            lane.ran_natively(k.name, k.worker, int(stats[kernel, 0]), stats[kernel, 1] * 1e-9)
        stats[:] = 0

    def complete(self, task_id: int, scratch: np.ndarray) -> int:
        """Complete a task run the Python way: its native consumers made ready are queued here,
        and the native transfers among them posted, the others left in scratch[:n], n
        returned; the TaskError of a transfer MPI could not post."""
        s = self._scheduler.state
        n = self._call(_complete, s.header, s.tasks, s.buffers, s.deps, self.control, self._ready,
                       self._kernel_info, self._args, self._posting, task_id, scratch)
        if n < 0:
            raise self.failure(self.failed())
        return n

    def failure(self, task_id: int) -> TaskError:
        """The error of a task that failed in native code (`failed`)."""
        task = self._scheduler.task(task_id)
        return TaskError.of(task, RuntimeError(
            "MPI failed to post or complete the transfer" if task.kernel.native.transfer else
            "the kernel raised inside a native worker, which cannot pass the exception on (a "
            "numba cfunc); run with executor='serial' to see it"))

    def learn(self, task: Task) -> None:
        """After a native task ran the Python way (which made its instance, the kernel having
        run well): enter the instance's entry, so the rest of its kind run natively. An
        entry that cannot be built is entered as NO_ENTRY, with a warning: its tasks still run,
        the Python way."""
        kernel = task.kernel
        slot = task.id & (len(self._handoff) - 1)
        if kernel.native is None or kernel.id >= len(self._kernel_info) \
                or not self._kernel_info[kernel.id]["native"] or self._args.task[slot] != task.id:
            return  # not native, declared after the lanes were made, or its arguments did not fit
        s = self._scheduler.state
        key = np.zeros(KEY_WIDTH, np.int64)  # this thread's: another may learn at the same time
        if _known(s.header, s.tasks, self._kernel_info, self._args, self._keys, self._addresses, self._filled,
                  task.id, key):
            return
        tensors = [p.value for p in task.params if p.kind != ParamKind.SCALAR]
        scalars = tuple(p.value for p in task.params if p.kind == ParamKind.SCALAR)
        try:
            address = kernel.native.entry(tuple(t.shape for t in tensors), tensors[0].dtype.numpy, scalars)
        except Exception as error:  # the Python way works: say why this one is slow
            warnings.warn(f"{kernel.name}: no native entry for {task.describe_params()}: {error!r}; "
                          "its tasks run on Python workers", RuntimeWarning, stacklevel=2)
            address = None
        address = NO_ENTRY if address is None else address
        _enter(s.header, self._keys, self._addresses, self._filled, key, address)
        _LEARNT[key.tobytes()] = address
