#pragma once
// Internal: the launch interface of the one-shot IPC all-reduce kernel (ipc_allreduce.h has the
// contract). Plain types only, so nvcc never sees fmt.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace pagoda::dist::detail {

constexpr int kIpcMaxRanks = 8;
constexpr int kIpcMaxBlocks = 64;
constexpr int kIpcThreads = 512;
constexpr size_t kIpcFlagBytes = 4096;

/// Every rank's mapped allocation: data halves and flag area.
struct IpcPeers {
  char* data[kIpcMaxRanks];
  uint32_t* flags[kIpcMaxRanks];
};

enum class IpcDType : int { kF32, kF16, kBF16 };

/// data[0 : nvec * 16 bytes] = Σ over `world` ranks (rank order, f32 accumulation), with
/// `blocks` blocks (≤ kIpcMaxBlocks) on `stream`. half_bytes: the size of one data half.
cudaError_t launch_oneshot_allreduce(IpcDType dtype, const IpcPeers& peers, int rank, int world,
                                     void* data, int64_t nvec, size_t half_bytes, int blocks,
                                     cudaStream_t stream);

}  // namespace pagoda::dist::detail
