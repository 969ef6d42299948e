#pragma once
/// Communicator: collectives among the ranks of a tensor-parallel group (ARCHITECTURE §1: "tensor
/// parallelism attaches at the worker seam"). Each rank owns one Communicator; every rank must
/// issue the same collectives in the same order with the same sizes (the usual NCCL rule).
///
/// Device rules: buffers live on the rank's platform device (host memory for the CPU group). On
/// CUDA every call is enqueued on the platform's stream (capturable into a CUDA graph) and
/// returns without waiting; on the host it returns when the result is in place.
///
/// Implementations: LocalGroup (N ranks in N threads of one process over host memory: the
/// in-process group tests use) and the NCCL communicator (nccl_communicator.h, one process per
/// GPU). A world of one needs no communicator (callers skip the collectives).
///
/// Thread rules: one thread drives a communicator; abort() may be called from any thread.

#include <cstdint>
#include <memory>
#include <string>

#include "pagoda/core/dtype.h"

namespace pagoda::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "solo", "local", "nccl".
  virtual std::string name() const = 0;

  /// data[0:count] = Σ over ranks of every rank's data[0:count], in place. dtype f32, f16 or
  /// bf16 (the host group: f32). Every rank gets bitwise the same result.
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  /// recv[r * count : (r + 1) * count] = rank r's send[0:count], for every r (rank order).
  /// recv holds world_size() * count elements; send and recv must not overlap.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  /// data[0:bytes] on every rank = root's data[0:bytes].
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  /// Stops the group after a peer failed: outstanding collectives end (with an error where the
  /// implementation can) and later calls throw Error(kFailedPrecondition, "... aborted").
  /// Idempotent; any thread.
  virtual void abort() {}
};

/// N ranks as N threads of one process over host memory (f32 only). Reductions add the ranks'
/// values in rank order, so every rank sees the same bits and the result does not depend on
/// thread timing. Each rank's communicator must be driven by its own thread.
class LocalGroup {
 public:
  /// Throws Error(kInvalidArgument) unless 1 <= world_size <= 64.
  explicit LocalGroup(int world_size);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int world_size() const;
  /// Rank `rank`'s communicator (valid while the group lives). Call once per rank.
  std::unique_ptr<Communicator> communicator(int rank);
  /// Wakes every rank waiting in a collective; they (and later calls) throw
  /// Error(kFailedPrecondition). Any thread.
  void abort();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace pagoda::dist
