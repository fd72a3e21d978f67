// What the CUDA code generated from PTO InCore functions (pto_gpu/isa/cuda_codegen.py) needs
// beyond its own text. The generator pastes this header at the top of every source it writes,
// so a generated .cu compiles alone (nvcc, NVRTC through CuPy, g++) and several of them can be
// pasted into one translation unit (the include guard below; the part that depends on the
// element type has a guard of its own, which the persistent kernel's module undefines before
// each instance, so that each takes that part again in its namespace with its own type).
//
// The argument convention is pto_gpu/backends/cuda_abi.py's, written
// out by the generator: a memref is its pointer, three sizes, three element strides; a scalar
// is a double or a long long. T is the element type and ACC the type tiles are computed in,
// chosen when the module is compiled (-DPTO_T=float, -DPTO_T=double, -DPTO_T=__half
// -DPTO_ACC=float -DPTO_HALF, or -DPTO_T=__nv_bfloat16 -DPTO_ACC=float -DPTO_BF16), or by the
// persistent kernel's module per instance (the same macros, #defined in its text). PTO_WARPS
// (warps per block) is defined by the generated source from the backend's THREADS_PER_BLOCK.
//
// The host build (no __CUDACC__, used by the tests and the CUDA emulator on machines without a
// GPU) runs the very same kernel text. Each thread of a block is a fiber (its own stack, a
// cooperative context on the OS thread that launched the grid): a fiber runs until it reaches a
// rendezvous (__syncthreads(), __syncwarp(), a shuffle) or returns, then another one runs. A
// barrier (one per block, one per warp) releases when all its threads have arrived, and its
// fibers run on from there, so __syncthreads(), __syncwarp() and the shuffles (__shfl_sync,
// __shfl_xor_sync: values of up to 8 bytes) and the tensor-core product (pto_mma, below)
// are real rendezvous. The order is chosen to expose missing barriers: between two
// __syncthreads (a phase) the warps run one after another, each as far as it can go (to the
// block barrier, through its own __syncwarp and shuffles), in ascending warp order in even
// phases and descending in odd ones (odd blocks start descending);
// a warp runs its lanes one by one up to their next rendezvous (a round), in the phase's order in
// its first round and in the other order in each round after. So the code between two
// rendezvous runs thread after thread, in both orders: shared memory read in the same phase as
// another warp writes it, or a lane's value read without its warp's rendezvous, gives a wrong
// result, whichever side the writer is on. When no warp can go on and the block barrier has not
// released, it is a deadlock (threads that skip a __syncthreads, __syncwarp or shuffle, or
// return before one that others reach); lanes of a warp that meet at different rendezvous are
// a bug too: the runner names the threads and what they wait at on stderr and aborts, at once.
// threadIdx and blockIdx are plain globals that the runner sets on every switch; a block's
// dynamic shared memory (its tiles) is the launch's buffer, pto_dynamic_shared, and __shared__
// variables (the tests' own kernels) function statics (one block runs at a time);
// pto_host_launch runs the blocks of a
// grid one after another and one grid at a time in the process (a build with PTO_HOST_THREADS
// runs them side by side, each on a thread, all of these per thread: see pto_host_launch). The
// fibers' stacks are mapped once per process and reused: PTO_HOST_STACK bytes each (64 KiB; the generated kernels use
// about 1 KiB), each above a PROT_NONE guard page, so that an overflow faults rather than
// corrupts memory. On x86-64 ELF a fiber switch is the few instructions below; elsewhere, or
// with -DPTO_HOST_UCONTEXT, it is POSIX swapcontext (a system call per switch: a launch takes
// ~20x longer). So the host build checks the generated code's indexing, valid regions,
// reductions across lanes and barrier placement, not a sequential rewrite of it.
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

// How a generated kernel is declared (with the blocks an SM ptxas fits its registers to): a
// kernel of its own here; the persistent kernel's module defines PTO_PERSISTENT and this its own
// way (pto_persistent.cuh).
#ifndef PTO_PERSISTENT
#define PTO_ENTRY(blocks) extern "C" __global__ void __launch_bounds__(PTO_THREADS, blocks)
#endif
// Whether a kernel's products laid out for wgmma (those of a source that pastes pto_wgmma.cuh:
// cuda_codegen's Generator._wgmma) take it, rather than mma.sync: in a build for sm_90a, and in
// the host build that runs the GPU code as an H100 or H200 would (-DPTO_HOST_WGMMA: the CUDA
// emulator's emulate="gpu-code-sm90a"). Not in the persistent kernel's module, which CuPy builds
// for the device's plain arch (sm_90), its host build likewise.
#if (defined(__CUDA_ARCH_FEAT_SM90_ALL) || (!defined(__CUDACC__) && defined(PTO_HOST_WGMMA))) && \
    !defined(PTO_PERSISTENT)
#define PTO_WGMMA 1
#else
#define PTO_WGMMA 0
#endif
// A kernel's tiles in shared memory (name, dims): references into the block's dynamic shared
// memory, pto_dynamic_shared (below), at the offsets the generator gives them (multiples of 16:
// cuda_codegen's shared_offsets). The launch gives the bytes (CudaCode.shared_bytes), which may
// pass the 48 KiB that static shared memory is held to: the backend opts the function in
// (cuFuncSetAttribute). The persistent kernel's instances take turns in its one such memory.
#define PTO_SHARED(type, name, dims, offset) \
    type(&name) dims = *reinterpret_cast<type(*) dims>(pto_dynamic_shared + (offset))

#ifdef __CUDACC__  // nvcc, or NVRTC through CuPy (which has no <cmath>)
#if defined(PTO_HALF) || defined(PTO_WITH_HALF)
#include <cuda_fp16.h>
#endif
#if defined(PTO_BF16) || defined(PTO_WITH_BF16)
#include <cuda_bf16.h>
#endif
#define PTO_INF __int_as_float(0x7f800000)
#define PTO_UNROLL _Pragma("unroll")
#define PTO_PRAGMA(text) _Pragma(#text)
#define PTO_UNROLL_BY(count) PTO_PRAGMA(unroll count)
#if PTO_WGMMA  // wgmma's swizzled atoms are 1024-byte aligned (pto_wgmma.cuh)
extern __shared__ __align__(1024) unsigned char pto_dynamic_shared[];
#else
extern __shared__ __align__(16) unsigned char pto_dynamic_shared[];
#endif
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
#include <vector>
#include <unistd.h>
#ifdef PTO_HOST_THREADS
// Every header the build needs, before its symbols are hidden (below): a C header first read
// after that would declare the C library's functions hidden, and the link would fail.
#include <sched.h>
#include <stdint.h>
#include <system_error>
#include <thread>
#include <time.h>
#endif
#if !defined(__x86_64__) || !defined(__ELF__)
#define PTO_HOST_UCONTEXT  // where the switch below is not written: POSIX ucontext
#endif
#ifdef PTO_HOST_UCONTEXT
#include <ucontext.h>
#endif
#define __global__
#define __device__
#ifdef PTO_HOST_THREADS  // (below: blocks side by side)
#define __shared__ static thread_local
#else
#define __shared__ static
#endif
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

// Where the runner's state lives (threadIdx and the rest, the stacks, the launch): plain globals,
// not thread_local: every fiber of a grid runs on the OS thread that launched it, under
// pto_host_grid, and the runner sets threadIdx on every switch. A build whose blocks run side by
// side, each on an OS thread of its own (PTO_HOST_THREADS: the persistent kernel's module, whose
// blocks wait on one another's progress as a GPU's resident blocks do), keeps it, and its
// __shared__ memory, per thread, and its own: its symbols hidden, not the one state of the other
// libraries of generated code.
#ifdef PTO_HOST_THREADS
#pragma GCC visibility push(hidden)
#define PTO_HOST_STATE inline thread_local
#else
#define PTO_HOST_STATE inline
#endif
struct PtoDim3 { unsigned x; };
PTO_HOST_STATE PtoDim3 threadIdx, blockIdx, blockDim, gridDim;
// The running block's dynamic shared memory: the launch's bytes, set by pto_host_run_blocks.
PTO_HOST_STATE unsigned char *pto_dynamic_shared;
PTO_HOST_STATE unsigned pto_dynamic_shared_bytes;

#ifdef PTO_HOST_UCONTEXT
struct PtoHostContext { ucontext_t context; };
// getcontext returns twice to the function that calls it (-Wclobbered): not to the launcher.
__attribute__((noinline)) inline void pto_host_getcontext(ucontext_t *context) {
    if (getcontext(context) != 0) std::abort();
}
inline void pto_host_switch(PtoHostContext &save, PtoHostContext &load) {
    if (swapcontext(&save.context, &load.context) != 0) std::abort();
}
#else
// pto_host_fiber_switch(save, load): pushes the callee-saved registers (SysV x86-64) on this
// stack, stores the stack pointer in *save, then pops them from the stack at `load` and returns
// there. A local symbol: each library of generated code has its own. (swapcontext does the same
// and also saves and sets the signal mask, a system call per switch; the MXCSR and x87 control
// words are not switched here: kernels do not change them.)
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

// What a fiber waits at. A warp's lanes must all reach the same one (the warp barrier is one for
// __syncwarp and the shuffles).
enum PtoRendezvous {
    PTO_SYNCTHREADS, PTO_SYNCWARP, PTO_SHFL_SYNC, PTO_SHFL_XOR_SYNC, PTO_MMA_SYNC, PTO_LDMATRIX
};
inline const char *pto_rendezvous_name(int kind) {
    static const char *const names[] = {"__syncthreads", "__syncwarp", "__shfl_sync", "__shfl_xor_sync",
                                        "mma.sync", "ldmatrix"};
    return names[kind];
}

// A rendezvous of `count` fibers: it releases (its generation advances) when all have arrived.
struct PtoBarrier {
    int count = 0, arrived = 0;
    int kind = 0;  // what the fibers arrived so far wait at
    long long generation = 0;
};

struct PtoFiber {
    PtoHostContext context;
    const PtoBarrier *barrier;  // the one it waits at, if any
    long long generation;       // that barrier's generation when it arrived
    int kind;                   // what it waits at
    bool done;
};

// The fibers' stacks: mapped once per process (grown when a launch needs more or bigger ones)
// and reused by every launch and every library of generated code (an inline variable is one
// symbol for them all, so its layout is that of every build of this header loaded; it is only
// touched under pto_host_grid). Built with PTO_HOST_THREADS: each block thread's own, taken
// from and given back to the library's spares (pto_host_stacks_take, _release).
struct PtoHostStacks {
    unsigned char **bases;  // each: a guard page, then `size` bytes
    int count;
    size_t size, guard;
};
PTO_HOST_STATE PtoHostStacks pto_host_stacks;

// Stacks 0..count-1 mapped, each at least PTO_HOST_STACK bytes.
inline void pto_host_stacks_ready(int count) {
    PtoHostStacks &stacks = pto_host_stacks;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t size = (PTO_HOST_STACK + page - 1) / page * page;
    if (size > stacks.size) {  // bigger ones wanted: map them all afresh
        for (int i = 0; i < stacks.count; ++i) munmap(stacks.bases[i], stacks.guard + stacks.size);
        stacks.count = 0;
        stacks.size = size;
        stacks.guard = page;
    }
    if (count <= stacks.count) return;
    unsigned char **bases = (unsigned char **)std::realloc(stacks.bases, count * sizeof *bases);
    if (bases == nullptr) std::abort();
    stacks.bases = bases;
    for (; stacks.count < count; ++stacks.count) {
        void *base = mmap(nullptr, stacks.guard + stacks.size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED || mprotect(base, stacks.guard, PROT_NONE) != 0) {
            std::fprintf(stderr, "pto_isa.cuh host build: cannot map a fiber's stack\n");
            std::abort();
        }
        stacks.bases[stacks.count] = (unsigned char *)base;
    }
}

#ifdef PTO_HOST_THREADS
// The stacks of block threads that have ended, for the next ones: mapping and unmapping a
// block's 256 stacks took ~10 ms a launch. One pool for every such build loaded (these two,
// unlike the rest of its state, are not hidden, so g++ makes them one symbol, as it does the
// other builds' state): kept per library, the spares of a run's modules passed the process's
// limit of memory mappings.
inline std::mutex pto_host_spare_lock __attribute__((visibility("default")));
inline std::vector<PtoHostStacks> pto_host_spare_stacks __attribute__((visibility("default")));

inline void pto_host_stacks_take() {
    std::lock_guard<std::mutex> hold(pto_host_spare_lock);
    if (pto_host_stacks.count == 0 && !pto_host_spare_stacks.empty()) {
        pto_host_stacks = pto_host_spare_stacks.back();
        pto_host_spare_stacks.pop_back();
    }
}

inline void pto_host_stacks_release() {  // at a block thread's end
    std::lock_guard<std::mutex> hold(pto_host_spare_lock);
    pto_host_spare_stacks.push_back(pto_host_stacks);
    pto_host_stacks = PtoHostStacks{};
}
#endif

inline unsigned char *pto_host_stack_top(int index) {  // page aligned
    return pto_host_stacks.bases[index] + pto_host_stacks.guard + pto_host_stacks.size;
}

// What a lane brings to a tensor-core product: its fragments of A and B (pairs of 16-bit
// values, or TF32 values) and C.
struct PtoMmaOffer {
    unsigned a[4], b[2];
    float c[4];
};

// cp.async as the host build runs it (pto_copy8_async, pto_async_commit, pto_async_wait):
// a thread's copies land, in turn, at once or only when a wait needs their group (the earliest
// a GPU may make them visible and the latest), so code that reads a buffer before its wait, or
// copies into one that others still read, gets a wrong result here.
struct PtoAsyncCopy {
    void *to;
    const void *from;
    long long group;  // the thread's commits before it: its group
};
struct PtoAsyncThread {
    std::vector<PtoAsyncCopy> pending;  // not landed yet, in issue order
    long long committed = 0, issued = 0;
};

// wgmma as the host build runs it (pto_wgmma.cuh): a thread's instructions wait in its list for
// the wait of their group, when it computes its share of them.
struct PtoWgmmaIssue {
    float *d;
    int n;
    unsigned long long a, b;
    bool accumulate, transpose_b;
    long long group;  // the thread's commits before it
};
struct PtoWgmmaThread {
    std::vector<PtoWgmmaIssue> pending;
    long long committed = 0;
};

// A thread's wait for its groups (cp.async's, wgmma's): what it issued before its newest
// `in_flight` commits is done (`finish`, in issue order) and leaves the list; the rest stays.
template <typename Pending, typename Finish>
inline void pto_host_wait_groups(std::vector<Pending> &pending, long long committed, int in_flight, Finish finish) {
    size_t kept = 0;
    for (const Pending &item : pending) {
        if (item.group < committed - in_flight)
            finish(item);
        else
            pending[kept++] = item;
    }
    pending.resize(kept);
}

// One launch: a block's fibers, its barriers, and where the runner is.
struct PtoHostRun {
    PtoBarrier block, warps[PTO_WARPS];
    alignas(8) unsigned char lanes[2][PTO_THREADS][8];  // what each lane offers to a shuffle
    PtoMmaOffer mma[2][PTO_THREADS];                    // ... and to a product
    PtoFiber fibers[PTO_THREADS];
    PtoAsyncThread async[PTO_THREADS];
    PtoWgmmaThread wgmma[PTO_THREADS];
    PtoHostContext launcher;
    void (*body)(void *);  // calls the kernel
    void *kernel;
    long long block_index;
    int phase;          // of the block: its barrier's releases so far
    int warp_position;  // in this phase's order of warps
    int warp_round;     // of the warp in this phase: its rounds so far
    int lane_position;  // in this round's order of lanes
    int resumed;        // fibers resumed in this round
    int finished;
    bool released;  // the block barrier has just released: a phase starts
};
PTO_HOST_STATE PtoHostRun *pto_host_run;

// The fiber at the runner's position: warps in ascending order when the phase's number plus the
// block's index is even, descending when odd; a warp's lanes in the same order in its first
// round of a phase, then in the other order in each round after.
inline int pto_host_fiber_at(const PtoHostRun &run) {
    const int flip = (int)((run.phase + run.block_index) & 1);
    const int warp = flip ? PTO_WARPS - 1 - run.warp_position : run.warp_position;
    const int lane = ((flip + run.warp_round) & 1) ? 31 - run.lane_position : run.lane_position;
    return warp * 32 + lane;
}

[[noreturn]] inline void pto_host_mismatch(const PtoHostRun &run, const PtoBarrier &barrier, int kind) {
    int first = 0;
    while (run.fibers[first].barrier != &barrier || run.fibers[first].generation != barrier.generation) ++first;
    std::fprintf(stderr, "pto_isa.cuh host build: block %lld of %u: the lanes of warp %d meet at different "
                         "rendezvous: lane %d at %s, lane %u at %s (all lanes must reach the same "
                         "__syncwarp or shuffle)\n",
                 run.block_index, gridDim.x, (int)(&barrier - run.warps), first % 32,
                 pto_rendezvous_name(barrier.kind), threadIdx.x % 32, pto_rendezvous_name(kind));
    std::abort();
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
                                                            next.kind != fiber.kind)))
                break;
        }
        if (first == last)
            std::fprintf(stderr, "  thread %d: ", first);
        else
            std::fprintf(stderr, "  threads %d-%d: ", first, last);
        if (fiber.done)
            std::fprintf(stderr, "returned\n");
        else if (fiber.barrier == &run.block)
            std::fprintf(stderr, "wait at %s (%d of %d threads arrived)\n", pto_rendezvous_name(fiber.kind),
                         fiber.barrier->arrived, fiber.barrier->count);
        else
            std::fprintf(stderr, "wait at %s of warp %d (%d of %d lanes arrived)\n",
                         pto_rendezvous_name(fiber.kind),
                         (int)(fiber.barrier - run.warps), fiber.barrier->arrived, fiber.barrier->count);
    }
    std::abort();
}

// Leave the running fiber (which waits at a barrier, or is done) for the next runnable one: the
// next of its warp's lanes in this round's order, or the first of the next round of the warp, or,
// when a round of the warp resumed none (all its lanes wait at the block barrier, or are done, or
// the warp is stuck), the first lane of the next warp. A phase (the block barrier released)
// starts afresh from the first warp of its order. Past the last warp is a deadlock: no warp can
// go on and the block barrier has not released (the last fiber to finish never gets here).
inline void pto_host_yield() {
    PtoHostRun &run = *pto_host_run;
    PtoFiber &from = run.fibers[threadIdx.x];
    if (run.released) {
        run.released = false;
        ++run.phase;
        run.warp_position = 0;
        run.warp_round = 0;
        run.lane_position = -1;
        run.resumed = 0;
    }
    for (;;) {
        if (++run.lane_position == 32) {
            if (run.resumed == 0) {
                if (++run.warp_position == PTO_WARPS) pto_host_deadlock(run);
                run.warp_round = 0;
            } else {
                ++run.warp_round;
            }
            run.lane_position = 0;
            run.resumed = 0;
        }
        const int next = pto_host_fiber_at(run);
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
inline void pto_host_wait(PtoBarrier &barrier, int kind) {
    PtoHostRun &run = *pto_host_run;
    if (barrier.arrived == 0)
        barrier.kind = kind;
    else if (barrier.kind != kind)
        pto_host_mismatch(run, barrier, kind);
    PtoFiber &fiber = run.fibers[threadIdx.x];
    fiber.barrier = &barrier;
    fiber.generation = barrier.generation;
    fiber.kind = kind;
    if (++barrier.arrived == barrier.count) {
        barrier.arrived = 0;
        ++barrier.generation;
        if (&barrier == &run.block) run.released = true;
    }
    pto_host_yield();
}

// Every fiber starts here (on its own stack) and never returns: the last one to finish resumes
// the launcher.
[[noreturn]] inline void pto_host_fiber_main() {
    PtoHostRun &run = *pto_host_run;
    run.body(run.kernel);
    if (!run.async[threadIdx.x].pending.empty()) {  // copies into memory nothing reads after
        std::fprintf(stderr, "pto_isa.cuh host build: block %lld: thread %u ended with %zu cp.async copies it "
                             "never waited for (cp.async.wait_group)\n",
                     run.block_index, threadIdx.x, run.async[threadIdx.x].pending.size());
        std::abort();
    }
    if (!run.wgmma[threadIdx.x].pending.empty()) {  // accumulators nothing reads
        std::fprintf(stderr, "pto_isa.cuh host build: block %lld: thread %u ended with %zu wgmma it never "
                             "waited for (wgmma.wait_group)\n",
                     run.block_index, threadIdx.x, run.wgmma[threadIdx.x].pending.size());
        std::abort();
    }
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
inline V pto_host_exchange(V value, int source_lane, int kind) {
    static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
    PtoHostRun &run = *pto_host_run;
    const int thread = (int)threadIdx.x, warp = thread / 32;
    PtoBarrier &barrier = run.warps[warp];
    unsigned char(&lanes)[PTO_THREADS][8] = run.lanes[barrier.generation & 1];
    std::memcpy(lanes[thread], &value, sizeof value);
    pto_host_wait(barrier, kind);  // every lane has offered its value
    V got;
    std::memcpy(&got, lanes[warp * 32 + (source_lane & 31)], sizeof got);
    return got;
}

template <typename V>
inline V __shfl_xor_sync(unsigned, V value, int lane_mask) {
    return pto_host_exchange(value, (int)(threadIdx.x % 32) ^ lane_mask, PTO_SHFL_XOR_SYNC);
}
template <typename V>
inline V __shfl_sync(unsigned, V value, int source_lane) {
    return pto_host_exchange(value, source_lane, PTO_SHFL_SYNC);
}
inline void __syncthreads() { pto_host_wait(pto_host_run->block, PTO_SYNCTHREADS); }
inline void __syncwarp() { pto_host_wait(pto_host_run->warps[threadIdx.x / 32], PTO_SYNCWARP); }

// A tensor-core product's rendezvous: this lane offers its fragments of A, B and C, waits until
// its warp's lanes all have, and gets the warp's offers (alternating buffers, as the shuffles').
inline const PtoMmaOffer *pto_host_mma_offers(const unsigned a[4], const unsigned b[2], const float c[4]) {
    PtoHostRun &run = *pto_host_run;
    const int thread = (int)threadIdx.x, warp = thread / 32;
    PtoBarrier &barrier = run.warps[warp];
    PtoMmaOffer *offers = run.mma[barrier.generation & 1] + warp * 32;
    PtoMmaOffer &mine = offers[thread % 32];
    std::memcpy(mine.a, a, sizeof mine.a);
    std::memcpy(mine.b, b, sizeof mine.b);
    std::memcpy(mine.c, c, sizeof mine.c);
    pto_host_wait(barrier, PTO_MMA_SYNC);
    return offers;
}

// ldmatrix's rendezvous: this lane offers the address of a row, waits until its warp's lanes
// all have, and reads the warp's 32 (alternating buffers, as the shuffles').
inline void pto_host_rows(const void *row, const unsigned char *rows[32]) {
    PtoHostRun &run = *pto_host_run;
    const int thread = (int)threadIdx.x, warp = thread / 32;
    PtoBarrier &barrier = run.warps[warp];
    unsigned char(&lanes)[PTO_THREADS][8] = run.lanes[barrier.generation & 1];
    if ((uintptr_t)row % 16 != 0) {
        std::fprintf(stderr, "pto_isa.cuh host build: block %lld: ldmatrix: thread %d's row address %p "
                             "is not 16-byte aligned\n", run.block_index, thread, row);
        std::abort();
    }
    std::memcpy(lanes[thread], &row, sizeof row);
    pto_host_wait(barrier, PTO_LDMATRIX);
    for (int lane = 0; lane < 32; ++lane)
        std::memcpy(&rows[lane], lanes[warp * 32 + lane], sizeof rows[lane]);
}

// This lane's four elements of D from a rendezvous' offers: C(row, col) plus, over k < depth,
// product(row, col, k), in order; D's layout (row g or g + 8, columns 2t and 2t + 1 of
// lane 4g + t) is m16n8k16's and m16n8k8's alike.
template <typename Product>
inline void pto_host_mma_sum(float d[4], const PtoMmaOffer *offers, int depth, Product product) {
    const int lane = (int)threadIdx.x % 32, group = lane / 4, pair = 2 * (lane % 4);
    float result[4];
    for (int e = 0; e < 4; ++e) {
        const int row = group + 8 * (e / 2), col = pair + e % 2;
        float sum = offers[lane].c[e];
        for (int k = 0; k < depth; ++k) sum += product(row, col, k);
        result[e] = sum;
    }
    std::memcpy(d, result, sizeof result);
}

// The 16-bit element types of the host build, and their bits as a GPU rounds to them: those of
// the module's element types (PTO_HALF, PTO_BF16), or of the persistent kernel's instances
// (PTO_WITH_HALF, PTO_WITH_BF16: its module's instances may be of several, each taking the
// part of this header that depends on its element type, below, in a namespace of its own).
#if defined(PTO_HALF) || defined(PTO_WITH_HALF)
using __half = _Float16;  // g++ on x86-64: IEEE binary16, rounded to nearest even as on the GPU

inline unsigned short pto_host_half_bits(float value) {
    const _Float16 half = (_Float16)value;
    unsigned short bits;
    std::memcpy(&bits, &half, sizeof bits);
    return bits;
}

inline float pto_host_half_value(unsigned short bits) {
    _Float16 half;
    std::memcpy(&half, &bits, sizeof half);
    return (float)half;
}
#endif
#if defined(PTO_BF16) || defined(PTO_WITH_BF16)
// bfloat16 (g++ 12 has no arithmetic type for it): a float's top 16 bits, rounded to nearest
// even as __float2bfloat16_rn rounds (a NaN stays a NaN).
inline unsigned short pto_host_bf16_bits(float value) {
    unsigned bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float pto_host_bf16_value(unsigned short bits) {
    const unsigned wide = (unsigned)bits << 16;
    float value;
    std::memcpy(&value, &wide, sizeof value);
    return value;
}

struct __nv_bfloat16 {
    unsigned short bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float value) : bits(pto_host_bf16_bits(value)) {}
    __nv_bfloat16(double value) : bits(pto_host_bf16_bits((float)value)) {}
    operator float() const { return pto_host_bf16_value(bits); }
};
#endif

// cvt.rna.tf32.f32: a float rounded to TF32's 10 mantissa bits, to nearest with ties away from
// zero (the low 13 bits of the result zero); infinities and NaNs as they are.
inline unsigned pto_tf32(float value) {
    unsigned bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
    return (bits + 0x1000u) & 0xffffe000u;
}

// mma.sync.m16n8k8 of TF32 (see pto_mma_tf32 below) as a warp rendezvous, as pto_mma: each
// lane's four elements of D from the other lanes' A and B by the PTX fragment layout ("Matrix
// Fragments for mma.m16n8k8", .tf32). A product of two TF32 values is exact in a float.
inline void pto_mma_tf32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
    const PtoMmaOffer *offers = pto_host_mma_offers(a, b, c);
    pto_host_mma_sum(d, offers, 8, [offers](int row, int col, int k) {
        // A(row, k): lane 4 * (row % 8) + k % 4, register (row / 8) + 2 * (k / 4);
        // B(k, col): lane 4 * col + k % 4, register k / 4
        float left, right;
        std::memcpy(&left, &offers[4 * (row % 8) + k % 4].a[row / 8 + 2 * (k / 4)], sizeof left);
        std::memcpy(&right, &offers[4 * col + k % 4].b[k / 4], sizeof right);
        return left * right;
    });
}

// One grid at a time in the process: the launch state, threadIdx and the rest, the stacks, the
// dynamic shared memory's pointer and the __shared__ statics are globals, and the CUDA emulator's
// streams launch from several threads.
// Inline variables are unique symbols, one for every library of generated code loaded, so this
// one mutex covers them all, as pto_host_run is one pointer for them all. (A build with
// PTO_HOST_THREADS has its own state, per block thread, and does not take it.)
inline std::mutex pto_host_grid;

// Run blocks from..to-1 of `kernel`'s grid of `blocks` (a call of the __global__ function),
// each of PTO_THREADS fibers, one after another on this thread, with `shared` bytes of dynamic
// shared memory. Each block finds them all ones (NaN in every float type), as a GPU leaves
// shared memory as it was: a kernel that reads what it did not write gets no zeros by chance.
// The bytes are 1024-byte aligned, as wgmma's swizzled atoms (pto_wgmma.cuh) are, and 16 or
// more follow them.
template <typename F>
inline void pto_host_run_blocks(long long from, long long to, long long blocks, unsigned shared, F &kernel) {
    std::unique_ptr<unsigned char, void (*)(void *)> memory(
        (unsigned char *)std::aligned_alloc(1024, (shared + 16 + 1023) / 1024 * 1024), std::free);
    if (!memory) std::abort();
    pto_dynamic_shared = memory.get();
    pto_dynamic_shared_bytes = shared;
    std::unique_ptr<PtoHostRun> run(new PtoHostRun());
    run->block.count = PTO_THREADS;
    for (PtoBarrier &warp : run->warps) warp.count = 32;
    run->body = [](void *call) { (*static_cast<F *>(call))(); };
    run->kernel = &kernel;
    pto_host_stacks_ready(PTO_THREADS);
    pto_host_run = run.get();
    gridDim.x = (unsigned)blocks;
    blockDim.x = PTO_THREADS;
    for (long long b = from; b < to; ++b) {
        blockIdx.x = (unsigned)b;
        std::memset(pto_dynamic_shared, 0xff, shared);
        run->block_index = b;
        run->phase = 0;
        run->warp_position = 0;
        run->warp_round = 0;
        run->lane_position = 0;
        run->resumed = 1;
        run->finished = 0;
        run->released = false;
        for (int t = 0; t < PTO_THREADS; ++t) {
            PtoFiber &fiber = run->fibers[t];
            fiber.barrier = nullptr;
            fiber.done = false;
            run->async[t] = PtoAsyncThread{};
            run->wgmma[t] = PtoWgmmaThread{};
            unsigned char *top = pto_host_stack_top(t);
#ifdef PTO_HOST_UCONTEXT
            pto_host_getcontext(&fiber.context.context);
            fiber.context.context.uc_stack.ss_sp = top - pto_host_stacks.size;
            fiber.context.context.uc_stack.ss_size = pto_host_stacks.size;
            fiber.context.context.uc_link = nullptr;
            makecontext(&fiber.context.context, pto_host_fiber_main, 0);
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
        const int first = pto_host_fiber_at(*run);
        threadIdx.x = (unsigned)first;
        pto_host_switch(run->launcher, run->fibers[first].context);
    }
    pto_host_run = nullptr;
    pto_dynamic_shared = nullptr;
    pto_dynamic_shared_bytes = 0;
}

// Run `kernel` over `blocks` blocks with `shared` bytes of dynamic shared memory each: one after
// another, or, built with PTO_HOST_THREADS, side by side, each on a thread of its own (as many as
// start: a block that cannot leaves its share of the grid's work to the others, which a
// persistent kernel's blocks take from one queue).
template <typename F>
inline void pto_host_launch(long long blocks, unsigned shared, F kernel) {
#ifdef PTO_HOST_THREADS
    std::vector<std::thread> threads;
    try {
        for (long long b = 0; b < blocks; ++b)
            threads.emplace_back([&kernel, b, blocks, shared] {
                pto_host_stacks_take();
                pto_host_run_blocks(b, b + 1, blocks, shared, kernel);
                pto_host_stacks_release();
            });
    } catch (const std::system_error &) {
        if (threads.empty()) std::abort();  // not one block: nothing would run the grid
    }
    for (std::thread &thread : threads) thread.join();
#else
    std::lock_guard<std::mutex> hold(pto_host_grid);
    pto_host_run_blocks(0, blocks, blocks, shared, kernel);
#endif
}
#endif

#endif  // PTO_ISA_CUH

// What follows depends on the element type (T, ACC; PTO_HALF or PTO_BF16 for the 16-bit ones).
// A generated source takes it once, as the rest; the persistent kernel's module, whose
// instances may be of several element types, has each take it again in its own namespace with
// its own PTO_T (persistent_module.py): so nothing here may be a macro that differs by type
// without being undefined first, or a definition outside the namespace it is read in.
#ifndef PTO_ISA_TYPED
#define PTO_ISA_TYPED
using T = PTO_T;
using ACC = PTO_ACC;

#if !defined(__CUDACC__) && (defined(PTO_HALF) || defined(PTO_BF16))
// T's bits, rounded as a GPU rounds to it, and back (the host build's products).
#ifdef PTO_HALF
inline unsigned short pto_host_bits(float value) { return pto_host_half_bits(value); }
inline float pto_host_value(unsigned short bits) { return pto_host_half_value(bits); }
#else
inline unsigned short pto_host_bits(float value) { return pto_host_bf16_bits(value); }
inline float pto_host_value(unsigned short bits) { return pto_host_bf16_value(bits); }
#endif

// mma.sync.m16n8k16 (see pto_mma below) as a warp rendezvous: each lane offers its fragments
// (alternating buffers, as the shuffles' offers), and once all have, computes its own four
// elements of D from the other lanes' A and B by the PTX fragment layout (the PTX ISA's "Matrix
// Fragments for mma.m16n8k16 with floating point type"). So generated code that puts an element
// in the wrong lane or register gets a wrong product here, as on a GPU.
inline void pto_mma(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
    const PtoMmaOffer *offers = pto_host_mma_offers(a, b, c);
    pto_host_mma_sum(d, offers, 16, [offers](int row, int col, int k) {
        // A(row, k): lane 4 * (row % 8) + (k % 8) / 2, register (row / 8) + 2 * (k / 8);
        // B(k, col): lane 4 * col + (k % 8) / 2, register k / 8; the half k % 2 of the pair
        const unsigned left = offers[4 * (row % 8) + (k % 8) / 2].a[row / 8 + 2 * (k / 8)];
        const unsigned right = offers[4 * col + (k % 8) / 2].b[k / 8];
        return pto_host_value((unsigned short)(left >> (16 * (k % 2)))) *
               pto_host_value((unsigned short)(right >> (16 * (k % 2))));
    });
}

inline unsigned pto_pack_pair(float low, float high) {
    return (unsigned)pto_host_bits(low) | ((unsigned)pto_host_bits(high) << 16);
}
#endif

#ifdef __CUDACC__
// One mma.sync `instruction` (its shape and types) over a warp's fragments: D, four floats, from
// A's four registers, B's two and C's four floats (pto_mma's and pto_mma_tf32's operands).
#define PTO_MMA_ASM(instruction, d, a, b, c)                                                         \
    asm volatile(instruction " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),                 \
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]))
#endif

#if defined(__CUDACC__) && (defined(PTO_HALF) || defined(PTO_BF16))
#undef PTO_MMA_INPUTS
#ifdef PTO_HALF
#define PTO_MMA_INPUTS "f16.f16"
__device__ inline unsigned pto_bits(float value) { return __half_as_ushort(__float2half_rn(value)); }
#else
#define PTO_MMA_INPUTS "bf16.bf16"
__device__ inline unsigned pto_bits(float value) { return __bfloat16_as_ushort(__float2bfloat16_rn(value)); }
#endif

// Two floats as a pair of T in one register, `low` in the low 16 bits (as mma.sync reads them).
__device__ inline unsigned pto_pack_pair(float low, float high) { return pto_bits(low) | (pto_bits(high) << 16); }

// D = A * B + C on a warp's tensor cores: A 16 x 16 of T (row major), B 16 x 8 (column major),
// C and D 16 x 8 floats. Lane 4 * g + t holds A(g, 2t..2t+1), A(g + 8, ..), A(g, 2t + 8..),
// A(g + 8, 2t + 8..) in a[0..3]; B(2t..2t+1, g), B(2t + 8.., g) in b[0..1]; C and D (g, 2t),
// (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Every lane of the warp must call it together.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
// Older GPUs have no such instruction: a kernel with a 16-bit product does not compile for them
// (one without compiles: the assertion fires only where the template is instantiated).
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_mma(float[4], const unsigned[4], const unsigned[2], const float[4]) {
    static_assert(Arch >= 800, "float16 and bfloat16 tile products run on tensor cores (mma.sync.m16n8k16): "
                               "sm_80 or newer");
}
#else
__device__ inline void pto_mma(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
#ifdef __CUDA_ARCH__  // (nvcc's host pass sees an empty body)
    PTO_MMA_ASM("mma.sync.aligned.m16n8k16.row.col.f32." PTO_MMA_INPUTS ".f32", d, a, b, c);
#endif
}
#endif
#endif

// TEXP, computed in ACC. A 16-bit kernel's exp is the fast one, ex2.approx of x log2(e) (results
// below float's normal range flush to 0): within 2 + 1.17 |x| ulps of float (the CUDA guide's
// bound for __expf: 2^-18.7 relative where |x| <= 16, 2^-16.3 at 88), far inside the rounding to T
// its results take when stored or multiplied, 2^-11 (float16) or 2^-8 (bfloat16), as
// FlashAttention-2's scores take it. Other types keep exp; the host build has exp for all.
#if defined(__CUDACC__) && (defined(PTO_HALF) || defined(PTO_BF16))
__device__ inline float pto_exp(float x) { return __expf(x); }
#else
__device__ inline float pto_exp(float x) { return exp(x); }
#endif
__device__ inline double pto_exp(double x) { return exp(x); }

#if defined(PTO_HALF) || defined(PTO_BF16)
// Tensor-core operands kept in shared memory as T (cuda_codegen's packed tiles): a fragment
// register is two neighbouring elements of T, the lower index in the low 16 bits, taken as their
// bits with no conversion (pto_pair).
__device__ inline unsigned pto_element_bits(T value) {
#if defined(__CUDACC__) && defined(PTO_HALF)
    return __half_as_ushort(value);
#elif defined(__CUDACC__)
    return __bfloat16_as_ushort(value);
#else
    unsigned short bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
#endif
}

__device__ inline unsigned pto_pair(T low, T high) {
    return pto_element_bits(low) | (pto_element_bits(high) << 16);
}

// 8 elements (16 bytes, both addresses 16-byte aligned) copied in one load and one store: a row
// of a packed tile loaded 8 columns at a time.
__device__ inline void pto_copy8(T *to, const T *from) {
#ifdef __CUDACC__
    *reinterpret_cast<uint4 *>(to) = *reinterpret_cast<const uint4 *>(from);
#else
    if ((uintptr_t)to % 16 != 0 || (uintptr_t)from % 16 != 0) {  // a GPU faults on it
        std::fprintf(stderr, "pto_isa.cuh host build: a 16-byte copy from %p to %p: not 16-byte aligned\n",
                     (const void *)from, (void *)to);
        std::abort();
    }
    std::memcpy(to, from, 8 * sizeof(T));
#endif
}

// cp.async.cg.shared.global of 16 bytes (8 elements, both addresses 16-byte aligned): the copy
// runs while the thread goes on, and lands by the thread's wait for its group. A thread's copies
// since its last commit are one group (pto_async_commit); pto_async_wait<Pending> waits until at
// most its own newest Pending groups are in flight. Other threads see what landed after a barrier.
#ifdef __CUDACC__
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_copy8_async(T *, const T *) {
    static_assert(Arch >= 800, "copies that overlap tensor-core products (cp.async): sm_80 or newer");
}
#else
__device__ inline void pto_copy8_async(T *to, const T *from) {
#ifdef __CUDA_ARCH__
    asm volatile("{ .reg .u64 g, d; .reg .u32 s; cvta.to.shared.u64 d, %0; cvt.u32.u64 s, d;\n\t"
                 "cvta.to.global.u64 g, %1; cp.async.cg.shared.global [s], [g], 16; }"
                 :
                 : "l"(to), "l"(from)
                 : "memory");
#endif
}
#endif
__device__ inline void pto_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int Pending>
__device__ inline void pto_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
#endif
}
#else
inline void pto_copy8_async(T *to, const T *from) {
    PtoAsyncThread &mine = pto_host_run->async[threadIdx.x];
    if ((uintptr_t)to % 16 != 0 || (uintptr_t)from % 16 != 0) {  // a GPU faults on it
        std::fprintf(stderr, "pto_isa.cuh host build: cp.async of 16 bytes from %p to %p: not 16-byte aligned\n",
                     (const void *)from, (void *)to);
        std::abort();
    }
    // in turn by the thread's copies, its groups and its index: each tile's copies of an
    // iteration land some at once and some late, whatever a thread's share of them
    if ((mine.issued++ + mine.committed + threadIdx.x) % 2 == 0)
        std::memcpy(to, from, 8 * sizeof(T));
    else
        mine.pending.push_back({to, from, mine.committed});
}
inline void pto_async_commit() { ++pto_host_run->async[threadIdx.x].committed; }
template <int Pending>
inline void pto_async_wait() {
    PtoAsyncThread &mine = pto_host_run->async[threadIdx.x];
    pto_host_wait_groups(mine.pending, mine.committed, Pending,
                         [](const PtoAsyncCopy &copy) { std::memcpy(copy.to, copy.from, 8 * sizeof(T)); });
}
#endif

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8 x 8 matrices of T in shared memory
// into fragment registers. Lane l gives `row`, the address (16-byte aligned) of row l % 8 of
// matrix l / 8; it gets in r[q] two elements of matrix q: row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 (pto_ldmatrix), or with the matrix transposed, rows 2 (l % 4) and 2 (l % 4) + 1
// of column l / 4 (pto_ldmatrix_trans); the first in the low half. Every lane of the warp
// must call it together. The row as a pointer, or (pto_ldmatrix_at, _trans_at) as an address
// in shared memory taken once (pto_shared_address) and stepped by bytes in a product's loop
// over k: 32-bit adds on a GPU, where a generic row address cost a 64-bit multiply and add and
// a conversion for each ldmatrix. On the host, a rendezvous at which the lanes exchange their
// addresses (pto_host_rows), and a shared address is the row's pointer.
#ifdef __CUDACC__
typedef unsigned pto_shared_t;
__device__ inline pto_shared_t pto_shared_address(const T *row) {
    return (pto_shared_t)__cvta_generic_to_shared(row);
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_ldmatrix(unsigned[4], const T *) {
    static_assert(Arch >= 800, "16-bit tile products run on tensor cores: sm_80 or newer");
}
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_ldmatrix_trans(unsigned[4], const T *) {
    static_assert(Arch >= 800, "16-bit tile products run on tensor cores: sm_80 or newer");
}
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_ldmatrix_at(unsigned[4], pto_shared_t) {
    static_assert(Arch >= 800, "16-bit tile products run on tensor cores: sm_80 or newer");
}
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_ldmatrix_trans_at(unsigned[4], pto_shared_t) {
    static_assert(Arch >= 800, "16-bit tile products run on tensor cores: sm_80 or newer");
}
#else
#define PTO_LDMATRIX_ASM(instruction, r, address)                                 \
    asm volatile(instruction " {%0, %1, %2, %3}, [%4];"                           \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                 \
                 : "r"(address))
__device__ inline void pto_ldmatrix_at(unsigned r[4], pto_shared_t address) {
#ifdef __CUDA_ARCH__
    PTO_LDMATRIX_ASM("ldmatrix.sync.aligned.m8n8.x4.shared.b16", r, address);
#endif
}
__device__ inline void pto_ldmatrix_trans_at(unsigned r[4], pto_shared_t address) {
#ifdef __CUDA_ARCH__
    PTO_LDMATRIX_ASM("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", r, address);
#endif
}
__device__ inline void pto_ldmatrix(unsigned r[4], const T *row) { pto_ldmatrix_at(r, pto_shared_address(row)); }
__device__ inline void pto_ldmatrix_trans(unsigned r[4], const T *row) {
    pto_ldmatrix_trans_at(r, pto_shared_address(row));
}
#endif
#else
typedef const unsigned char *pto_shared_t;
inline pto_shared_t pto_shared_address(const T *row) { return (pto_shared_t)row; }
inline void pto_ldmatrix(unsigned r[4], const T *row) {
    const unsigned char *rows[32];
    pto_host_rows(row, rows);
    const int lane = (int)threadIdx.x % 32;
    for (int q = 0; q < 4; ++q)
        std::memcpy(&r[q], rows[8 * q + lane / 4] + 2 * (lane % 4) * sizeof(T), sizeof r[q]);
}
inline void pto_ldmatrix_trans(unsigned r[4], const T *row) {
    const unsigned char *rows[32];
    pto_host_rows(row, rows);
    const int lane = (int)threadIdx.x % 32;
    for (int q = 0; q < 4; ++q) {
        const T *low = (const T *)rows[8 * q + 2 * (lane % 4)];
        const T *high = (const T *)rows[8 * q + 2 * (lane % 4) + 1];
        r[q] = pto_pair(low[lane / 4], high[lane / 4]);
    }
}
inline void pto_ldmatrix_at(unsigned r[4], pto_shared_t address) { pto_ldmatrix(r, (const T *)address); }
inline void pto_ldmatrix_trans_at(unsigned r[4], pto_shared_t address) {
    pto_ldmatrix_trans(r, (const T *)address);
}
#endif
#endif

#ifdef __CUDACC__
// TF32 products (a float32 function that says tf32, or a run with precision="tf32"): each
// operand element rounded by cvt.rna.tf32.f32, then D = A * B + C with A 16 x 8 (row major),
// B 8 x 8 (column major), C and D 16 x 8 floats. Lane 4 * g + t holds A(g, t), A(g + 8, t),
// A(g, t + 4), A(g + 8, t + 4) in a[0..3]; B(t, g), B(t + 4, g) in b[0..1]; C and D as pto_mma's.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
template <int Arch = __CUDA_ARCH__>
__device__ inline unsigned pto_tf32(float) {
    static_assert(Arch >= 800, "TF32 tile products run on tensor cores (mma.sync.m16n8k8): sm_80 or newer");
    return 0;
}
template <int Arch = __CUDA_ARCH__>
__device__ inline void pto_mma_tf32(float[4], const unsigned[4], const unsigned[2], const float[4]) {
    static_assert(Arch >= 800, "TF32 tile products run on tensor cores (mma.sync.m16n8k8): sm_80 or newer");
}
#else
__device__ inline unsigned pto_tf32(float value) {
    unsigned bits = 0;
#ifdef __CUDA_ARCH__
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(value));
#endif
    return bits;
}
__device__ inline void pto_mma_tf32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
#ifdef __CUDA_ARCH__
    PTO_MMA_ASM("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", d, a, b, c);
#endif
}
#endif
#endif

// The rows (or cols) of a window of `size` wanted where `available` remain: never negative.
__device__ inline long long pto_clip(long long size, long long available) {
    return available < 0 ? 0 : (size < available ? size : available);
}

// SDIV: floor division, as the interpreter's numpy floor_divide: an int by 0 is 0 (in C, and on
// the host build's x86, a trap), the least int by -1 wraps; a float's quotient is numpy's
// npy_divmod's (floor(a / b) is not: 1.0 // 0.1 is 9, where 1.0 / 0.1 rounds to 10).
__device__ inline long long pto_floordiv(long long a, long long b) {
    if (b == 0) return 0;
    if (b == -1) return (long long)(0ull - (unsigned long long)a);
    const long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ inline double pto_floordiv(double a, double b) {
    if (b == 0) return a / b;
    const double mod = fmod(a, b);
    double quotient = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) quotient -= 1.0;
    if (quotient == 0) return copysign(0.0, a / b);
    const double whole = floor(quotient);
    return quotient - whole > 0.5 ? whole + 1.0 : whole;
}

#endif  // PTO_ISA_TYPED
