"""Moving a region's elements between ranks, and telling every rank when one has failed.

`Transport` is what the transfer tasks (placement.py) call; `MpiTransport` implements it
over mpi4py: host memory directly, GPU memory staged through the host. nccl.py sends GPU
memory GPU to GPU and uses this class for everything else.

A message's tag is its place in the sequence of transfers between its two ranks (placement.py
counts them at submission, on both ranks alike), so transfers may be posted in any order.
A send packs (copies) the elements and returns, so it never waits for its receiver; MPI
moves the copy while this rank is inside any MPI call. A receive is posted (`receive`) and
returns; `arrived` tests the posted ones, and raises PeerFailed once a rank, this one
included, has said it failed; `deliver` unpacks one that has come. Nothing here waits for a
message but the end of a run (for its sends): the executor polls (inbox.py).
Where the MPI library has MPICH's ABI (`NativeMpi`), native code posts a transfer itself
(executors/native.py, mpi_abi.py): a send or a receive of a region without a mask, of one
MPI datatype that picks the region's elements in place (`datatype`), no copy, which
completes when MPI says so (so, unlike the sends here, such a send holds its region until
then). Each run works on its
own duplicate of the communicator, so a failed run's unmatched messages cannot reach a later
run (a failed run's duplicate is kept, never freed, for that).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import NamedTuple, Protocol

import numpy as np

from ..errors import RankError
from ..polling import pause

NOTICE, FIRST_DATA = 1, 2  # tags: a failure notice; data tags count from FIRST_DATA


class PeerFailed(RankError):
    """A wait gave up because a rank (this one or another) failed: the run's real error is that one."""


class Posted(NamedTuple):
    """A receive posted and not yet known to have arrived."""

    request: object  # the transport's handle
    data: object  # where the packed elements arrive
    view: object  # where they go
    mask: np.ndarray | None
    source: int


class NativeMpi(NamedTuple):
    """What native workers need to post transfers themselves (mpi_abi.py): the addresses of
    MPI_Isend, MPI_Irecv and MPI_Testsome, and the bytes of an MPI_Status."""

    isend: int
    irecv: int
    testsome: int
    status_bytes: int


class Transport(Protocol):
    rank: int
    size: int
    # Whether its transfers must be issued in their sequence order (NCCL: no tags); placement
    # then chains each rank's sends and receives, and `receive` may wait for its message.
    ordered: bool
    # Where native workers may post its transfers (the module docstring), else None.
    native: NativeMpi | None
    # The message tags of transfers between two ranks: (first, count); the `sequence`th one's
    # is `tag(tags, sequence)`, in compiled placement too (jit/api.py).
    tags: tuple[int, int]

    def begin(self, name: str) -> None:
        """A run of orchestration `name` starts (every rank calls it: a collective)."""

    def send(self, view, mask: np.ndarray | None, dest: int, sequence: int) -> None:
        """Send view[mask] (all of view when mask is None) to rank `dest`, the `sequence`th
        transfer from this rank to it; returns at once."""

    def receive(self, view, mask: np.ndarray | None, source: int, sequence: int) -> Posted:
        """Post the receive of view[mask] from rank `source`, the `sequence`th transfer from it
        to this rank."""

    def arrived(self, posted: list[Posted]) -> list[int]:
        """The indices in `posted` of the receives whose elements have come; PeerFailed once a
        rank has failed (the run then gives up what it left posted)."""

    def deliver(self, posted: Posted) -> None:
        """Unpack the elements of a receive that has come into its view."""

    def give_up(self, posted: list[Posted]) -> None:
        """Receives a failed run leaves posted: their buffers are kept with the run's
        communicator, which is never freed, since a message already matched may still fill
        them (a cancel does not stop it)."""

    def barrier(self) -> None:
        """Return once every rank has called it (between runs)."""

    def datatype(self, tensor) -> int | None:
        """The handle of an MPI datatype that picks a region's elements in place, in C order
        (a packed message's), for native workers; None where there is none."""

    def comm_handle(self) -> int:
        """The handle of this run's communicator, for native workers."""

    def cancel(self, receives: list[int], sends: list[int], read: list) -> None:
        """The requests of transfers native workers posted that a failed run leaves. Receives
        are cancelled and waited for (which MPI makes local), so that no late message lands in
        memory a later run reuses; sends are let go (MPI_Request_free): MPICH cannot cancel a
        send, and one whose receiver never posts would never complete. One already matched may
        still read its region: `read`, the buffers they read, is kept with the failed run's
        communicator, as Python sends' copies are."""

    def fail(self) -> None:
        """This rank's run has failed: tell every other rank now, so none waits for it."""

    def conclude(self, failure: tuple | None) -> list[tuple[int, tuple]]:
        """The run ends (a collective): wait until this rank's sends are delivered, then
        exchange failures; every rank's (rank, failure) that is not None."""


def on_device(view) -> bool:
    return hasattr(view, "__cuda_array_interface__")


def pack(view, mask: np.ndarray | None) -> np.ndarray:
    """A host copy of view[mask] as bytes, in the mask's (C) order."""
    if on_device(view):
        import cupy

        chosen = view if mask is None else view[cupy.asarray(mask)]
        host = cupy.ascontiguousarray(chosen).get()
    else:
        host = np.array(view, order="C") if mask is None else view[mask]  # both copy
    return host.reshape(-1).view(np.uint8)


def unpack(data: np.ndarray, view, mask: np.ndarray | None) -> None:
    """Write bytes made by `pack` into view[mask]; landed when this returns."""
    values = data.view(view.dtype)
    if not on_device(view):
        _write(view, mask, values)
        return
    import cupy

    # On the view's GPU (the worker that polls may never have run a GPU task, and CuPy's current
    # device is then GPU 0), written on this thread's CuPy stream there (the legacy default
    # stream), which the backend's streams, non-blocking, do not wait for: the receive
    # completes, and its consumers are launched, as this returns.
    with view.device:
        _write(view, None if mask is None else cupy.asarray(mask), cupy.asarray(values))
        cupy.cuda.get_current_stream().synchronize()


def _write(view, mask, values) -> None:
    if mask is None:
        view[...] = values.reshape(view.shape)
    else:
        view[mask] = values


MAX_DATATYPES = 1024  # element datatypes a transport keeps; a region of another layout goes the Python way


def _int32(handle: int) -> int:
    """An MPICH handle as the int it is in C (mpi4py gives its bits as an unsigned number)."""
    return int(np.array([handle & 0xFFFFFFFF], np.uint32).view(np.int32)[0])


def _native_mpi(MPI) -> NativeMpi | None:
    """MPI's function addresses, where its handles are MPICH's 32-bit ints; else None."""
    if any(MPI._sizeof(kind) != 4 for kind in (MPI.Comm, MPI.Datatype, MPI.Request)):
        return None
    try:
        library = ctypes.CDLL(MPI.__file__)  # its symbols resolve through the MPI library it loaded
        isend, irecv, testsome = (ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                                  for name in ("MPI_Isend", "MPI_Irecv", "MPI_Testsome"))
    except (OSError, AttributeError):
        return None
    return NativeMpi(isend, irecv, testsome, MPI._sizeof(MPI.Status))


def _elements_datatype(MPI, repeats: tuple[int, ...], strides: tuple[int, ...], itemsize: int):
    """A committed datatype of a region's elements (strides in elements), in C order: the
    trailing dims that are one contiguous block, then each dim before them a vector of that."""
    block, d = itemsize, len(repeats) - 1
    while d >= 0 and (repeats[d] == 1 or strides[d] * itemsize == block):
        block *= repeats[d]
        d -= 1
    parts = [MPI.BYTE.Create_contiguous(block)]
    for k in reversed(range(d + 1)):
        parts.append(parts[-1].Create_hvector(repeats[k], 1, strides[k] * itemsize))
    made = parts.pop().Commit()
    for part in parts:  # a derived type keeps what it needs of those it was made from
        part.Free()
    return made


def tag(tags: tuple[int, int], sequence: int) -> int:
    """The message tag of the `sequence`th transfer between two ranks (Transport.tags)."""
    first, count = tags
    return first + sequence % count


def packed_bytes(view, mask: np.ndarray | None) -> int:
    count = view.size if mask is None else int(np.count_nonzero(mask))
    return count * view.dtype.itemsize


class MpiTransport:
    """Transport over an mpi4py communicator; see the module docstring."""

    ordered = False

    def __init__(self, comm):
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RankError("MPI was initialised without MPI_THREAD_MULTIPLE, which pto-gpu's worker threads "
                            "need; let mpi4py initialise MPI (its default asks for it)")
        self._MPI = MPI
        self._base = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        # Tags wrap after MPI's bound (at least 32767; MPICH's is 2**29): only messages that
        # many transfers apart could be confused, and a rank's receives in flight at once are
        # fewer than its task window.
        self.tags = (FIRST_DATA, comm.Get_attr(MPI.TAG_UB) - FIRST_DATA)
        self._comm = None
        self._notice = None  # the receive of a failure notice, any rank's (this one's too)
        self._heard = np.zeros(1, np.int32)  # who failed, once _notice completes
        self._someone_failed = False  # _notice has completed
        self._notices: list = []  # requests of this rank's failure notices
        self._sends: list = []  # (request, packed copy) of sends not known to be delivered
        self._sends_lock = threading.Lock()
        self._prune_at = 64  # undelivered sends at which delivered ones are let go
        # What a failure stopped and MPI may still fill or read: receives (request, buffer), and
        # native sends let go (requests, the buffers they read).
        self._given_up: list = []
        # Failed runs' communicators, never freed, with the buffers their unfinished messages
        # may still read or write. MPICH has ~2,000 communicator ids: as many failed runs.
        self._abandoned: list = []
        self.native = _native_mpi(MPI)
        self._datatypes: dict[tuple, object] = {}  # by (repeats, strides, itemsize): committed

    def begin(self, name: str) -> None:
        self._comm = self._base.Dup()
        names = self._comm.allgather(name)
        self._notices, self._sends, self._given_up, self._someone_failed = [], [], [], False
        self._notice = self._comm.Irecv(self._heard, source=self._MPI.ANY_SOURCE, tag=NOTICE)
        if len(set(names)) > 1:
            raise RankError(f"the ranks run different orchestrations: {names} (by rank); every rank "
                            "must run the same one")

    def barrier(self) -> None:
        self._base.Barrier()

    def send(self, view, mask: np.ndarray | None, dest: int, sequence: int) -> None:
        data = pack(view, mask)
        request = self._comm.Isend(data, dest=dest, tag=tag(self.tags, sequence))
        with self._sends_lock:  # sends run on any worker, side by side
            # The copy must live until MPI has sent it: it is kept with its request.
            self._sends.append((request, data))
            if len(self._sends) > self._prune_at:  # let delivered sends' copies go, now and then
                self._sends = [(r, d) for r, d in self._sends if not r.Test()]
                self._prune_at = 2 * len(self._sends) + 64

    def receive(self, view, mask: np.ndarray | None, source: int, sequence: int) -> Posted:
        data = np.empty(packed_bytes(view, mask), np.uint8)
        request = self._comm.Irecv(data, source=source, tag=tag(self.tags, sequence))
        return Posted(request, data, view, mask, source)

    def arrived(self, posted: list[Posted]) -> list[int]:
        requests = [p.request for p in posted]
        requests.append(self._notice)
        done = self._MPI.Request.Testsome(requests) or []
        if len(posted) in done or self._someone_failed:
            raise self._failed(f"data from rank {posted[0].source}" if posted else "data")
        return done

    def deliver(self, posted: Posted) -> None:
        unpack(posted.data, posted.view, posted.mask)

    def give_up(self, posted: list[Posted]) -> None:
        self._given_up += [(p.request, p.data) for p in posted]

    def datatype(self, tensor) -> int | None:
        key = (tensor.repeats, tensor.strides, tensor.dtype.itemsize)
        made = self._datatypes.get(key)
        if made is None:
            if len(self._datatypes) >= MAX_DATATYPES:
                return None
            made = self._datatypes[key] = _elements_datatype(self._MPI, *key)
        return _int32(made.handle)

    def comm_handle(self) -> int:
        return _int32(self._comm.handle)

    def cancel(self, receives: list[int], sends: list[int], read: list) -> None:
        self._given_up.append((sends, read))  # kept (conclude: _abandoned), never looked at
        for handles, cancel in ((receives, True), (sends, False)):
            for handle in handles:
                request = self._MPI.Request.fromhandle(handle % (1 << 64))  # mpi4py's form: sign-extended
                try:
                    if cancel:
                        request.Cancel()
                        request.Wait()
                    else:
                        request.Free()
                except self._MPI.Exception:  # (MPI failed the run already): the run's own error stands
                    pass

    def wait(self, request, what: str) -> None:
        """Wait for `request` or a failure notice, whichever comes first; PeerFailed on a
        notice. Only the end of a run waits (for its sends to be delivered), its tasks all
        done. It polls, yielding the core, then sleeping between polls (polling.pause): MPI's
        own wait spins on the core without yielding it, which other ranks may need."""
        requests = [request, self._notice]
        started = time.perf_counter()
        while not self._someone_failed:
            index, done = self._MPI.Request.Testany(requests)
            if done:
                if index == 0:
                    return
                break
            pause(time.perf_counter() - started)
        request.Cancel()
        request.Free()
        raise self._failed(what)

    def _failed(self, what: str) -> PeerFailed:
        self._someone_failed = True
        who = "this rank" if int(self._heard[0]) == self.rank else f"rank {int(self._heard[0])}"
        return PeerFailed(f"stopped waiting for {what}: {who} failed")

    def fail(self) -> None:
        if self._notices or self._comm is None:
            return
        # To itself too: a wait of its own, on a worker thread, stops on that notice.
        me = np.array([self.rank], np.int32)
        self._notices = [self._comm.Isend(me, dest=other, tag=NOTICE) for other in range(self.size)]

    def conclude(self, failure: tuple | None) -> list[tuple[int, tuple]]:
        if failure is None:
            try:
                for request, _ in self._sends:
                    self.wait(request, "a send to be delivered")
            except PeerFailed as error:
                failure = ("secondary", str(error))
        failures = [(rank, f) for rank, f in enumerate(self._comm.allgather(failure)) if f is not None]
        for request in [r for r, _ in self._sends] + self._notices:
            if not request.Test():
                request.Free()
        if not self._someone_failed and not self._notice.Test():
            self._notice.Cancel()
            self._notice.Wait()
        self._notice, self._notices = None, []
        self._prune_at = 64
        if failures:
            # Its unmatched messages stay in it; freed, its context id could be reused by a
            # later run's communicator, and they would reach that run.
            self._abandoned.append((self._comm, self._sends, self._given_up))
        else:
            self._comm.Free()
        self._comm = None
        return failures
