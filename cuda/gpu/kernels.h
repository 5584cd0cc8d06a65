// The CUDA build of the device code, as the host runtime calls it.
#pragma once

#include <cuda_runtime.h>

#include "../channel.h"
#include "../p2p.h"

namespace mncl::dev {

// The most channels (blocks) one GPU operation runs on. The work items travel as a kernel
// argument (no copy to the device before each launch, and a CUDA graph captures them).
constexpr int kMaxGpuChannels = 32;
// The most ranks one launch runs: ranks of one GPU that a group drives from one thread run in
// a single kernel (see GpuBlocks).
constexpr int kMaxFusedRanks = 8;
// Threads per block. The kernels are compiled for it (__launch_bounds__), which caps their
// registers so that a block of this size always fits on an SM.
constexpr int kGpuThreads = 512;

// What each block of a collective launch runs: channel `channel[b]` of the launch's rank
// `rank[b]`, on work item `work[b]`. One rank's channels in order, or (fused) the channels of
// several ranks of this GPU that one group calls together: they then start together in one
// launch, without a stream per rank to fork and join.
struct GpuBlocks {
  DevChannel* channels[kMaxFusedRanks];  // per rank: device memory, persistent across launches
  DevError* errors[kMaxFusedRanks];      // per rank: host-mapped, one record per channel
  // Per rank: its channels' arrays (ChannelArrays), channel c's at + c * arraysStride.
  char* arrays[kMaxFusedRanks];
  uint32_t arraysStride;
  uint8_t rank[kMaxGpuChannels];
  uint8_t channel[kMaxGpuChannels];
  DevWork work[kMaxGpuChannels];  // byte counts for copy-only collectives
  // Shared memory each block holds its channel's arrays in for the launch (ChannelArrays::bytes
  // for its rank count; the launch asks for that much); 0: the block works on device memory.
  uint32_t cachedArraysBytes;
};
// Channels whose arrays take more stay in device memory (many ranks).
constexpr uint32_t kMaxCachedArraysBytes = 32 << 10;
static_assert(sizeof(GpuBlocks) + 64 <= 4096, "kernel arguments are limited to 4 KiB");

struct GpuLaunch {
  GpuBlocks blocks;
  int nBlocks, nThreads, nranks;
  cudaStream_t stream;
  // A launch whose every block runs direct LL (small operations) uses the kernel of that one
  // path instead of its protocol's (see DirectLLOnly in dispatch.h); false: always the protocol's.
  bool pathKernels = true;
};

cudaError_t launchCollective(const GpuLaunch& l, Coll coll, DataType dtype, RedOp op);
// A premulsum on a single rank (w: see mncl::workWithoutPeers): recv = send times the scalar.
cudaError_t launchPreMulSumAlone(const DevWork& w, cudaStream_t stream);

// A group's sends and receives on one communicator: channel c runs ops[first[c], first[c+1]).
// (At most kMaxGpuP2pOps, see p2p.h.)
struct GpuP2pWorks {
  int16_t first[kMaxGpuChannels + 1];
  P2pOp ops[kMaxGpuP2pOps];
};
static_assert(sizeof(GpuP2pWorks) + 64 <= 4096, "kernel arguments are limited to 4 KiB");

struct GpuP2pLaunch {
  DevChannel* channels;
  GpuP2pWorks works;
  DevError* errors;
  int nChannels, nThreads;
  cudaStream_t stream;
};

cudaError_t launchP2p(const GpuP2pLaunch& l);

// Makes every kernel instance loaded on the current device (see gpu::preloadKernels).
cudaError_t preloadKernels();

// The (reduction, type) kernel instances: each is a translation unit of its own (see
// CMakeLists.txt), so a build spreads them over every core. Signed sums, products and
// premulsums run as their unsigned twins, bitwise ops on bytes, a float avg as a premulsum
// (mncl::asRun); MININCL_CUDA_QUICK leaves out every float but float32.
#define MNCL_KERNEL_NAME_(op, type) launch_##op##_##type
#define MNCL_KERNEL_NAME(op, type) MNCL_KERNEL_NAME_(op, type)
#define MNCL_KERNEL_PRELOAD_(op, type) preload_##op##_##type
#define MNCL_KERNEL_PRELOAD(op, type) MNCL_KERNEL_PRELOAD_(op, type)
#define MNCL_KERNEL_ALONE_(op, type) alone_##op##_##type
#define MNCL_KERNEL_ALONE(op, type) MNCL_KERNEL_ALONE_(op, type)
#define MNCL_KERNEL_CTYPE_i8 int8_t
#define MNCL_KERNEL_CTYPE_u8 uint8_t
#define MNCL_KERNEL_CTYPE_i32 int32_t
#define MNCL_KERNEL_CTYPE_u32 uint32_t
#define MNCL_KERNEL_CTYPE_i64 int64_t
#define MNCL_KERNEL_CTYPE_u64 uint64_t
#define MNCL_KERNEL_CTYPE_f16 half_t
#define MNCL_KERNEL_CTYPE_bf16 bfloat16_t
#define MNCL_KERNEL_CTYPE_f32 float
#define MNCL_KERNEL_CTYPE_f64 double
#define MNCL_KERNEL_CTYPE_f8e4m3 fp8e4m3_t
#define MNCL_KERNEL_CTYPE_f8e5m2 fp8e5m2_t
#define MNCL_KERNEL_CTYPE_(type) MNCL_KERNEL_CTYPE_##type
#define MNCL_KERNEL_CTYPE(type) MNCL_KERNEL_CTYPE_(type)
#define MNCL_KERNEL_FUNC_sum FuncSum
#define MNCL_KERNEL_FUNC_prod FuncProd
#define MNCL_KERNEL_FUNC_max FuncMax
#define MNCL_KERNEL_FUNC_min FuncMin
#define MNCL_KERNEL_FUNC_avg FuncAvg
#define MNCL_KERNEL_FUNC_premulsum FuncPreMulSum
#define MNCL_KERNEL_FUNC_band FuncBitAnd
#define MNCL_KERNEL_FUNC_bor FuncBitOr
#define MNCL_KERNEL_FUNC_bxor FuncBitXor
#define MNCL_KERNEL_FUNC_(op) MNCL_KERNEL_FUNC_##op
#define MNCL_KERNEL_FUNC(op) MNCL_KERNEL_FUNC_(op)

#if defined(MININCL_CUDA_QUICK)
#define MNCL_KERNEL_FLOATS(X, op) X(op, f32)
#else
#define MNCL_KERNEL_FLOATS(X, op) X(op, f16) X(op, bf16) X(op, f32) X(op, f64) X(op, f8e4m3) X(op, f8e5m2)
#endif
#define MNCL_KERNEL_INTEGERS(X, op) X(op, i8) X(op, i32) X(op, i64) X(op, u8) X(op, u32) X(op, u64)
#define MNCL_KERNEL_UNSIGNED(X, op) X(op, u8) X(op, u32) X(op, u64) MNCL_KERNEL_FLOATS(X, op)
#define MNCL_KERNEL_ALL(X, op) MNCL_KERNEL_INTEGERS(X, op) MNCL_KERNEL_FLOATS(X, op)
#define MNCL_KERNEL_INSTANCES(X) \
  MNCL_KERNEL_UNSIGNED(X, sum) MNCL_KERNEL_UNSIGNED(X, prod) MNCL_KERNEL_ALL(X, max) MNCL_KERNEL_ALL(X, min) \
  MNCL_KERNEL_INTEGERS(X, avg) MNCL_KERNEL_UNSIGNED(X, premulsum) X(band, u8) X(bor, u8) X(bxor, u8)

}  // namespace mncl::dev
