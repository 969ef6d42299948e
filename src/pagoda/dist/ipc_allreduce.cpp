#include "pagoda/dist/ipc_allreduce.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/dist/communicator.h"
#include "pagoda/dist/ipc_allreduce_kernel.h"
#include "pagoda/platform/cuda/cuda_check.h"

namespace pagoda::dist {

namespace {

using detail::IpcPeers;
using platform::cuda_check;
constexpr int kMaxRanks = detail::kIpcMaxRanks;
constexpr int kMaxBlocks = detail::kIpcMaxBlocks;
constexpr int kThreads = detail::kIpcThreads;
constexpr size_t kFlagBytes = detail::kIpcFlagBytes;

}  // namespace

struct IpcAllReduce::State {
  int rank = 0, world = 1;
  size_t capacity = 0;
  cudaStream_t stream = nullptr;
  char* base = nullptr;  // own allocation: flags | half 0 | half 1
  std::vector<char*> opened;  // peers' mapped bases
  IpcPeers peers{};
};

IpcAllReduce::IpcAllReduce(std::unique_ptr<State> s) : s_(std::move(s)) {}

IpcAllReduce::~IpcAllReduce() {
  for (char* p : s_->opened) (void)cudaIpcCloseMemHandle(p);
  if (s_->base != nullptr) (void)cudaFree(s_->base);
}

std::unique_ptr<IpcAllReduce> IpcAllReduce::create(Communicator& comm, size_t capacity,
                                                   void* stream_ptr) {
  const int world = comm.world_size(), rank = comm.rank();
  if (world < 2 || world > kMaxRanks) return nullptr;
  auto s = std::make_unique<State>();
  s->rank = rank;
  s->world = world;
  s->capacity = (capacity + 15) / 16 * 16;
  s->stream = static_cast<cudaStream_t>(stream_ptr);
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  // Every rank must reach every other: gather "can reach all" flags with the handles.
  int ndev = 0;
  cuda_check(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
  cuda_check(cudaMalloc(reinterpret_cast<void**>(&s->base), kFlagBytes + 2 * s->capacity),
             "cudaMalloc (all-reduce)");
  cuda_check(cudaMemset(s->base, 0, kFlagBytes), "cudaMemset");
  // The legacy-stream memset and copies below must land before work on the (non-blocking)
  // stream reads them.
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  struct Record {
    cudaIpcMemHandle_t handle;
    int32_t device;
    int32_t pad[15];
  };
  static_assert(sizeof(Record) % 4 == 0);
  Record mine{};
  cuda_check(cudaIpcGetMemHandle(&mine.handle, s->base), "cudaIpcGetMemHandle");
  mine.device = dev;
  const size_t words = sizeof(Record) / 4;
  void* d_send = nullptr;
  void* d_recv = nullptr;
  cuda_check(cudaMalloc(&d_send, sizeof(Record)), "cudaMalloc");
  cuda_check(cudaMalloc(&d_recv, sizeof(Record) * world), "cudaMalloc");
  cuda_check(cudaMemcpy(d_send, &mine, sizeof(Record), cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  comm.all_gather(d_send, d_recv, static_cast<int64_t>(words), DType::kF32);
  std::vector<Record> all(static_cast<size_t>(world));
  cuda_check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
  cuda_check(cudaMemcpy(all.data(), d_recv, sizeof(Record) * world, cudaMemcpyDeviceToHost),
             "cudaMemcpy");
  (void)cudaFree(d_send);
  (void)cudaFree(d_recv);
  bool reachable = true;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    int ok = 0;
    const int peer_dev = all[static_cast<size_t>(r)].device;
    reachable = reachable && peer_dev != dev && peer_dev < ndev &&
                cudaDeviceCanAccessPeer(&ok, dev, peer_dev) == cudaSuccess && ok != 0;
  }
  // Every rank must take the same decision (else the group would mix paths): agree through one
  // more all-gather of the verdicts.
  {
    float verdict = reachable ? 1.f : 0.f;
    float* d = nullptr;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float) * (world + 1)),
               "cudaMalloc");
    cuda_check(cudaMemcpy(d, &verdict, sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    comm.all_gather(d, d + 1, 1, DType::kF32);
    std::vector<float> v(static_cast<size_t>(world));
    cuda_check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    cuda_check(cudaMemcpy(v.data(), d + 1, sizeof(float) * world, cudaMemcpyDeviceToHost),
               "cudaMemcpy");
    (void)cudaFree(d);
    for (float x : v) reachable = reachable && x == 1.f;
  }
  if (!reachable) {
    (void)cudaFree(s->base);
    s->base = nullptr;
    return nullptr;
  }
  for (int r = 0; r < world; ++r) {
    char* p = s->base;
    if (r != rank) {
      void* mapped = nullptr;
      cuda_check(cudaIpcOpenMemHandle(&mapped, all[static_cast<size_t>(r)].handle,
                                      cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle");
      p = static_cast<char*>(mapped);
      s->opened.push_back(p);
    }
    s->peers.flags[r] = reinterpret_cast<uint32_t*>(p);
    s->peers.data[r] = p + kFlagBytes;
  }
  return std::unique_ptr<IpcAllReduce>(new IpcAllReduce(std::move(s)));
}

bool IpcAllReduce::fits(int64_t bytes) const {
  return bytes > 0 && bytes % 16 == 0 && static_cast<size_t>(bytes) <= s_->capacity;
}

void IpcAllReduce::all_reduce_sum(void* data, int64_t count, DType dtype) {
  const int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
  PAGODA_REQUIRE(fits(bytes), kInvalidArgument, "IPC all-reduce of {} bytes does not fit",
                 bytes);
  const int64_t nvec = bytes / 16;
  const int blocks =
      static_cast<int>(std::min<int64_t>(kMaxBlocks, std::max<int64_t>(1, nvec / kThreads)));
  detail::IpcDType t = detail::IpcDType::kF32;
  switch (dtype) {
    case DType::kF32: t = detail::IpcDType::kF32; break;
    case DType::kF16: t = detail::IpcDType::kF16; break;
    case DType::kBF16: t = detail::IpcDType::kBF16; break;
    default: throw_error(ErrorCode::kUnsupported, "IPC all-reduce of {}", dtype_name(dtype));
  }
  cuda_check(detail::launch_oneshot_allreduce(t, s_->peers, s_->rank, s_->world, data, nvec,
                                              s_->capacity, blocks, s_->stream),
             "oneshot_allreduce launch");
}

}  // namespace pagoda::dist
