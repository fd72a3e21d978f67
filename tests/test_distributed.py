"""The distributed run's bookkeeping without MPI: distributions, which rank must receive what
(holdings), which every rank works out alike, and the inbox of posted receives (over a
loopback transport). tests/test_mpi.py runs it on ranks."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys
import threading
import time
import types

import numba
import numpy as np
import pytest
from pto_gpu.kernels.elementwise import scale
from pto_gpu.kernels.tiles import matmul_panels_add

import pto_gpu as pto
from pto_gpu import jit as pj
from pto_gpu.distributed import holdings as holdings_module
from pto_gpu.distributed import transport as transport_module
from pto_gpu.distributed.holdings import Holdings
from pto_gpu.distributed.inbox import Inbox
from pto_gpu.distributed.ownership import element_owners
from pto_gpu.distributed.placement import Placement
from pto_gpu.distributed.transport import Posted, packed_bytes, unpack
from pto_gpu.jit.placing import UNITS_FIRST, UNITS_RUN, fetch_whole
from pto_gpu.polling import TIMER_SLACK_NS, precise_sleeps
from pto_gpu.tasks import Task
from pto_gpu.tensor import Buffer, BufferKind, TensorDescriptor
from pto_gpu.trace import merge, rank_path


def test_distributions_deal_rows_to_ranks():
    assert pto.block_rows(2).row_owners(5).tolist() == [0, 0, 0, 1, 1]
    assert pto.block_rows(4).row_owners(8).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert pto.block_cyclic(2, 3).row_owners(8).tolist() == [0, 0, 1, 1, 2, 2, 0, 0]


def test_a_2d_distribution_deals_blocks_over_a_grid_of_ranks():
    owners = pto.block_cyclic_2d(2, 3, grid=(2, 2)).owners((5, 7))
    assert owners.tolist() == [[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0], [2, 2, 2, 3, 3, 3, 2],
                               [2, 2, 2, 3, 3, 3, 2], [0, 0, 0, 1, 1, 1, 0]]
    column = pto.block_cyclic_2d(4, 4, grid=(3, 1)).owners((12, 2))[:, 0]
    assert column.tolist() == [0] * 4 + [1] * 4 + [2] * 4


@pytest.mark.parametrize("make, message", [
    (lambda: pto.block_cyclic_2d(2, 2, grid=(2,)), r"grid=\(2,\) must be \(P, Q\)"),
    (lambda: pto.block_cyclic_2d(0, 2, grid=(1, 2)), r"pto.block_cyclic_2d: rows=0 must be a positive int"),
    (lambda: element_owners(pto.block_cyclic_2d(2, 2, grid=(2, 2)), (4, 4), 2, "a"),
     r"a: owner=.* spreads over 4 ranks but the run has 2"),
    (lambda: element_owners(pto.block_cyclic_2d(2, 2, grid=(1, 2)), (4, 4, 4), 2, "a"),
     r"deals a matrix's blocks; this tensor is 3-d"),
    (lambda: pto.DistArray((4, 4), np.float32, pto.block_cyclic_2d(2, 2, grid=(1, 1)), OneRankOf(0, 1)),
     r"deals a matrix's blocks, not its rows"),
])
def test_a_2d_distribution_refuses_what_it_cannot_deal(make, message):
    with pytest.raises(pto.RankError, match=message):
        make()


def matrix(rows: int, cols: int) -> TensorDescriptor:
    buffer = Buffer(-1, BufferKind.EXTERNAL, 0, rows * cols * 4)
    return TensorDescriptor(buffer, 0, 0, (cols, 1), (rows, cols), pto.FLOAT32)


def test_each_version_reaches_each_rank_once_from_its_writer():
    t = matrix(4, 4)
    holdings = Holdings(np.repeat(np.array([0, 0, 1, 1], np.int8), 4), 16, pto.FLOAT32, 2)
    assert holdings.fetch(t[0:2], 1) == [(0, None)]  # rows 0-1 are rank 0's
    assert holdings.fetch(t[0:2], 1) == []  # rank 1 holds them now
    assert holdings.fetch(t[2:4], 1) == []  # its own
    holdings.wrote(t[:, 0:1], 0)  # a new version of column 0, on rank 0 only
    [(source, mask)] = holdings.fetch(t, 1)
    assert source == 0 and mask.tolist() == [[True, False, False, False]] * 4
    [(source, mask)] = holdings.fetch(t, 0)  # rows 2-3 but their column 0, from rank 1
    assert source == 1 and mask.tolist() == [[False] * 4] * 2 + [[False, True, True, True]] * 2
    # Rank 1 owns rows 2-3 and fetched their column 0: no owner lacks its newest version.
    assert holdings.stale_at_owner() == []
    holdings.wrote(t[3:4, 1:3], 0)
    [(writer, owner, flat)] = holdings.stale_at_owner()
    assert (writer, owner) == (0, 1) and np.flatnonzero(flat).tolist() == [13, 14]


def test_a_read_spanning_writers_is_one_transfer_per_writer():
    t = matrix(3, 2)
    holdings = Holdings(np.array([0, 0, 1, 1, 2, 2], np.int8), 6, pto.FLOAT32, 3)
    needed = holdings.fetch(t[:, 0:1], 2)  # column 0: rows of ranks 0 and 1, and its own
    assert [(source, mask.ravel().tolist()) for source, mask in needed] == [(0, [True, False, False]),
                                                                            (1, [False, True, False])]


def test_a_copy_of_holdings_starts_where_they_started_whatever_the_first_did():
    """A run's Holdings are copies of those an array's first run made (Placement._track): what
    one copy is told (writes, reads that split its units) changes neither the original nor
    another copy."""
    t = matrix(4, 4)
    made = Holdings(np.repeat(np.array([0, 0, 1, 1], np.int8), 4), 16, pto.FLOAT32, 2)
    first = made.copy()
    first.wrote(t[:, 0:1], 1)  # splits the row units into elements
    [(source, mask)] = first.fetch(t[0:2], 0)  # rank 0 lacks its rows' new column 0
    assert source == 1 and mask.tolist() == [[True, False, False, False]] * 2
    second = made.copy()
    assert made.unit == second.unit == 8 and first.unit == 1  # two units of two rows each
    assert made.writer.tolist() == second.writer.tolist() == [0, 1]
    assert second.fetch(t[0:2], 1) == [(0, None)] and second.fetch(t[2:4], 1) == []
    assert made.fetch(t[0:2], 1) == [(0, None)]  # the original was not told of second's fetch


def test_an_owner_table_kept_from_an_earlier_run_serves_only_its_own_shape_and_owner():
    """A Runtime keeps each array's owner table for its later runs (Placement._track); a later
    run's array of another shape (whose layout key is the same: (4, 2) and (2, 4) are both 8
    contiguous floats), or an owner equal to the kept one but not an owner (True == 1), gets
    its own, as a first run would."""
    placement = Placement(types.SimpleNamespace(rank=0, size=2, ordered=False, native=None))
    tall, wide = matrix(4, 2), matrix(2, 4)
    assert tall.layout_key == wide.layout_key
    rows = pto.block_cyclic(1, 2)
    placement.external(tall, rows)
    assert placement.owner_of(tall[1]) == 1
    placement.start(None, record=False)  # the next run: the same buffer key, another shape
    placement.external(wide, rows)
    assert placement.owner_of(wide[0]) == 0 and placement.owner_of(wide[1]) == 1
    assert placement._holding(wide).owners_of(wide).tolist() == [[0] * 4, [1] * 4]
    placement.start(None, record=False)
    placement.external(tall, np.int64(1))
    assert placement.owner_of(tall[0]) == 1
    placement.start(None, record=False)
    with pytest.raises(pto.RankError, match="neither a rank"):
        placement.external(tall, True)


@pytest.mark.parametrize("precision", ["exact", "tf32"])
def test_the_transfers_run_their_host_function_on_cuda_whatever_the_precision(monkeypatch, precision):
    """The transfers' only CUDA implementation is their host function (CudaCode.library_only):
    a CUDA backend that runs libraries runs it in a TF32 run too, where a family's CuPy
    library gives way to its generated TF32 code (CudaBackend.runs_library); launched as
    their code of no work items instead, no send would go and no receive be posted."""
    placement = Placement(types.SimpleNamespace(rank=0, size=2, ordered=False, native=None))
    backend = pto.Runtime(backend="cuda-emulated", precision=precision).backend
    monkeypatch.setattr(backend.device, "runs_libraries", True)  # as on a GPU (CupyDevice)
    transfers = (placement.send_kernel, placement.recv_kernel, placement.native_send, placement.native_recv)
    for transfer in transfers:
        assert backend.runs_library(transfer), transfer.name
    assert backend.runs_library(matmul_panels_add) == (precision == "exact")


def test_a_buffer_one_rank_owns_is_that_ranks_whatever_came_first():
    """Buffers one rank owns copy tables kept by rank, elements and dtype: an empty view given
    to rank 1 first (whose owners broadcast to nothing) leaves the whole array given to rank 1
    in the next run rank 1's; and many such buffers do not push out a distributed array's
    table kept for later runs."""
    placement = Placement(types.SimpleNamespace(rank=0, size=2, ordered=False, native=None))
    t = matrix(4, 4)
    placement.external(t[0:0], 1)
    placement.start(None, record=False)
    placement.external(t, 1)
    assert placement.owner_of(t) == 1 and placement._holding(t).owners_of(t).tolist() == [[1] * 4] * 4
    placement.start(None, record=False)
    placement.external(matrix(4, 4), pto.block_cyclic(1, 2))
    for size in range(1, 40):
        placement.alloc(TensorDescriptor(Buffer(size, BufferKind.HEAP, 0, 4 * size), 0, 0, (1,), (size,),
                                         pto.FLOAT32), size % 2)
    assert len(placement._owner_tables) == 1


def test_tables_are_as_coarse_as_the_regions_seen_allow():
    t = matrix(2, 8)
    holdings = Holdings(1, 16, pto.FLOAT32, 2)
    assert holdings.owner_of(t[1]) == 1
    holdings.wrote(t, 1)
    assert holdings.fetch(t, 0) == [(1, None)] and holdings.fetch(t, 0) == []
    assert holdings.unit == 16  # whole-buffer reads and writes: one entry
    holdings.wrote(t[0], 0)
    assert holdings.unit == 8 and holdings.writer.tolist() == [0, 1]
    [(source, mask)] = holdings.fetch(t, 1)
    assert source == 0 and mask.tolist() == [[True] * 8, [False] * 8]
    holdings.fetch(t[:, 2:6], 0)  # cuts rows into 4-element units: 2 | 4 | 2 elements
    assert holdings.unit == 2 and holdings.writer.tolist() == [0] * 4 + [1] * 4
    tiled = Holdings(np.array([0, 0, 1, 1], np.int8), 64, pto.FLOAT32, 2)  # 4 rows of 16, 2 ranks
    assert tiled.unit == 32 and tiled.owner.tolist() == [0, 1]
    wide = Holdings(np.array([0, 0, 1, 1], np.int8), 48, pto.FLOAT32, 2)  # 4 rows of 12: units of 24
    assert wide.fetch(matrix(4, 12)[0:2, 0:8], 1) == [(0, None)]
    assert wide.unit == 4  # 8 columns, but a row starts every 12 elements


def test_a_rewrite_by_the_same_rank_leaves_other_ranks_copies_stale():
    """An accumulator: written by rank 0 again and again. A rewrite straight after a write
    changes nothing (Holdings skips it); after rank 1 read the region, it makes rank 1's copy
    stale again, also when compiled placement made that read on the tables (and said so:
    `forget`)."""
    t = matrix(4, 4)
    holdings = Holdings(0, 16, pto.FLOAT32, 2)
    holdings.wrote(t, 0)
    holdings.wrote(t, 0)
    assert holdings.fetch(t, 1) == [(0, None)] and holdings.fetch(t, 1) == []
    holdings.wrote(t, 0)
    assert holdings.fetch(t, 1) == [(0, None)]
    holdings.wrote(t[0:2], 1)  # another region: rank 0 no longer holds rows 0-1
    holdings.wrote(t, 0)
    assert holdings.writer.tolist() == [0, 0] and holdings.fetch(t, 1) == [(0, None)]
    holdings.wrote(t, 0)
    region = holdings._geometry(t.layout_key, t)
    assert fetch_whole(region, holdings.writer, holdings.valid, np.uint64(1 << 1)) == 0  # rank 1 reads
    holdings.forget()
    holdings.wrote(t, 0)
    assert holdings.fetch(t, 1) == [(0, None)]


def test_a_regions_units_are_worked_out_once_for_every_buffer_of_its_layout_and_unit():
    """Holdings remember a region's place in units by its layout and their unit, not by buffer
    (every run's tiles, each run's fresh accumulators): the same region of another buffer
    whose tables have the same unit takes it as it is; of tables split finer, its own, with
    which reads and writes move what they should."""
    t, other = matrix(4, 4), TensorDescriptor(Buffer(-2, BufferKind.EXTERNAL, 0, 64), 0, 0, (4, 1), (4, 4),
                                              pto.FLOAT32)
    owners = np.repeat(np.array([0, 0, 1, 1], np.int8), 4)
    coarse, same, fine = (Holdings(owners, 16, pto.FLOAT32, 2) for _ in range(3))
    fine.wrote(t[:, 0:1], 1)  # split into elements
    made = coarse._geometry(t[2:4].layout_key, t[2:4])
    assert same._geometry(other[2:4].layout_key, other[2:4]) is made
    split = fine._geometry(t[2:4].layout_key, t[2:4])
    assert split is not made and (made[UNITS_FIRST], made[UNITS_RUN]) == (1, 1)
    assert (split[UNITS_FIRST], split[UNITS_RUN]) == (8, 8)
    assert same.fetch(other[2:4], 0) == [(1, None)] and same.fetch(other[2:4], 0) == []
    assert fine.fetch(t[2:4], 0) == [(1, None)] and fine.fetch(t[2:4], 0) == []
    fine.wrote(t[2:4], 0)
    assert fine.writer.tolist() == [1, 0, 0, 0] * 2 + [0] * 8  # column 0 of rows 0-1 is still rank 1's


def test_a_transposed_region_gets_a_mask_in_its_own_order():
    """A region and its transpose have one layout key: the mask of what rank 1 lacks of the
    transpose (rows 0-1 of the matrix: its columns 0-1) is the transpose's, though the
    tables were seen through the original first."""
    t = matrix(4, 4)
    holdings = Holdings(np.array([0, 0, 1, 1], np.int8), 16, pto.FLOAT32, 2)
    holdings.owners_of(t[:, 0:1])  # tables split to elements
    holdings.owners_of(t)
    [(source, mask)] = holdings.fetch(t.transpose(1, 0), 1)
    assert source == 0 and mask.tolist() == [[True, True, False, False]] * 4


def random_region(rng, rows: int, cols: int, granule: int) -> tuple:
    """Rows and columns of a random window whose columns start and end on multiples of
    `granule` (so that tables stay coarse for a while), strided when the granule is 1."""
    r0, c0 = rng.integers(0, rows), rng.integers(0, cols // granule) * granule
    r1, c1 = rng.integers(r0 + 1, rows + 1), rng.integers(c0 // granule + 1, cols // granule + 1) * granule
    column_step = 1 if granule > 1 else int(rng.choice([1, 2]))
    return slice(r0, r1, int(rng.integers(1, 3))), slice(c0, c1, column_step)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("path", ["swept", "views"])
def test_holdings_agree_with_a_table_per_element(seed, path, monkeypatch):
    """Random reads and writes by random ranks of windows, half of them from a pool of four (tiles
    read again, by this rank or another, and an accumulator's rewrites, which Holdings may
    skip), a quarter transposed, some reads made behind Holdings' back as compiled placement
    makes them (the tables changed, then `forget`): the transfers and the write-back equal
    those of a model that keeps one owner, writer and set of holders per element (written
    here, sharing nothing with holdings.py), and every remembered AND of a region's valid bits
    names only ranks that hold all of it. Through compiled placement's sweeps where they
    apply, and through the views alone (the path of regions of more dims than the sweeps
    take)."""
    if path == "views":
        monkeypatch.setattr(holdings_module, "SWEPT_DIMS", -1)
        monkeypatch.setattr(holdings_module, "_GEOMETRIES", {})  # (none the sweeps' tests made)
    rng = np.random.default_rng(seed)
    rows, cols, size = int(rng.integers(1, 9)), int(rng.choice([4, 8, 12])), int(rng.integers(1, 5))
    granule = int(rng.choice([1, 2, 4]))
    row_owner = np.sort(rng.integers(0, size, rows)).astype(np.int8)
    t = matrix(rows, cols)
    holdings = Holdings(row_owner, rows * cols, pto.FLOAT32, size)
    owner = np.repeat(row_owner, cols).reshape(rows, cols)
    writer = owner.copy()
    holders = [[{int(owner[r, c])} for c in range(cols)] for r in range(rows)]
    pool = [random_region(rng, rows, cols, granule) for _ in range(4)]
    cells_of: dict[tuple, list] = {}  # layout key -> the cells of the region
    for _ in range(40):
        rs, cs = pool[int(rng.integers(4))] if rng.random() < 0.5 else random_region(rng, rows, cols, granule)
        rank = int(rng.integers(0, size))
        region = t[rs, cs]
        cells = [(r, c) for r in range(rows)[rs] for c in range(cols)[cs]]  # in the region's order
        if rng.random() < 0.25:
            region = region.transpose(1, 0)
            cells = [(r, c) for c in range(cols)[cs] for r in range(rows)[rs]]
        cells_of[region.layout_key] = cells
        geometry = holdings._geometry(region.layout_key, region) if path == "swept" else None
        if geometry is not None and rng.random() < 0.15:  # compiled placement's read
            if fetch_whole(geometry, holdings.writer, holdings.valid, np.uint64(1 << rank)) >= 0:
                for r, c in cells:
                    holders[r][c].add(rank)
            holdings.forget()
        elif rng.random() < 0.4:
            holdings.wrote(region, rank)
            for r, c in cells:
                writer[r, c], holders[r][c] = rank, {rank}
        else:
            expected: dict[int, set] = {}
            for r, c in cells:
                if rank not in holders[r][c]:
                    expected.setdefault(int(writer[r, c]), set()).add((r, c))
                    holders[r][c].add(rank)
            got = {}
            for source, mask in holdings.fetch(region, rank):
                chosen = np.ones(region.shape, bool) if mask is None else mask
                got[source] = {cell for cell, moved in zip(cells, chosen.ravel()) if moved}
            assert got == expected
        for key, ranks in holdings._full.items():
            assert all(ranks >> holder & 1 == 0 or holder in holders[r][c]
                       for r, c in cells_of[key] for holder in range(size)), "a remembered AND"
    expected_stale: dict[tuple, set] = {}
    for r in range(rows):
        for c in range(cols):
            if int(owner[r, c]) not in holders[r][c]:
                expected_stale.setdefault((int(writer[r, c]), int(owner[r, c])), set()).add(r * cols + c)
    got_stale = {(w, o): set(range(rows * cols)) if mask is None else set(np.flatnonzero(mask).tolist())
                 for w, o, mask in holdings.stale_at_owner()}
    assert got_stale == expected_stale


def test_ranks_traces_merge_into_one_timeline_a_process_per_rank(tmp_path):
    for rank in range(2):
        events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "pto-gpu run"}},
                  {"ph": "X", "pid": 1, "tid": 1, "name": "gemm", "ts": 0, "dur": 1},
                  {"ph": "s", "pid": 1, "tid": 1, "name": "dependency", "id": 0, "ts": 0}]
        rank_path(tmp_path / "run.json", rank).write_text(json.dumps({"traceEvents": events}))
    merged = merge([tmp_path / "run.rank0.json", tmp_path / "run.rank1.json"])["traceEvents"]
    assert [e["pid"] for e in merged] == [1, 1, 1, 2, 2, 2]
    assert [e["args"]["name"] for e in merged if e["name"] == "process_name"] == ["rank 0", "rank 1"]
    assert len({e["id"] for e in merged if "id" in e}) == 2  # flow ids stay apart


class OneRankOf:
    """What a DistArray asks of its communicator outside scatter and gather."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's spelling)
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size


@pytest.mark.parametrize("owner, row_floats", [(pto.block_rows(2), 1024), (pto.block_cyclic(30, 2), 100)],
                         ids=["block-rows-page-rows", "cyclic-unaligned-rows"])
def test_a_dist_array_gives_back_the_pages_of_rows_it_does_not_own(owner, row_floats):
    """Rank 1 of 2 touches every row (as received rows do during a run); release_remote gives
    back every page that holds no row of its own, keeps the pages its rows are on, and their
    values. The memory it then holds is its rows and at most a page at each block edge."""
    from pto_gpu.distributed.dist_array import PAGE

    d = pto.DistArray((64, row_floats), np.float32, owner, OneRankOf(1, 2))
    assert d.resident_nbytes == 0  # untouched: nothing held
    mine = owner.row_owners(64) == 1
    assert [r for block in d.local for r in range(block.start, block.stop)] == np.flatnonzero(mine).tolist()
    d.whole[...] = np.arange(64 * row_floats, dtype=np.float32).reshape(64, row_floats)
    assert d.resident_nbytes >= d.nbytes
    d.release_remote()
    own = int(mine.sum()) * d.row_bytes
    assert own <= d.resident_nbytes <= own + 2 * len(d.local) * PAGE
    for block in d.local:
        want = np.arange(block.start * row_floats, block.stop * row_floats, dtype=np.float32)
        assert np.array_equal(block.view.ravel(), want)
    def pages(row: int) -> set[int]:
        return set(range(row * d.row_bytes // PAGE, ((row + 1) * d.row_bytes - 1) // PAGE + 1))

    kept = set().union(*(pages(row) for row in np.flatnonzero(mine)))
    released = [row for row in np.flatnonzero(~mine) if not pages(row) & kept]
    assert released and all(not d.whole[row].any() for row in released)  # given back: they read 0


def test_a_dist_array_refuses_what_it_cannot_be():
    with pytest.raises(pto.RankError, match=r"DistArray\(shape=\(8, 2\)\): owner=BlockRows\(ranks=4\) "
                                            r"spreads over 4 ranks but the run has 2"):
        pto.DistArray((8, 2), np.float32, pto.block_rows(4), OneRankOf(0, 2))
    with pytest.raises(pto.ParamError, match=r"DistArray: shape=\(-1, 2\) must be"):
        pto.DistArray((-1, 2), np.float32, 0, OneRankOf(0, 1))


class LoopbackTransport:
    """Receives whose data the test delivers by hand (`come`), as a Transport's receive side."""

    ordered = False
    native = None  # its transfers take the Python way

    def __init__(self):
        self.given_up: list = []

    def receive(self, view, mask, source: int, sequence: int) -> Posted:
        return Posted([False], np.empty(packed_bytes(view, mask), np.uint8), view, mask, source)

    def arrived(self, posted: list[Posted]) -> list[int]:
        return [i for i, p in enumerate(posted) if p.request[0]]

    def deliver(self, posted: Posted) -> None:
        unpack(posted.data, posted.view, posted.mask)

    def give_up(self, posted: list[Posted]) -> None:
        self.given_up += posted


def _receive_task(kernel_name: str = "recv") -> Task:
    kernel = pto.kernel(worker=pto.ACCELERATOR, name=kernel_name)(lambda region: None)
    return Task(7, kernel, pto.ACCELERATOR, (), label=-1, arrives=True)


def test_the_inbox_completes_receives_as_their_data_comes_in_any_order():
    inbox = Inbox(LoopbackTransport())
    views = [np.zeros(3), np.zeros(2)]
    tasks = [_receive_task(), _receive_task()]
    tasks[1].id = 8
    for task, view, source in zip(tasks, views, (1, 2)):
        inbox.post(task, view, None, source, 0)
    assert inbox.arrived() == []
    second = inbox._posted[1]  # the later receive's data comes first
    second.data[:] = np.array([5.0, 6.0]).view(np.uint8)
    second.request[0] = True
    assert inbox.arrived() == [8] and views[1].tolist() == [5.0, 6.0] and not views[0].any()
    first = inbox._posted[0]
    first.data[:] = np.array([1.0, 2.0, 3.0]).view(np.uint8)
    first.request[0] = True
    assert inbox.arrived() == [7] and views[0].tolist() == [1.0, 2.0, 3.0] and inbox.arrived() == []


def test_a_receive_that_cannot_unpack_is_its_tasks_error_and_a_failed_run_gives_up_the_rest():
    transport = LoopbackTransport()
    inbox = Inbox(transport)
    read_only = np.zeros(2)
    read_only.flags.writeable = False
    inbox.post(_receive_task("recv"), read_only, None, 1, 0)
    inbox.post(_receive_task("recv"), np.zeros(2), None, 1, 1)
    inbox._posted[0].request[0] = True
    with pytest.raises(pto.TaskError, match="recv") as raised:
        inbox.arrived()
    assert isinstance(raised.value.__cause__, ValueError)
    inbox.give_up()  # what the run left posted stays with the transport (MPI may still fill it)
    assert len(transport.given_up) == 1 and inbox.arrived() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's (prctl)")
def test_a_polling_thread_sleeps_with_a_microsecond_of_timer_slack():
    """polling.precise_sleeps: the poll's short pauses end within 1 µs of when asked (Linux lets
    a normal thread's sleeps run 50 µs late), on the calling thread only."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    get_timer_slack = 30  # PR_GET_TIMERSLACK
    slack = {}

    def poller():
        precise_sleeps()
        slack["poller"] = libc.prctl(get_timer_slack, 0, 0, 0, 0)

    thread = threading.Thread(target=poller)
    thread.start()
    thread.join()
    assert slack["poller"] == TIMER_SLACK_NS == 1_000
    assert libc.prctl(get_timer_slack, 0, 0, 0, 0) != TIMER_SLACK_NS  # this thread's is its own


@pto.kernel(worker=pto.VECTOR)
def copy_row(x, y):
    y[...] = x


class SendingRank:
    """Rank 2 of 4's transport, for a run whose transfers are all this rank's sends: it notes
    each send's destination and place in the sequence to that rank."""

    ordered = False
    native = None  # the Python way

    def __init__(self):
        self.rank, self.size = 2, 4
        self.sent: list[tuple[int, int]] = []

    def send(self, view, mask, dest: int, sequence: int) -> None:
        self.sent.append((dest, sequence))

    def arrived(self, posted: list) -> list[int]:
        return []

    def begin(self, name) -> None:
        pass

    def barrier(self) -> None:
        pass

    def conclude(self, failure) -> list:
        return []

    def fail(self) -> None:
        pass

    def give_up(self, posted: list) -> None:
        pass

    tags = (0, 1 << 30)

    def datatype(self, tensor) -> None:
        return None


def test_the_sends_one_completion_releases_go_out_in_submission_order(monkeypatch):
    """Rank 2 writes x; six tasks of rank 0 then each read a row of it. The sends that rank 2's
    completion releases run on its worker's thread (inline, with the other rank's tasks),
    from a stack: in submission order, as queued tasks run, not the reverse."""
    import pto_gpu.runtime as runtime_module

    transport = SendingRank()
    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: transport)

    @pto.kernel(worker=pto.VECTOR)
    def bump(x):
        x += 1

    def fan_out(o, x, y):
        X, Y = o.external(x, owner=2), o.external(y, owner=0)
        o.submit(bump, pto.inout(X))
        for row in range(6):
            o.submit(copy_row, pto.input(X[row:row + 1]), pto.output(Y[row:row + 1]))

    with pytest.warns(RuntimeWarning, match="ranks 1, 3 of 4 ran none"):
        pto.Runtime(backend="cpu", comm=object(), workers={pto.VECTOR: 1}).run(fan_out, np.zeros((6, 1)),
                                                                                 np.zeros((6, 1)))
    assert transport.sent == [(0, sequence) for sequence in range(6)]


class ReceivingRank(SendingRank):
    """Rank 0 of 2's transport, for a run whose one transfer is a receive: its data (5s) has
    come once `came` is set; each test for it notes whether `kernel_running` was set then."""

    def __init__(self):
        super().__init__()
        self.rank, self.size = 0, 2
        self.came, self.kernel_running = threading.Event(), threading.Event()
        self.tests_during_the_kernel = 0

    def receive(self, view, mask, source: int, sequence: int):
        return view

    def arrived(self, posted: list) -> list[int]:
        self.tests_during_the_kernel += self.kernel_running.is_set()
        return list(range(len(posted))) if self.came.is_set() else []

    def deliver(self, posted) -> None:
        posted[...] = 5

    def give_up(self, posted: list) -> None:
        pass


@pytest.mark.parametrize("cores", [1, 2])
def test_nobody_polls_beside_workers_that_keep_every_core_busy(monkeypatch, cores):
    """Rank 0 runs a 0.1 s kernel while a receive waits for data that comes as the kernel
    ends. On a process of one core, no idle worker polls beside the kernel (a poll would take
    time from it and could start nothing sooner); the kernel's worker polls once it ends, and
    the reader gets the data. With a core free, an idle worker polls while the kernel runs."""
    import pto_gpu.executors.parallel as parallel_module
    import pto_gpu.runtime as runtime_module

    transport = ReceivingRank()
    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: transport)
    monkeypatch.setattr(parallel_module, "process_cores", lambda: cores)
    executors = []
    made = parallel_module.ParallelExecutor.__init__

    def noted(self, *args, **kwargs):
        made(self, *args, **kwargs)
        executors.append(self)

    monkeypatch.setattr(parallel_module.ParallelExecutor, "__init__", noted)

    @pto.kernel(worker=pto.CUBE)
    def long_kernel(tile):
        deadline = time.monotonic() + 10  # a poll that began as the kernel did sees it run, and stops
        while cores == 1 and executors[0]._polling and time.monotonic() < deadline:
            time.sleep(0.001)
        transport.kernel_running.set()
        time.sleep(0.1)
        transport.kernel_running.clear()
        transport.came.set()

    def receive_beside_a_kernel(o, x, y):
        X, Y = o.external(x, owner=pto.block_rows(2)), o.external(y, owner=0)
        o.submit(copy_row, pto.input(X[0:1]), pto.output(X[1:2]))  # rank 1's: its row goes to rank 0
        o.submit(long_kernel, pto.inout(X[0:1]))
        o.submit(copy_row, pto.input(X[1:2]), pto.output(Y))

    y = np.zeros((1, 4))
    pto.Runtime(backend="cpu", comm=object(), workers={pto.CUBE: 1, pto.VECTOR: 1, pto.ACCELERATOR: 1}).run(
        receive_beside_a_kernel, np.zeros((2, 4)), y)
    np.testing.assert_array_equal(y, 5)
    if cores == 1:
        assert transport.tests_during_the_kernel == 0
    else:
        assert transport.tests_during_the_kernel > 0


MPI_REQUEST_NULL, MPI_ERR_IN_STATUS = 0x2C000000, 17  # MPICH's
_POST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_int] * 5, ctypes.POINTER(ctypes.c_int32))
_TESTSOME = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int32),
                             ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p)


class FailingMpi(ReceivingRank):
    """Rank 0 of 2's transport whose transfers native code posts, through stand-ins for MPI's
    functions: receives get handles 1, 2, ...; once two are posted, MPI_Testsome finishes the
    first in error, as MPI does a truncated message: it frees that request, nulls its handle,
    and returns MPI_ERR_IN_STATUS. `cancelled` notes the receives the failed run cancels."""

    def __init__(self):
        super().__init__()
        self.handles, self.cancelled = 0, None
        self._functions = (_POST(self._post), _POST(self._post), _TESTSOME(self._testsome))
        addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in self._functions]
        self.native = transport_module.NativeMpi(*addresses, 64)

    def _post(self, buffer, count, datatype, peer, tag, comm, request) -> int:
        self.handles += 1
        request[0] = self.handles
        return 0

    def _testsome(self, count, requests, done, indices, statuses) -> int:
        if count < 2:
            done[0] = 0
            return 0
        requests[0], done[0], indices[0] = MPI_REQUEST_NULL, 1, 0
        return MPI_ERR_IN_STATUS

    def datatype(self, tensor) -> int:
        return 1

    def comm_handle(self) -> int:
        return 3

    def cancel(self, receives, sends, read) -> None:
        self.cancelled = receives

    def fail(self) -> None:
        pass


class ArrivingMpi(FailingMpi):
    """FailingMpi's stand-ins, but MPI_Testsome finishes a receive well: at the third test
    after it was posted it writes `data` where the receive lands and reports it done, noting
    the thread that tested."""

    def __init__(self, data: bytes):
        super().__init__()
        self.data, self.landing, self.tests, self.tested_by = data, {}, 0, None

    def _post(self, buffer, count, datatype, peer, tag, comm, request) -> int:
        super()._post(buffer, count, datatype, peer, tag, comm, request)
        self.landing[self.handles] = buffer
        return 0

    def _testsome(self, count, requests, done, indices, statuses) -> int:
        self.tests += 1
        done[0] = 0
        for i in range(count):
            if requests[i] in self.landing and self.tests >= 3:
                ctypes.memmove(self.landing.pop(requests[i]), self.data, len(self.data))
                requests[i], done[0], indices[0] = MPI_REQUEST_NULL, 1, i
                self.tested_by = threading.get_ident()
                break
        return 0


class PostingMpi(FailingMpi):
    """FailingMpi's stand-ins, but MPI_Testsome finishes every posted request at once, and a
    post fails (MPI error 1) if `refuses`; `posted_by` notes the thread of each post."""

    def __init__(self, refuses: bool):
        super().__init__()
        self.refuses, self.posted_by = refuses, []

    def _post(self, buffer, count, datatype, peer, tag, comm, request) -> int:
        self.posted_by.append(threading.get_ident())
        return 1 if self.refuses else super()._post(buffer, count, datatype, peer, tag, comm, request)

    def _testsome(self, count, requests, done, indices, statuses) -> int:
        for i in range(count):
            requests[i], indices[i] = MPI_REQUEST_NULL, i
        done[0] = count
        return 0


@pytest.mark.parametrize("refuses", [False, True])
def test_a_send_a_python_completion_makes_ready_is_posted_by_that_completion(monkeypatch, refuses):
    """Rank 0 writes its row with a Python kernel; a task of rank 1's reads it. The native send
    that completion makes ready is posted inside the completion, on the kernel's thread, and
    never dispatched as a task of Python's (that dispatch was most of what a hop between
    ranks added); a post MPI refuses fails the run with the send's TaskError."""
    import pto_gpu.executors.parallel as parallel_module
    import pto_gpu.runtime as runtime_module

    transport = PostingMpi(refuses)
    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: transport)
    executed, wrote_on = [], []
    execute = parallel_module.ParallelExecutor._execute

    def noted(self, task, *args):
        executed.append(task.kernel.name)
        return execute(self, task, *args)

    monkeypatch.setattr(parallel_module.ParallelExecutor, "_execute", noted)

    @pto.kernel(worker=pto.VECTOR)
    def write_row(x):
        wrote_on.append(threading.get_ident())
        x[...] = 1

    def send_on(o, x, y):
        X, Y = o.external(x, owner=pto.block_rows(2)), o.external(y, owner=1)
        o.submit(write_row, pto.output(X[0:1]))
        o.submit(copy_row, pto.input(X[0:1]), pto.output(Y))  # rank 1's

    def run():
        pto.Runtime(backend="cpu", comm=object(), workers={pto.VECTOR: 1, pto.ACCELERATOR: 1}).run(
            send_on, np.zeros((2, 4)), np.zeros((1, 4)))

    if refuses:
        with pytest.raises(pto.TaskError, match="send") as failed:
            run()
        assert "MPI failed to post or complete the transfer" in str(failed.value)
    else:
        run()
    assert transport.posted_by == wrote_on and len(wrote_on) == 1
    assert executed == ["write_row"]


def test_a_poll_that_sees_data_come_starts_its_reader_itself(monkeypatch):
    """Rank 0 reads rank 1's row; native code posts the receive, and the worker that holds the
    poll sees it complete. The reader, of the poller's class and with nothing of that class
    queued, runs on the poller's thread without being queued (which would cost it a round of
    the lock before it starts: most of a poll's hand-over on a hop between ranks), and reads
    what came."""
    import pto_gpu.executors.parallel as parallel_module
    import pto_gpu.runtime as runtime_module

    transport = ArrivingMpi(np.full(4, 5.0).tobytes())
    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: transport)
    queued, ran_on = [], []
    queue = parallel_module.ParallelExecutor._queue_locked

    def noted(self, task):
        queued.append(task.kernel.name)
        return queue(self, task)

    monkeypatch.setattr(parallel_module.ParallelExecutor, "_queue_locked", noted)

    @pto.kernel(worker=pto.ACCELERATOR)
    def read_row(x, y):
        ran_on.append(threading.get_ident())
        y[...] = x

    def receive(o, x, y):
        X, Y = o.external(x, owner=pto.block_rows(2)), o.external(y, owner=0)
        o.submit(read_row, pto.input(X[1:2]), pto.output(Y))

    y = np.zeros((1, 4))
    pto.Runtime(backend="cpu", comm=object(), workers={pto.ACCELERATOR: 1}).run(receive, np.zeros((2, 4)), y)
    np.testing.assert_array_equal(y, 5)
    assert ran_on == [transport.tested_by] and "read_row" not in queued


def test_a_failed_mpi_test_cancels_only_the_requests_mpi_still_holds(monkeypatch):
    """Rank 0 reads two rows of rank 1's; native code posts both receives, and MPI_Testsome
    finishes the first in error (a truncated message, say). The run fails with that receive's
    TaskError, and cancels the second receive only: MPI has freed the first, whose handle may
    already be another request's."""
    import pto_gpu.runtime as runtime_module

    transport = FailingMpi()
    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: transport)

    @pto.kernel(worker=pto.VECTOR)
    def fill(x):
        x[...] = 1

    def two_receives(o, x, y):
        X, Y = o.external(x, owner=1), o.external(y, owner=0)
        for row in range(2):
            o.submit(fill, pto.output(X[row:row + 1]))  # rank 1's
            o.submit(copy_row, pto.input(X[row:row + 1]), pto.output(Y[row:row + 1]))

    with pytest.raises(pto.TaskError, match="recv") as failed:
        pto.Runtime(backend="cpu", comm=object(), workers={pto.VECTOR: 1, pto.ACCELERATOR: 1}).run(
            two_receives, np.zeros((2, 4)), np.zeros((2, 4)))
    assert "MPI failed to post or complete the transfer" in str(failed.value)
    assert "offset=0," in str(failed.value)  # the first receive's: row 0
    assert transport.handles == 2
    assert transport.cancelled == [2]


@numba.njit(cache=True)
def _tiles_of(o, x, out, rows, owner, scale_id):
    """out's first `rows` rows = 2x's, through a heap tile of `owner`'s (-1: the default)."""
    t = pj.alloc(o, (rows, pj.shape(x, 1)), pj.dtype(x), owner)
    if rows:  # (a kernel family's tiles are never empty)
        pj.submit(o, scale_id, (pj.input(pj.narrow(x, 0, 0, rows)), pj.output(t)), (2.0,))
        pj.submit(o, scale_id, (pj.input(t), pj.output(pj.narrow(out, 0, 0, rows))), (1.0,))
    pj.free(o, t)


@pytest.mark.parametrize(("rows", "owner", "told"), [(2, 2, 0), (2, -1, 0), (0, 2, 1)],
                         ids=["its-rank", "default-owner", "no-element"])
def test_compiled_code_keeps_the_tables_of_the_heap_tiles_it_allocates(monkeypatch, rows, owner, told):
    """Rank 2 of 4 allocates a heap tile in compiled code, of its own (`o.on_rank(2)` around
    the call gives the default owner), writes it and reads it: compiled placement keeps the
    tile's tables itself, and the Python placer never hears of it; but of an empty tile, which
    Python's alloc takes as it is. The results are 2x."""
    import pto_gpu.runtime as runtime_module
    from pto_gpu.jit import bridge, host

    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: SendingRank())
    heard: list[int] = []
    service = host.Session.service

    def noted(session, code, a, b, c):
        heard.append(code)
        return service(session, code, a, b, c)

    monkeypatch.setattr(host.Session, "service", noted)

    def orchestration(o, x, out):
        X, OUT = o.external(x, owner=2), o.external(out, owner=2)
        with o.on_rank(2):
            o.compiled(_tiles_of, X, OUT, rows, owner, scale.id)

    x, out = np.arange(8.0, dtype=np.float32).reshape(2, 4), np.zeros((2, 4), np.float32)
    rt = pto.Runtime(backend="cpu", comm=object(), workers={pto.VECTOR: 1})
    rt.run(orchestration, x, out)
    assert heard.count(bridge.SERVICE_ALLOCATED) == told
    assert np.array_equal(out[:rows], 2 * x[:rows]) and not out[rows:].any()


def test_compiled_code_leaves_an_owner_the_run_has_not_to_python_s_alloc_which_names_it(monkeypatch):
    """A compiled alloc owned by rank 4 of a run of 4: compiled placement keeps no tables for
    it, and the Python placer's alloc raises the RankError that names it."""
    import pto_gpu.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "_make_transport", lambda comm, name, backend: SendingRank())

    def orchestration(o, x, out):
        o.compiled(_tiles_of, o.external(x, owner=2), o.external(out, owner=2), 2, 4, scale.id)

    rt = pto.Runtime(backend="cpu", comm=object(), workers={pto.VECTOR: 1})
    with pytest.raises(pto.RankError, match="owner=4 is out of range"):
        rt.run(orchestration, np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32))
