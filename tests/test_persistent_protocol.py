"""The persistent scheduler's protocol (pto_gpu/backends/persistent_protocol.h, issue 44) on host
threads under ThreadSanitizer (tests/persistent_fuzz.c): random graphs published into rings of
task slots while blocks (threads) wire, pull, run and complete their tasks, and share the
pieces of tasks of several; every piece runs once, after all of its task's producers, with no
data race. A completion lost on purpose is reported
as a deadlock that names what waits for it, not a hang; a slow host is not one. The same
header compiles for the GPU, and, marked gpu, the same fuzz runs with a GPU's blocks as its
blocks (tests/persistent_fuzz_gpu.cu)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_cuda import needs_gpu

HEADER_DIR = Path(__file__).resolve().parent.parent / "pto_gpu" / "backends"
FUZZ = Path(__file__).with_name("persistent_fuzz.c")
FUZZ_GPU = FUZZ.with_name("persistent_fuzz_gpu.cu")
# nvcc where it is on the PATH, else where the CUDA toolkit puts it (the device image's)
NVCC = shutil.which("nvcc") or next((str(p) for p in [Path("/usr/local/cuda/bin/nvcc")] if p.exists()), None)
NO_NVCC = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed (the CUDA toolkit)")


def _build(folder: Path, *defines: str, source: Path = FUZZ) -> Path:
    """`source` (the fuzz) under ThreadSanitizer, against the protocol's header; the test
    skipped where there is no C compiler."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc)")
    binary = folder / source.stem
    command = ["cc", "-std=c11", "-O1", "-g", "-fsanitize=thread", "-pthread", "-Wall", "-Wextra", "-Werror",
               *defines, f"-I{HEADER_DIR}", str(source), "-o", str(binary)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and "sanitize" in done.stderr:
        pytest.skip(f"the C compiler cannot build with ThreadSanitizer: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    return binary


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def impatient_fuzz(tmp_path_factory):
    """The fuzz with blocks and host that give up after 2 s without progress (a loaded CI
    machine may stall a thread for a fraction of that)."""
    return _build(tmp_path_factory.mktemp("impatient"), "-DPTO_PATIENCE_NS=2000000000")


def _run(binary: Path, *args: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)


def _ran_every_task(done: subprocess.CompletedProcess, tasks: int) -> None:
    """The fuzz's checks held for all `tasks`, and ThreadSanitizer found no race."""
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith(f"ok: {tasks} tasks"), done.stdout


# seed, tasks, slots, blocks, fan-in, window (producers among the `window` tasks before). The
# third once found a push that took a cell a stalled block had not yet released for a full
# queue; the last three give lists of many chunks (many links to few producers), which leak
# out of the pool within a few hundred tasks if retiring misses any.
GRAPHS = [(1, 4000, 8, 4, 3, 20), (2, 4000, 2, 3, 2, 8), (3, 3000, 64, 2, 6, 200), (4, 3000, 16, 1, 3, 40),
          (5, 6000, 4, 6, 4, 6), (6, 3000, 32, 3, 0, 1), (8, 1500, 16, 3, 30, 30), (10, 6000, 16, 3, 30, 8),
          (11, 6000, 8, 6, 30, 7)]
NAME = "seed{}-tasks{}-slots{}-blocks{}-fanin{}-window{}"


@pytest.mark.parametrize("graph", GRAPHS, ids=[NAME.format(*g) for g in GRAPHS])
def test_random_graphs_run_every_task_once_after_its_producers_with_no_race(fuzz, graph):
    """Rings of 2 to 64 slots reused hundreds of times (back-pressure), producers retired
    before their successors arrive (window > slots) or still running, fan-in 0 to 30. Where
    tasks have producers, blocks run some of them as the successor their last completion made
    ready and kept (without the ready queue); without producers, none."""
    done = _run(fuzz, *graph)
    _ran_every_task(done, graph[1])
    kept = int(re.search(r"(\d+) kept", done.stdout).group(1))
    assert kept > 0 if graph[4] > 0 else kept == 0, done.stdout


PIECES = ("-DFUZZ_MAX_PIECES=6", "-DFUZZ_BOARD=2")


@pytest.fixture(scope="module")
def pieces_fuzz(tmp_path_factory):
    """The fuzz with tasks of 1 to 6 pieces shared through a board of 2 entries (so that some
    find it full and run all their pieces on one block)."""
    return _build(tmp_path_factory.mktemp("pieces"), *PIECES)


PIECES_GRAPHS = [(1, 4000, 8, 4, 3, 20), (5, 6000, 4, 6, 4, 6), (8, 1500, 16, 3, 30, 30),
                 (12, 3000, 32, 5, 2, 64)]


@pytest.mark.parametrize("graph", PIECES_GRAPHS, ids=[NAME.format(*g) for g in PIECES_GRAPHS])
def test_tasks_of_several_pieces_run_each_piece_once_after_the_producers(pieces_fuzz, graph):
    """Blocks take pieces from the board while waiting for a ready task and between tasks; the
    last piece to finish completes its task; the board is empty at the end. (Dropping the
    reset of a slot's count of pieces run, or freeing an entry one piece early, leaves tasks
    stuck here.)"""
    done = _run(pieces_fuzz, *graph)
    _ran_every_task(done, graph[1])


@pytest.fixture(scope="module")
def threaded_fuzz(tmp_path_factory):
    """The fuzz with blocks of 3 threads that stage the records together, with pieces."""
    return _build(tmp_path_factory.mktemp("threaded"), "-DFUZZ_BLOCK_THREADS=3", "-DFUZZ_MAX_PIECES=4")


THREADED_GRAPHS = [(1, 3000, 8, 3, 3, 20), (2, 3000, 2, 2, 2, 8), (10, 3000, 16, 3, 30, 8),
                   (13, 2000, 64, 2, 4, 100)]


@pytest.mark.parametrize("graph", THREADED_GRAPHS, ids=[NAME.format(*g) for g in THREADED_GRAPHS])
def test_blocks_of_several_threads_stage_each_record_whole_with_no_race(threaded_fuzz, graph):
    """The wirer's block copies the records, and the producers' tickets they name, into the
    blocks' memory each thread a share (ring positions wrapping, records of 0 to all of their
    words in use); every record a block runs is the host's, and no thread's copy races
    another's reads of it."""
    done = _run(threaded_fuzz, *graph)
    _ran_every_task(done, graph[1])


@pytest.mark.parametrize("lost", [1500, 2990])
def test_a_lost_completion_is_a_deadlock_that_names_what_waits(impatient_fuzz, lost):
    """Task `lost` runs but never completes: its successors never become ready, and nothing
    moves. At 1500 the host waits for its slot to free, at 2990 after the host has closed.
    Either way the run stops and says which tasks wait for which producers."""
    done = _run(impatient_fuzz, 7, 3000, 8, 3, 3, 20, lost)
    assert done.returncode == 0 and "ThreadSanitizer" not in done.stderr, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith("stuck:"), done.stdout
    assert f"task {lost} ran and did not complete" in done.stdout


def test_a_host_slower_than_the_patience_is_not_a_deadlock(impatient_fuzz):
    """The host sleeps 5 s (2.5 times the patience) before publishing task 500, with every task
    before it finished: the blocks wait for it, the run ends whole."""
    done = _run(impatient_fuzz, 9, 1000, 8, 3, 3, 20, -1, 500, 5000)
    assert done.returncode == 0 and "ThreadSanitizer" not in done.stderr, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith("ok: 1000 tasks"), done.stdout


def test_no_push_takes_a_cell_a_stalled_block_still_holds(tmp_path):
    """Blocks stall 300 us holding every fifth ready-queue cell they pop, before they read its
    slot, while the others go round queues of 4 and 8 cells: a push (of one task, or of several
    into consecutive cells) must wait for such a cell, or the stalled block reads the slot
    another push wrote there (a race, a task run twice). The positions pass a held cell only
    where tasks become ready out of their order, so producers reach back past the ring (a
    window wider than the slots). A push that took the cells it found without looking at
    them failed 14 of 24 such runs (this test makes 8)."""
    stalling = _build(tmp_path, "-DFUZZ_CELL_STALL_US=300")
    for seed in (1, 2, 3, 4):
        for slots, blocks, fanin, window in ((4, 6, 3, 20), (8, 4, 4, 16)):
            _ran_every_task(_run(stalling, seed, 6000, slots, blocks, fanin, window), 6000)


def test_a_block_stalled_between_closed_and_submitted_misses_no_task(tmp_path):
    """The one block stalls 2 ms between its loads of `closed` and `submitted` while the host,
    after a 50 ms pause, publishes its last task and closes: the block must see that task (read
    the other way round, a block could see the old count and the close, end the run, and leave
    the task unrun)."""
    stalling = _build(tmp_path, "-DPTO_PATIENCE_NS=2000000000", "-DFUZZ_STALL_US=2000")
    for seed in (1, 2, 3):
        done = _run(stalling, seed, 200, 8, 1, 3, 20, -1, 199, 50)
        assert "ThreadSanitizer" not in done.stderr, done.stderr[-2000:]
        assert done.returncode == 0 and done.stdout.startswith("ok: 200 tasks"), done.stdout


STOPPED_BEFORE_START = r'''
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "persistent_protocol.h"

static pto_sched sched;
static pto_board board;
static unsigned ran;

static void *block(void *unused) {
    (void)unused;
    pto_work work;
    pto_u32 kept = PTO_NO_SLOT;
    pto_u64 said[PTO_SAID_WORDS];
    while (pto_block_next_work(&sched, &board, &work, &kept, said, 0, 1) == PTO_GOT_TASK) {
        __atomic_fetch_add(&ran, 1, __ATOMIC_RELAXED);
        if (pto_pieces_ran(&board, &work)) {
            pto_complete(&sched, work.slot, &kept);
            pto_show_done(&sched, work.slot, pto_staged(&sched, work.slot, PTO_RECORD_TICKET));
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    const unsigned blocks = argc > 1 ? (unsigned)atoi(argv[1]) : 1;
    const pto_u32 slots = 8, words = 8, chunks = pto_pool_chunks(slots, words);
    const pto_extent extent = pto_layout(&sched, slots, words, chunks, PTO_RECORD_HEADER, NULL, NULL);
    pto_layout(&sched, slots, words, chunks, PTO_RECORD_HEADER, calloc(extent.device_bytes, 1),
               calloc(extent.mapped_bytes, 1));
    pto_initial(&sched);
    board = (pto_board){calloc(slots, 8), calloc(slots, 4), calloc(4, 8), 4, calloc(1, 4)};
    pto_u64 next_word = 0;
    for (pto_u64 t = 0; t < 4; ++t) pto_host_submit(&sched, t, &next_word, NULL, 0, 1, 0);
    pto_store_release32(sched.host_abort, PTO_FAULTED);
    pthread_t threads[8];
    for (unsigned b = 0; b < blocks; ++b) pthread_create(&threads[b], NULL, block, NULL);
    for (unsigned b = 0; b < blocks; ++b) pthread_join(threads[b], NULL);
    printf("%u\n", ran);
    return 0;
}
'''


def test_a_kernel_that_starts_after_the_host_stopped_the_run_runs_nothing(tmp_path):
    """Four tasks published, then the run stopped (the executor gives up on a kernel whose
    stream is held, and the next run may take the heap space those tasks would write), then
    the blocks start: none runs a task. A review found one run after the blocks took to
    reading the host's words through one block's look (the look stopped, the wiring and the
    pop went on)."""
    source = tmp_path / "stopped.c"
    source.write_text(STOPPED_BEFORE_START)
    binary = _build(tmp_path, source=source)
    for blocks in (1, 4):
        done = _run(binary, blocks)
        assert "ThreadSanitizer" not in done.stderr, done.stderr[-2000:]
        assert done.returncode == 0 and done.stdout.split() == ["0"], (blocks, done.stdout, done.stderr)


@NO_NVCC
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_protocol_compiles_for_the_gpu(arch, tmp_path):
    """A persistent worker over the header: a block stages and wires records, pulls work (a
    task, or a piece of one from the board), runs it, and thread 0 completes the task after its
    last piece (PTX acquire/release atomics, %globaltimer). Every
    read-modify-write is at GPU scope (only blocks touch those words; at system scope each is
    a MEMBAR.SYS), and so are the loads and stores of the ready queue's cells (a push's
    fences: the next test)."""
    unit = tmp_path / "worker.cu"
    unit.write_text('''#include "persistent_protocol.h"
__global__ void worker(pto_sched sched, pto_board board, float *out) {
    __shared__ pto_u64 said[PTO_SAID_WORDS];
    pto_work work;
    pto_u32 kept = PTO_NO_SLOT;
    while (pto_block_next_work(&sched, &board, &work, &kept, said, threadIdx.x, blockDim.x) == PTO_GOT_TASK) {
        for (unsigned piece = work.first; piece < work.last; ++piece)  /* the task's pieces */
            out[(work.slot * work.pieces + piece) * blockDim.x + threadIdx.x] += 1.0f;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (pto_pieces_ran(&board, &work)) {
                if (pto_complete(&sched, work.slot, &kept)) pto_stop(&sched, PTO_FAULTED);
                pto_show_done(&sched, work.slot, pto_staged(&sched, work.slot, PTO_RECORD_TICKET));
            }
        }
    }
}
''')
    command = [NVCC, f"-arch={arch}", "-std=c++17", "-Werror", "all-warnings", f"-I{HEADER_DIR}", "-c",
               str(unit), "-o", str(tmp_path / "worker.o")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ptx = subprocess.run(command[:-3] + ["-ptx", str(unit), "-o", "-"], capture_output=True, text=True).stdout
    atomics = re.findall(r"\batom\.acq_rel\.(\w+)\.", ptx)
    assert atomics and set(atomics) == {"gpu"}
    assert "ld.acquire.gpu.u64" in ptx and "st.release.gpu.u64" in ptx and "ld.acquire.sys" in ptx


def _orders_of(ptx: str) -> list[str]:
    """The ready queue's accesses and fences in PTX text, in order."""
    return re.findall(r"ld\.relaxed\.gpu|fence\.acq_rel\.gpu|atom\.acq_rel\.gpu\.cas|st\.relaxed\.gpu", ptx)


@NO_NVCC
def test_a_push_fences_the_cells_it_loads_and_their_release(tmp_path):
    """A push loads its cells' sequences relaxed, side by side, and then a GPU-scope fence
    makes them acquires (a popper's release of the cell is seen before the cell is taken);
    after the compare-and-swap that takes them and the stores of their slots, another fence
    makes its relaxed stores of the sequences releases (the slot is seen before the cell is
    popped). The host build, under ThreadSanitizer, has acquire loads and release stores
    instead, so only this test sees the fences: in the PTX, no compare-and-swap follows a
    relaxed load, and no relaxed store a compare-and-swap, without a fence between."""
    unit = tmp_path / "push.cu"
    unit.write_text('''#include "persistent_protocol.h"
__global__ void push(pto_sched sched, const pto_u32 *slots, pto_u32 count, int *full) {
    *full = pto_ready_push(&sched, slots, count);
}
''')
    command = [NVCC, "-arch=sm_90", "-std=c++17", f"-I{HEADER_DIR}", "-ptx", str(unit), "-o", "-"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    orders = _orders_of(done.stdout)
    assert orders.count("atom.acq_rel.gpu.cas") == 1 and orders.count("fence.acq_rel.gpu") >= 2, orders
    since_fence: set[str] = set()
    for order in orders:
        if order == "fence.acq_rel.gpu":
            since_fence.clear()
            continue
        assert not (order == "atom.acq_rel.gpu.cas" and "ld.relaxed.gpu" in since_fence), orders
        assert not (order == "st.relaxed.gpu" and "atom.acq_rel.gpu.cas" in since_fence), orders
        since_fence.add(order)


def _build_for_gpu(folder: Path, arch: str, *defines: str) -> Path:
    """The fuzz with a GPU's blocks: its host side by the C compiler, its blocks' kernel by nvcc,
    linked by nvcc."""
    binary = folder / "persistent_fuzz_gpu"
    include = [f"-I{HEADER_DIR}", f"-I{FUZZ.parent}"]
    commands = [[NVCC, f"-arch={arch}", "-std=c++17", "-O2", "-Werror", "all-warnings", *defines, *include,
                 "-c", str(FUZZ_GPU), "-o", str(folder / "blocks.o")],
                ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-DFUZZ_GPU", *defines, *include,
                 "-c", str(FUZZ), "-o", str(folder / "host.o")],
                [NVCC, f"-arch={arch}", str(folder / "blocks.o"), str(folder / "host.o"), "-o", str(binary)]]
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr[-3000:]}"
    return binary


GPU_GRAPHS = GRAPHS + PIECES_GRAPHS


@NO_NVCC
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_fuzz_builds_with_a_gpus_blocks(arch, tmp_path):
    """What make gpu-check runs on a GPU (below) builds wherever nvcc is, warnings as errors."""
    assert _build_for_gpu(tmp_path, arch, *PIECES).exists()


@pytest.fixture(scope="module")
def gpu_fuzz(tmp_path_factory):
    """The fuzz with tasks of 1 to 6 pieces over a board of 2 entries, its blocks the GPU's."""
    if NVCC is None or shutil.which("cc") is None:
        pytest.skip("the GPU's fuzz needs nvcc and a C compiler (cc)")
    return _build_for_gpu(tmp_path_factory.mktemp("gpu_fuzz"), "native", *PIECES)


@needs_gpu
@pytest.mark.parametrize("graph", GPU_GRAPHS, ids=[NAME.format(*g) for g in GPU_GRAPHS])
@pytest.mark.parametrize("blocks", ["few", "resident"])
def test_on_a_gpus_blocks_every_task_runs_once_after_its_producers(gpu_fuzz, graph, blocks):
    """The host fuzz's graphs with the blocks a GPU's (few: the graph's own count; resident:
    every block the GPU holds at once, thousands of them racing for the queue, the board and
    the wiring lock), the words the host shares in mapped memory and the blocks' own in device
    memory: the PTX model's orders, not x86's, and a popped task's record (host-written)
    reached through the wirer's system-scope acquire, then GPU-scope releases and acquires."""
    seed, tasks, slots, count, fanin, window = graph
    done = _run(gpu_fuzz, seed, tasks, slots, count if blocks == "few" else 1 << 20, fanin, window)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith(f"ok: {tasks} tasks"), done.stdout
