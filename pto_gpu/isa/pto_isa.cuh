// What the CUDA code generated from PTO InCore functions (pto_gpu/isa/cuda_codegen.py) needs
// beyond its own text. The generator pastes this header at the top of every source it writes,
// so a generated .cu compiles alone (nvcc, NVRTC through CuPy, g++) and several of them can be
// pasted into one translation unit (the include guard below).
//
// The argument convention is pto_gpu/backends/cuda_abi.py's, written
// out by the generator: a memref is its pointer, three sizes, three element strides; a scalar
// is a double or a long long. T is the element type and ACC the type tiles are computed in,
// chosen when the module is compiled (-DPTO_T=float, -DPTO_T=double, or -DPTO_T=__half
// -DPTO_ACC=float -DPTO_HALF). PTO_WARPS (warps per block) is defined by the generated source
// from the backend's THREADS_PER_BLOCK.
//
// The host build (no __CUDACC__, used by the tests on machines without a GPU) runs the very
// same kernel text: each thread of a block is a std::thread with its own threadIdx, a block's
// threads run together so that __syncthreads(), __syncwarp() and the shuffles are real
// rendezvous (a mutex-and-condition barrier per block and per warp), __shared__ arrays are
// function statics (one block runs at a time), and pto_host_launch runs the blocks of a grid one
// after another. So the host build checks the generated code's indexing, valid regions,
// reductions across lanes and barrier placement, not a sequential rewrite of it; a missing
// rendezvous (a shuffle some lanes skip) deadlocks, which the barrier reports and aborts on.
#ifndef PTO_ISA_CUH
#define PTO_ISA_CUH

#ifndef PTO_T
#define PTO_T float
#endif
#ifndef PTO_ACC
#define PTO_ACC PTO_T
#endif
#ifndef PTO_WARPS
#define PTO_WARPS 8
#endif
#define PTO_THREADS (PTO_WARPS * 32)
#define PTO_FULL 0xffffffffu

#ifdef __CUDACC__  // nvcc, or NVRTC through CuPy (which has no <cmath>)
#ifdef PTO_HALF
#include <cuda_fp16.h>
#endif
#define PTO_INF __int_as_float(0x7f800000)
#define PTO_UNROLL _Pragma("unroll")
#define PTO_PRAGMA(text) _Pragma(#text)
#define PTO_UNROLL_BY(count) PTO_PRAGMA(unroll count)
// The opcode table's templates mix the tile type with double literals (fmax(x, 0.0)); these keep
// float tiles in float where nvcc would otherwise find only std's host-side template.
__device__ inline float fmax(float a, double b) { return fmaxf(a, (float)b); }
__device__ inline float fmin(float a, double b) { return fminf(a, (float)b); }
#else
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__) || !defined(__ELF__)
#define PTO_HOST_UCONTEXT  // where the switch below is not written: POSIX ucontext
#endif
#ifdef PTO_HOST_UCONTEXT
#include <ucontext.h>
#endif
#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(...)
#define PTO_INF INFINITY
#define PTO_UNROLL
#define PTO_UNROLL_BY(count)
#ifndef PTO_HOST_STACK
#define PTO_HOST_STACK (64 * 1024)  // bytes of stack per fiber, a PROT_NONE guard page below
#endif
using std::cos;
using std::exp;
using std::fabs;
using std::floor;
using std::fmax;
using std::fmin;
using std::log;
using std::sin;
using std::sqrt;
template <typename V>
inline V rsqrt(V x) { return V(1) / std::sqrt(x); }

// Plain globals, not thread_local: every fiber of a grid runs on the OS thread that launched it,
// under pto_host_grid, and the runner sets threadIdx on every switch.
struct PtoDim3 { unsigned x; };
inline PtoDim3 threadIdx, blockIdx, blockDim, gridDim;

#ifdef PTO_HOST_UCONTEXT
struct PtoHostContext { ucontext_t context; };
inline void pto_host_switch(PtoHostContext &save, PtoHostContext &load) {
    if (swapcontext(&save.context, &load.context) != 0) std::abort();
}
#else
// pto_host_fiber_switch(save, load): pushes the callee-saved registers (SysV x86-64) on this
// stack, stores the stack pointer in *save, then pops them from the stack at `load` and returns
// there. A local symbol: each library of generated code has its own. (swapcontext would do the
// same but also sets the signal mask, a system call per switch: several times slower here.)
asm(R"(
    .pushsection .text
    .p2align 4
    .type pto_host_fiber_switch, @function
pto_host_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pto_host_fiber_switch, .-pto_host_fiber_switch
    .popsection
)");
extern "C" void pto_host_fiber_switch(void **save, void *load);
struct PtoHostContext { void *stack; };
inline void pto_host_switch(PtoHostContext &save, PtoHostContext &load) {
    pto_host_fiber_switch(&save.stack, load.stack);
}
#endif

// A rendezvous of `count` fibers: it releases (its generation advances) when all have arrived.
struct PtoBarrier {
    int count = 0, arrived = 0;
    long long generation = 0;
};

struct PtoFiber {
    PtoHostContext context;
    const PtoBarrier *barrier;  // the one it waits at, if any
    long long generation;       // that barrier's generation when it arrived
    const char *where;          // what it waits at, for the deadlock report
    bool done;
};

// The fibers' stacks: mapped once per process (grown when a launch needs more or bigger ones)
// and reused by every launch and every library of generated code (an inline variable is one
// symbol for them all; it is only touched under pto_host_grid).
struct PtoHostStacks {
    unsigned char **bases;  // each: a guard page, then `size` bytes
    int count;
    size_t size, guard;
};
inline PtoHostStacks pto_host_stacks;

inline unsigned char *pto_host_stack_top(int index) {
    PtoHostStacks &stacks = pto_host_stacks;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t size = (PTO_HOST_STACK + page - 1) / page * page;
    if (size > stacks.size) {  // bigger ones wanted: map them all afresh
        for (int i = 0; i < stacks.count; ++i) munmap(stacks.bases[i], stacks.guard + stacks.size);
        stacks.count = 0;
        stacks.size = size;
        stacks.guard = page;
    }
    if (index >= stacks.count) {
        unsigned char **bases = (unsigned char **)std::realloc(stacks.bases, (index + 1) * sizeof *bases);
        if (bases == nullptr) std::abort();
        stacks.bases = bases;
        for (; stacks.count <= index; ++stacks.count) {
            void *base = mmap(nullptr, stacks.guard + stacks.size, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (base == MAP_FAILED || mprotect(base, stacks.guard, PROT_NONE) != 0) {
                std::fprintf(stderr, "pto_isa.cuh host build: cannot map a fiber's stack\n");
                std::abort();
            }
            stacks.bases[stacks.count] = (unsigned char *)base;
        }
    }
    return stacks.bases[index] + stacks.guard + stacks.size;  // page aligned
}

// One launch: a block's fibers, its barriers, and where the runner is.
struct PtoHostRun {
    PtoBarrier block, warps[PTO_WARPS];
    alignas(8) unsigned char lanes[2][PTO_THREADS][8];  // what each lane offers to a shuffle
    PtoFiber fibers[PTO_THREADS];
    PtoHostContext launcher;
    void (*body)(void *);  // calls the kernel
    void *kernel;
    long long block_index, round;
    int position;  // in this round's order
    int resumed;   // fibers resumed in this round
    int finished;
};
inline PtoHostRun *pto_host_run;

// The fiber at `position` of the current round: ascending thread index in even rounds (the
// block index counted in), descending in odd ones.
inline int pto_host_fiber_at(const PtoHostRun &run, int position) {
    return ((run.round + run.block_index) & 1) ? PTO_THREADS - 1 - position : position;
}

[[noreturn]] inline void pto_host_deadlock(const PtoHostRun &run) {
    std::fprintf(stderr, "pto_isa.cuh host build: block %lld of %u cannot go on: every thread left "
                         "waits at a rendezvous that some threads skipped or returned before "
                         "(a __syncthreads, __syncwarp or shuffle not reached by all):\n",
                 run.block_index, gridDim.x);
    for (int first = 0, last; first < PTO_THREADS; first = last + 1) {
        const PtoFiber &fiber = run.fibers[first];
        for (last = first; last + 1 < PTO_THREADS; ++last) {
            const PtoFiber &next = run.fibers[last + 1];
            if (next.done != fiber.done || (!fiber.done && (next.barrier != fiber.barrier ||
                                                            next.where != fiber.where)))
                break;
        }
        std::fprintf(stderr, "  threads %d-%d: ", first, last);
        if (fiber.done)
            std::fprintf(stderr, "returned\n");
        else if (fiber.barrier == &run.block)
            std::fprintf(stderr, "wait at %s (%d of %d threads arrived)\n", fiber.where,
                         fiber.barrier->arrived, fiber.barrier->count);
        else
            std::fprintf(stderr, "wait at %s of warp %d (%d of %d lanes arrived)\n", fiber.where,
                         (int)(fiber.barrier - run.warps), fiber.barrier->arrived, fiber.barrier->count);
    }
    std::abort();
}

// Leave the running fiber (which waits at a barrier, or is done) for the next runnable one in
// this round's order, starting the next round at the end of one. A round that resumed no fiber
// while some are unfinished is a deadlock.
inline void pto_host_yield() {
    PtoHostRun &run = *pto_host_run;
    PtoFiber &from = run.fibers[threadIdx.x];
    for (;;) {
        if (++run.position == PTO_THREADS) {
            if (run.resumed == 0) pto_host_deadlock(run);
            run.position = 0;
            run.resumed = 0;
            ++run.round;
        }
        const int next = pto_host_fiber_at(run, run.position);
        PtoFiber &fiber = run.fibers[next];
        if (fiber.done || (fiber.barrier != nullptr && fiber.barrier->generation == fiber.generation))
            continue;
        fiber.barrier = nullptr;
        ++run.resumed;
        if (&fiber != &from) {
            threadIdx.x = (unsigned)next;
            pto_host_switch(from.context, fiber.context);
        }
        return;
    }
}

// The running fiber arrives at `barrier` and yields; it goes on once all have arrived.
inline void pto_host_wait(PtoBarrier &barrier, const char *where) {
    PtoFiber &fiber = pto_host_run->fibers[threadIdx.x];
    fiber.barrier = &barrier;
    fiber.generation = barrier.generation;
    fiber.where = where;
    if (++barrier.arrived == barrier.count) {
        barrier.arrived = 0;
        ++barrier.generation;
    }
    pto_host_yield();
}

// Every fiber starts here (on its own stack) and never returns: the last one to finish resumes
// the launcher.
[[noreturn]] inline void pto_host_fiber_main() {
    PtoHostRun &run = *pto_host_run;
    run.body(run.kernel);
    run.fibers[threadIdx.x].done = true;
    if (++run.finished == PTO_THREADS) {
        PtoHostContext finished;
        pto_host_switch(finished, run.launcher);
    } else {
        pto_host_yield();
    }
    std::abort();  // a finished fiber is never resumed
}

// Each lane offers its value, all lanes of the warp meet, each reads its source lane's. The
// offers alternate between two buffers by the warp barrier's generation, so one rendezvous is
// enough: a lane that goes on to the next shuffle writes the other buffer, and cannot get to a
// third before every lane has read this one.
template <typename V>
inline V pto_host_exchange(V value, int source_lane, const char *where) {
    static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
    PtoHostRun &run = *pto_host_run;
    const int thread = (int)threadIdx.x, warp = thread / 32;
    PtoBarrier &barrier = run.warps[warp];
    unsigned char(&lanes)[PTO_THREADS][8] = run.lanes[barrier.generation & 1];
    std::memcpy(lanes[thread], &value, sizeof value);
    pto_host_wait(barrier, where);  // every lane has offered its value
    V got;
    std::memcpy(&got, lanes[warp * 32 + (source_lane & 31)], sizeof got);
    return got;
}

template <typename V>
inline V __shfl_xor_sync(unsigned, V value, int lane_mask) {
    return pto_host_exchange(value, (int)(threadIdx.x % 32) ^ lane_mask, "__shfl_xor_sync");
}
template <typename V>
inline V __shfl_sync(unsigned, V value, int source_lane) {
    return pto_host_exchange(value, source_lane, "__shfl_sync");
}
inline void __syncthreads() { pto_host_wait(pto_host_run->block, "__syncthreads"); }
inline void __syncwarp() { pto_host_wait(pto_host_run->warps[threadIdx.x / 32], "__syncwarp"); }

// One grid at a time in the process: the launch state, threadIdx and the rest, the stacks and the
// __shared__ statics are globals, and the CUDA emulator's streams launch from several threads.
// Inline variables are unique symbols, one for every library of generated code loaded, so this
// one mutex covers them all, as pto_host_run is one pointer for them all.
inline std::mutex pto_host_grid;

// Run `kernel` (a call of the __global__ function) over `blocks` blocks of PTO_THREADS fibers.
template <typename F>
inline void pto_host_launch(long long blocks, F kernel) {
    std::lock_guard<std::mutex> hold(pto_host_grid);
    std::unique_ptr<PtoHostRun> run(new PtoHostRun());
    run->block.count = PTO_THREADS;
    for (PtoBarrier &warp : run->warps) warp.count = 32;
    run->body = [](void *call) { (*static_cast<F *>(call))(); };
    run->kernel = &kernel;
    pto_host_run = run.get();
    gridDim.x = (unsigned)blocks;
    blockDim.x = PTO_THREADS;
    for (long long b = 0; b < blocks; ++b) {
        blockIdx.x = (unsigned)b;
        run->block_index = b;
        run->round = 0;
        run->position = 0;
        run->resumed = 1;
        run->finished = 0;
        for (int t = 0; t < PTO_THREADS; ++t) {
            PtoFiber &fiber = run->fibers[t];
            fiber.barrier = nullptr;
            fiber.done = false;
            unsigned char *top = pto_host_stack_top(t);
#ifdef PTO_HOST_UCONTEXT
            if (getcontext(&fiber.context.context) != 0) std::abort();
            fiber.context.context.uc_stack.ss_sp = top - pto_host_stacks.size;
            fiber.context.context.uc_stack.ss_size = pto_host_stacks.size;
            fiber.context.context.uc_link = nullptr;
            makecontext(&fiber.context.context, (void (*)())pto_host_fiber_main, 0);
#else
            // What pto_host_fiber_switch pops: six registers, then pto_host_fiber_main as the
            // address to return to, entered as if called (a return address of its own above).
            void **stack = (void **)top;
            *--stack = nullptr;
            *--stack = (void *)&pto_host_fiber_main;
            for (int i = 0; i < 6; ++i) *--stack = nullptr;
            fiber.context.stack = stack;
#endif
        }
        const int first = pto_host_fiber_at(*run, 0);
        threadIdx.x = (unsigned)first;
        pto_host_switch(run->launcher, run->fibers[first].context);
    }
    pto_host_run = nullptr;
}
#endif

using T = PTO_T;
using ACC = PTO_ACC;

// The rows (or cols) of a window of `size` wanted where `available` remain: never negative.
__device__ inline long long pto_clip(long long size, long long available) {
    return available < 0 ? 0 : (size < available ? size : available);
}

// SDIV: floor division, as the interpreter's numpy floor_divide.
__device__ inline long long pto_floordiv(long long a, long long b) {
    const long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ inline double pto_floordiv(double a, double b) { return floor(a / b); }

#endif  // PTO_ISA_CUH
