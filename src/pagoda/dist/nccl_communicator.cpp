#include "pagoda/dist/nccl_communicator.h"

#include <cstdlib>
#include <cstring>

#include "pagoda/core/error.h"

#ifdef PAGODA_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>

#include "pagoda/dist/ipc_allreduce.h"
#include "pagoda/platform/cuda/cuda_check.h"
#endif

namespace pagoda::dist {

#ifdef PAGODA_HAVE_NCCL

namespace {

using platform::cuda_check;

void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw_error(ErrorCode::kInternal, "{} failed: {} ({})", what, ncclGetErrorString(r),
              last != nullptr ? last : "");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    default: break;
  }
  throw_error(ErrorCode::kUnsupported, "NCCL collectives take f32, f16 or bf16 (not {})",
              dtype_name(t));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int world, cudaStream_t stream)
      : comm_(comm), rank_(rank), world_(world), stream_(stream) {}
  /// Tears down with ncclCommAbort: local and non-blocking. (With ncclCommDestroy at exit,
  /// `generate --tp 2` took 50-52 s instead of 21-26 s on the H200s at e08d3e7, the follower
  /// apparently waiting on its peer until rank 0 killed it; by the time a communicator is
  /// destroyed no collective is outstanding, so nothing is lost.)
  ~NcclCommunicator() override {
    ipc_.reset();
    if (aborted_.exchange(true)) return;  // abort() already released the communicator
    (void)ncclCommAbort(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return ipc_ != nullptr ? "nccl+ipc" : "nccl"; }

  /// Sets up the one-shot IPC all-reduce (collective) and checks it against NCCL on random
  /// data; keeps NCCL alone when P2P is unavailable or the check fails (NCCL alone measured
  /// slower: bench/results/tp_h200x2.md). Returns what it decided, for the log.
  std::string enable_ipc() {
    ipc_ = IpcAllReduce::create(*this, size_t{8} << 20, stream_);
    if (ipc_ == nullptr) return "NCCL only (no P2P between the GPUs)";
    const int64_t n = 12288;
    std::vector<float> host(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(1234 + rank_));
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (float& x : host) x = u(rng);
    float* d = nullptr;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float) * n * 2), "cudaMalloc");
    cuda_check(cudaMemcpy(d, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaMemcpy(d + n, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice),
            "cudaMemcpy");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // before the stream reads them
    bool same = true;
    for (int rep = 0; rep < 3; ++rep) {  // several calls: the epochs and halves alternate
      ipc_->all_reduce_sum(d, n, DType::kF32);
      nccl_all_reduce(d + n, n, DType::kF32);
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      cuda_check(cudaMemcpy(a.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
      cuda_check(cudaMemcpy(b.data(), d + n, sizeof(float) * n, cudaMemcpyDeviceToHost),
              "cudaMemcpy");
      for (int64_t i = 0; i < n; ++i)
        same = same && std::fabs(a[static_cast<size_t>(i)] - b[static_cast<size_t>(i)]) <=
                           1e-5f * (1.f + std::fabs(b[static_cast<size_t>(i)]));
    }
    (void)cudaFree(d);
    // Every rank must agree (NCCL all-reduce of the verdicts).
    float* v = nullptr;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&v), sizeof(float)), "cudaMalloc");
    const float mine = same ? 0.f : 1.f;
    cuda_check(cudaMemcpy(v, &mine, sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    nccl_all_reduce(v, 1, DType::kF32);
    float bad = 0.f;
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    cuda_check(cudaMemcpy(&bad, v, sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    (void)cudaFree(v);
    if (bad != 0.f) {
      ipc_.reset();
      return "NCCL only (the IPC all-reduce disagreed with NCCL on its self-check)";
    }
    return "NCCL + one-shot IPC all-reduce for messages up to 8 MiB";
  }

  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    live();
    if (ipc_ != nullptr && ipc_->fits(count * static_cast<int64_t>(dtype_size(dtype)))) {
      ipc_->all_reduce_sum(data, count, dtype);
      return;
    }
    nccl_all_reduce(data, count, dtype);
  }
  void nccl_all_reduce(void* data, int64_t count, DType dtype) {
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dtype), ncclSum,
                             comm_, stream_),
               "ncclAllReduce", comm_);
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    live();
    nccl_check(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dtype), comm_,
                             stream_),
               "ncclAllGather", comm_);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    live();
    nccl_check(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_,
                             stream_),
               "ncclBroadcast", comm_);
  }
  void abort() override {
    if (aborted_.exchange(true)) return;
    (void)ncclCommAbort(comm_);
  }

 private:
  void live() const {
    PAGODA_REQUIRE(!aborted_.load(), kFailedPrecondition,
                   "the tensor-parallel group was aborted (a rank failed)");
  }
  ncclComm_t comm_;
  int rank_, world_;
  cudaStream_t stream_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<IpcAllReduce> ipc_;
};

}  // namespace

bool nccl_available() { return true; }

std::vector<std::byte> nccl_unique_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<std::byte> out(sizeof(id));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(std::span<const std::byte> id_bytes,
                                                     int rank, int world, void* stream) {
  ncclUniqueId id;
  PAGODA_REQUIRE(id_bytes.size() == sizeof(id), kInvalidArgument,
                 "an NCCL group id has {} bytes (got {})", sizeof(id), id_bytes.size());
  PAGODA_REQUIRE(world >= 1 && rank >= 0 && rank < world, kInvalidArgument,
                 "rank {} of a group of {}", rank, world);
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, world, id, rank), "ncclCommInitRank");
  auto c = std::make_unique<NcclCommunicator>(comm, rank, world,
                                              static_cast<cudaStream_t>(stream));
  const std::string how = c->enable_ipc();
  if (rank == 0) std::fprintf(stderr, "pagoda: tensor parallel %d: %s\n", world, how.c_str());
  return c;
}

#else  // no NCCL in this build

bool nccl_available() { return false; }

std::vector<std::byte> nccl_unique_id() {
  throw_error(ErrorCode::kUnsupported,
              "tensor parallelism is unavailable: this build has no NCCL (install the "
              "nvidia-nccl-cu13 wheel and reconfigure with CUDA)");
}

std::unique_ptr<Communicator> make_nccl_communicator(std::span<const std::byte>, int, int,
                                                     void*) {
  throw_error(ErrorCode::kUnsupported,
              "tensor parallelism is unavailable: this build has no NCCL");
}

#endif

}  // namespace pagoda::dist
