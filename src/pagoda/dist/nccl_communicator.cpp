#include "pagoda/dist/nccl_communicator.h"

#include <cstdlib>
#include <cstring>

#include "pagoda/core/error.h"

#ifdef PAGODA_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#endif

namespace pagoda::dist {

#ifdef PAGODA_HAVE_NCCL

namespace {

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
  ~NcclCommunicator() override {
    if (aborted_.load()) return;  // abort() already released the communicator
    (void)ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }

  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    live();
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
  return std::make_unique<NcclCommunicator>(comm, rank, world,
                                            static_cast<cudaStream_t>(stream));
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
  return (void)nccl_unique_id(), nullptr;
}

#endif

}  // namespace pagoda::dist
