"""The persistent executor's work per task, in nogil numba (executors/persistent.py): a task's
record written into its slot of the scheduler's state and published behind its producers'
tickets, tasks seen done retired in submission order, and a compiled flush's log published
whole, with no Python object per task.

State is plain arrays (`Tables`) that only the orchestrator's thread changes: the run's
counters (RUN), per slot the task in flight there (FLIGHT), per task slot of the core the
ticket its task was published with (TICKET), a backend's learnt instances (LEARNT, by instance
key: instance_keys.py), and the state's task records in mapped memory
(backends/persistent_host.py), which the kernel's blocks read. Each retired task leaves a row
in `retired` (which block ran it, when), which Python drains into the run's profile.

Tickets restart at 0 with each kernel; the core's tasks are known by a sequence number over
the run (`base` + ticket), so a producer published to an earlier kernel is never taken for one
in flight. A task goes back to Python (NEEDS_PYTHON) when its instance is not learnt (its
first task: its code is generated and checked, and may end the running kernel, whose module
lacks it), and waits in Python (NEEDS_WAIT, for
the ticket in `run.wait`) when the producers' words it needs have no room until a producer
finishes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ..backends.launches import task_words
from ..backends.persistent_host import NO_WORK, Shown, look_at, publish_at
from ..core.complete import complete
from ..core.lock import monotonic_ns
from ..jit.context import MAX_SCALARS
from .instance_keys import INSTANCES, KEY_WIDTH, find, tables_key, takes_more

# What a call answers, besides 0: the task needs Python (its instance), a wait (for run.wait),
# the protocol refused it, or its slot holds a task in flight (an invariant broken).
NEEDS_PYTHON, NEEDS_WAIT, REFUSED, SLOT_TAKEN = 1, 2, 3, 4

RUN = np.dtype([
    ("head", np.int64),  # the oldest ticket not retired
    ("next", np.int64),  # the ticket of the next task published
    ("base", np.int64),  # tasks published to the run's earlier kernels: a ticket's sequence is base + it
    ("next_word", np.uint64),  # the next word of the ring of producers' tickets (the protocol's)
    ("ring", np.int64),  # the ring's words; the most producers the last `slots` tickets may name
    ("named", np.int64),  # ... that they name now
    ("launched", np.int64),  # instances in the running kernel's module; -1: no kernel running
    ("wait", np.int64),  # NEEDS_WAIT's ticket
    ("gathered", np.int64),  # the task whose producers' tickets are tickets[:count]; -1: none
    ("count", np.int64),
    ("carried", np.int64),  # edges in `carried`
    ("edge", np.int64),  # the next edge of the flush's edge log to read
    ("rows", np.int64),  # rows in `retired`
    ("native", np.int64),  # tasks published from the argument tables
], align=True)

FLIGHT = np.dtype([  # per slot: the task published there
    ("task", np.int64),
    ("kernel", np.int64),  # its kernel's id
    ("named", np.int64),  # how many producers' tickets it named
    ("first_call", np.int64),  # whether publishing it made its instance's code
], align=True)

TICKET = np.dtype([("task", np.int64), ("sequence", np.int64)], align=True)  # per core task slot

LEARNT = np.dtype([  # per instance table slot
    ("index", np.int64),  # the instance's in the module; NO_WORK: it has no work
    ("pieces", np.int64),  # the pieces a task of it runs as: its stream launch's grid
    ("integer", np.int64, (MAX_SCALARS,)),  # each scalar's word: long long (1) or double
], align=True)

RETIRED = np.dtype([
    ("task", np.int64),
    ("kernel", np.int64),
    ("worker", np.int64),
    ("block", np.int64),  # that ran it
    ("began", np.int64),  # when it took it and had run it, the device's clock (ns)
    ("ended", np.int64),
    ("first_call", np.int64),
    ("seen", np.int64),  # when the host saw it done (monotonic ns: time.perf_counter's clock)
], align=True)


class Learnt(NamedTuple):
    """A backend's learnt instances, by instance key."""

    keys: np.ndarray
    filled: np.ndarray
    entries: np.ndarray  # LEARNT per slot

    @classmethod
    def allocate(cls) -> Learnt:
        return cls(np.zeros((INSTANCES, KEY_WIDTH), np.int64), np.zeros(INSTANCES, np.int64),
                   np.zeros(INSTANCES, LEARNT))


class Tables(NamedTuple):
    """One run's publishing state and what its numba code reads beside it."""

    run: np.ndarray  # RUN, one row
    flights: np.ndarray  # FLIGHT per slot
    ticket_of: np.ndarray  # TICKET per core task slot
    tickets: np.ndarray  # uint64 per slot: the gathered producers' tickets, ascending
    carried: np.ndarray  # (n, 2): edges of a flush whose consumers a later flush brings
    retired: np.ndarray  # RETIRED rows, run.rows of them
    keys: np.ndarray  # the backend's Learnt
    filled: np.ndarray
    learnt: np.ndarray
    kernel_info: np.ndarray  # KERNEL_INFO per kernel id: `native` where its tasks may be published here
    key: np.ndarray  # an instance key
    double: np.ndarray  # one float64, and `bits` its int64 view: a scalar's double word
    bits: np.ndarray
    ready: np.ndarray  # the core's completion scratch
    calls: np.ndarray  # the state's HOST_CALLS
    kernel: np.ndarray  # the state's task records, per slot: the instance's index
    words: np.ndarray  # ... and the argument words (slots, words a task)
    began: np.ndarray  # what the blocks write back
    ended: np.ndarray
    ran_on: np.ndarray


# --- producers -----------------------------------------------------------------------------------
@njit(cache=True, _nrt=False, inline="always")
def _ticket(t, task_id):
    """The ticket of a task published to the running kernel and not retired, or -1."""
    r = t.run[0]
    entry = t.ticket_of[task_id & (len(t.ticket_of) - 1)]
    if entry.task != task_id or entry.sequence < r.base + r.head:
        return -1
    return entry.sequence - r.base


@njit(cache=True, _nrt=False, inline="always")
def _gather(t, producer):
    """Add the producer's ticket, if in flight, to tickets[:count]: ascending, each once."""
    ticket = _ticket(t, producer)
    if ticket < 0:
        return
    r = t.run[0]
    i = r.count
    while i > 0 and t.tickets[i - 1] > ticket:
        i -= 1
    if i > 0 and t.tickets[i - 1] == ticket:
        return
    for j in range(r.count, i, -1):
        t.tickets[j] = t.tickets[j - 1]
    t.tickets[i] = ticket
    r.count += 1


@njit(cache=True, _nrt=False, inline="always")
def _start_gathering(t, task_id):
    r = t.run[0]
    r.gathered = task_id
    r.count = 0


@njit(cache=True, _nrt=False)
def gather(t, task_id, producers):
    """Gather the tickets of a Python submit's producers (task ids)."""
    _start_gathering(t, task_id)
    for i in range(len(producers)):
        _gather(t, producers[i])


@njit(cache=True, _nrt=False, inline="always")
def _gather_edges(t, edges, task_id):
    """Gather a logged task's producers: the edges carried from earlier flushes, then the
    flush's edge log's, which is in consumer order (a consumer's edges come before it, in its
    flush or an earlier one)."""
    _start_gathering(t, task_id)
    r = t.run[0]
    for e in range(r.carried):
        if t.carried[e, 1] == task_id:
            _gather(t, t.carried[e, 0])
    while r.edge < len(edges) and edges[r.edge, 1] <= task_id:
        if edges[r.edge, 1] == task_id:
            _gather(t, edges[r.edge, 0])
        r.edge += 1


# --- publishing and retiring ----------------------------------------------------------------------
@njit(cache=True, _nrt=False, inline="always")
def _drop_done(t):
    """Drop the gathered tickets of producers seen done: they need no word."""
    r = t.run[0]
    c = t.calls[0]
    mask = len(t.flights) - 1
    kept = 0
    for i in range(r.count):
        ticket = np.int64(t.tickets[i])
        if look_at(c.done, c.sched, ticket & mask) != ticket:
            t.tickets[kept] = t.tickets[i]
            kept += 1
    r.count = kept


@njit(cache=True, _nrt=False, inline="always")
def slot_free(t):
    """Whether the next ticket's slot holds no task in flight (the task window keeps it so:
    checked before its record is written)."""
    r = t.run[0]
    return r.head > r.next - len(t.flights)


@njit(cache=True, _nrt=False, inline="always")
def _publish(t, task_id, kernel, index, pieces, words, first_call):
    """Publish the task (of kernel id `kernel`; the module's instance `index`, run as `pieces`;
    its `words` argument words in its slot's record) behind the gathered tickets: 0, NEEDS_WAIT
    (run.wait: the producer whose end makes room for the words they take), REFUSED or
    SLOT_TAKEN."""
    r = t.run[0]
    c = t.calls[0]
    slots = len(t.flights)
    ticket = r.next
    slot = ticket & (slots - 1)
    if not slot_free(t):
        return SLOT_TAKEN
    _drop_done(t)
    # The words the last `slots` tickets name, without those of the slot's last task, which
    # leaves that window; and the ring's words not yet read by the blocks.
    named = r.named - t.flights[slot].named
    unread = np.int64(r.next_word) - look_at(c.shown, c.sched, Shown.WORDS_READ)
    if named + r.count > r.ring or unread + r.count > r.ring:
        r.wait = np.int64(t.tickets[0])
        return NEEDS_WAIT
    t.kernel[slot] = index
    if publish_at(c.publish, c.sched, ticket, t.run.ctypes.data + _NEXT_WORD, t.tickets.ctypes.data, r.count,
                  pieces, 1 + words):  # the instance, then the words
        return REFUSED
    r.named = named + r.count
    flight = t.flights[slot]
    flight.task = task_id
    flight.kernel = kernel
    flight.named = r.count
    flight.first_call = first_call
    entry = t.ticket_of[task_id & (len(t.ticket_of) - 1)]
    entry.task = task_id
    entry.sequence = r.base + ticket
    r.next += 1
    r.gathered = -1
    r.count = 0
    return 0


_NEXT_WORD = RUN.fields["next_word"][1]  # the field's offset: the protocol advances it



@njit(cache=True, _nrt=False)
def publish(t, task_id, kernel, index, pieces, words, first_call):
    """`_publish` from Python: the task's producers gathered, its words written."""
    return _publish(t, task_id, kernel, index, pieces, words, first_call)


@njit(cache=True, _nrt=False, nogil=True)
def retire_done(t, header, tasks, buffers, deps, limit):
    """Retire, oldest first, up to `limit` tasks seen done, up to the first that is not or
    until `retired` is full, each leaving its row there; how many retired."""
    r = t.run[0]
    c = t.calls[0]
    mask = len(t.flights) - 1
    window = len(t.ticket_of)
    retired = 0
    while r.head < r.next and r.rows < len(t.retired) and retired < limit:
        slot = r.head & mask
        if look_at(c.done, c.sched, slot) != r.head:
            break
        flight = t.flights[slot]
        row = t.retired[r.rows]
        row.task = flight.task
        row.kernel = flight.kernel
        row.worker = tasks[flight.task & (window - 1)].worker
        row.block = t.ran_on[slot]
        row.began = t.began[slot]
        row.ended = t.ended[slot]
        row.first_call = flight.first_call
        row.seen = monotonic_ns()
        r.rows += 1
        r.head += 1
        complete(header, tasks, buffers, deps, flight.task, t.ready)
        retired += 1
    return retired


# --- tasks whose arguments are in the tables ------------------------------------------------------
@njit(cache=True, _nrt=False, inline="always")
def _from_tables(t, tasks, args, task_id):
    """Publish a task whose arguments are in the run's tables, its producers gathered, by its
    learnt instance; NEEDS_PYTHON where there is none to take (not learnt; not in the running
    kernel's module), else what `_publish` answers."""
    r = t.run[0]
    window = len(t.ticket_of)
    slot = task_id & (window - 1)
    if not tables_key(tasks, t.kernel_info, args, window, task_id, t.key):
        return NEEDS_PYTHON
    found = find(t.keys, t.filled, t.key)
    if t.filled[found] == 0:
        return NEEDS_PYTHON
    entry = t.learnt[found]
    if not slot_free(t):
        return SLOT_TAKEN
    words = 0
    if entry.index != NO_WORK:
        if 0 <= r.launched <= entry.index:
            return NEEDS_PYTHON
        record_words = t.words[r.next & (len(t.flights) - 1)]
        words = task_words(record_words, args, slot, entry.integer, t.double, t.bits)
    return _publish(t, task_id, tasks[slot].kernel, entry.index, entry.pieces, words, 0)


@njit(cache=True, _nrt=False, nogil=True)
def publish_logged(t, header, tasks, buffers, deps, args, log, first, logged, edges):
    """Publish the logged tasks log[first:logged] in order, behind their producers in the
    carried edges and `edges` (the flush's edge log), retiring what is done on the way, until
    one answers other than 0 (its producers stay gathered): the index of the first not
    published and what it answered (logged and 0 once all are)."""
    r = t.run[0]
    i = first
    while i < logged:
        task_id = log[i, 0]
        if r.gathered != task_id:
            _gather_edges(t, edges, task_id)
        status = _from_tables(t, tasks, args, task_id)
        if status != 0:
            return i, status
        r.native += 1
        retire_done(t, header, tasks, buffers, deps, len(t.retired))
        i += 1
    return logged, 0


@njit(cache=True, _nrt=False)
def submit_python(t, header, tasks, buffers, deps, args, task_id, producers):
    """Publish a Python submit whose arguments are in the tables, behind `producers`, and
    retire what is done; what `_from_tables` answers (its producers stay gathered)."""
    gather(t, task_id, producers)
    status = _from_tables(t, tasks, args, task_id)
    if status == 0:
        r = t.run[0]
        r.native += 1
        retire_done(t, header, tasks, buffers, deps, len(t.retired))
    return status


@njit(cache=True, _nrt=False)
def learn(t, tasks, args, task_id, index, pieces, integer):
    """Enter the instance of a task whose arguments are in the tables (its index in the module,
    pieces and scalars' word types), for its instance's later tasks."""
    if not tables_key(tasks, t.kernel_info, args, len(t.ticket_of), task_id, t.key):
        return
    found = find(t.keys, t.filled, t.key)
    if t.filled[found] != 0 or not takes_more(t.filled):
        return
    for i in range(len(t.key)):
        t.keys[found, i] = t.key[i]
    entry = t.learnt[found]
    entry.index = index
    entry.pieces = pieces
    for k in range(MAX_SCALARS):
        entry.integer[k] = integer[k]
    t.filled[found] = 1
