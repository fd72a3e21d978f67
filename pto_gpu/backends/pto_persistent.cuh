// The persistent kernel's module (executor="persistent"), the part before its instances. Its
// blocks take the tasks the host streams in
// and run each by calling the generated code of its kernel instance, until the host closes the
// run. persistent_module.py writes the module around this text:
//
//   #define PTO_WARPS, PTO_PERSISTENT, PTO_HOST_THREADS (the host build's blocks side by side,
//   pto_isa.cuh), PTO_WITH_HALF and PTO_WITH_BF16 where an instance is of that type (its
//   header, its host build's type), PTO_ISA_TYPED (pto_isa.cuh's part that depends on the
//   element type is each instance's, below), PTO_TASK_SHARED_BYTES (the dynamic shared memory
//   the instances' tiles take turns in: the most any instance takes, and room for thread 0's
//   words) and PTO_LAUNCH_SHARED_BYTES (what the launch gives a block: that, then the piece
//   words below)
//   pto_isa.cuh, persistent_protocol.h, then this file: how the instances are declared
//   for each instance: #undef PTO_ISA_TYPED and the type macros, #define its PTO_T, PTO_ACC
//   (and PTO_HALF or PTO_BF16), then
//   namespace pto_instance_<k> { <instance k's generated source> }
//   pto_run_task: a switch over the instances
//   pto_persistent_kernel.cuh: the kernel, and its host build's entry
//
// Each generated source is pasted whole: of its copy of pto_isa.cuh, the part that depends on
// the element type is taken again in its namespace, with its type (instances of several types
// run in one kernel), and the rest skipped (include guard); its kernel becomes a device
// function (PTO_ENTRY), its tiles in shared memory are references
// into the block's dynamic shared memory at the offsets the generator gave them (PTO_SHARED,
// pto_isa.cuh), so the instances take turns in it instead of adding up, and PTO_TASK makes its
// `pto_task(words)`, which reads the task's argument words as its params.
//
// A task runs as the pieces its stream launch's grid would have been blocks: piece p on a
// block with blockIdx.x = p and gridDim.x = pieces as its code sees them (the macros below;
// the generated kernels loop over their work items by grid strides). Pieces of one task may run
// on several blocks side by side, or one after another on one (the protocol's board).
//
// Thread 0 of a block speaks for it in the protocol (persistent_protocol.h): it takes work (a
// task, or a piece of one) for the block (pto_block_next_work, where the block's threads also
// copy the records the host has published into device memory when it is their turn to wire),
// the block's threads run it from its staged record, then thread 0 makes the block's writes
// visible at GPU scope (__threadfence) and, for the task's last piece, completes it (a
// successor it makes ready the block runs next; the host sees the completion behind a
// system-scope release, after the successors); barriers between each step. Per block,
// `running[block]` is the ticket + 1 of the task it runs (0 between tasks): what the host
// names when the kernel dies in a fault.
#ifndef PTO_PERSISTENT_CUH
#define PTO_PERSISTENT_CUH

#ifndef __CUDACC__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#endif

#define PTO_ENTRY(blocks) static __device__ __forceinline__ void
#define PTO_TASK __device__ __noinline__ void pto_task

// A task's argument word as its param's type, bit for bit (a pointer, a long long, a double):
// loaded whole, then its bits moved (a memcpy from the word itself was 8 byte loads a word).
template <typename V>
__device__ inline V pto_word(const long long *word) {
    static_assert(sizeof(V) == sizeof(long long), "a word is 8 bytes");
    const long long whole = *word;
    V value;
    memcpy(&value, &whole, sizeof value);
    return value;
}

// The block and grid a task's code sees: the piece of the task the block runs, of how many
// (pto_persistent_kernel.cuh). Words of the dynamic shared memory past the instances' tiles, so
// that all the module's shared memory is the launch's: a static word would count against the
// 48 KiB a launch may give a function not opted in.
struct PtoPiece {
    unsigned x;
};
static_assert(PTO_LAUNCH_SHARED_BYTES >= PTO_TASK_SHARED_BYTES + 2 * sizeof(PtoPiece), "room for the pieces");
#define pto_piece_index (reinterpret_cast<PtoPiece *>(pto_dynamic_shared + PTO_TASK_SHARED_BYTES)[0])
#define pto_piece_count (reinterpret_cast<PtoPiece *>(pto_dynamic_shared + PTO_TASK_SHARED_BYTES)[1])
__device__ inline unsigned pto_block_index() { return blockIdx.x; }
#define blockIdx pto_piece_index
#define gridDim pto_piece_count

#endif  // PTO_PERSISTENT_CUH

