#pragma once
/// IpcAllReduce: a one-shot all-reduce for small messages over CUDA-IPC-mapped peer memory (the
/// technique of vLLM's and SGLang's custom all-reduce; written here from the idea). A decode
/// step runs 2 per layer + 1; measured on two H200s (bench/results/tp_h200x2.md, 4174820) it
/// saves only ~1 µs per all-reduce over NCCL at 8-512 KB, so NCCL is not the main TP overhead.
///
/// Each rank owns one device allocation, mapped into every peer: a flag area (per block, per
/// rank) and two data halves used alternately (call parity). One kernel per call: every block
/// copies its chunk of the input into this rank's half, fences, raises its flag in every peer,
/// waits for every peer's flag, then sums the chunk over all ranks in rank order (f32
/// accumulation) into the input buffer. A device-side epoch (advanced by the last block of each
/// call) numbers the calls, so the kernel replays inside CUDA graphs; the two halves make a
/// second barrier unnecessary (a rank can be at most one call ahead).
///
/// Every rank gets the same bits (same order). Built only with CUDA + NCCL (the handles are
/// exchanged through an NCCL all-gather).

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pagoda/core/dtype.h"

namespace pagoda::dist {

class Communicator;

class IpcAllReduce {
 public:
  /// Collective (every rank, same arguments): allocates `capacity` bytes × 2 plus flags on the
  /// current device, exchanges IPC handles through `nccl` (synchronous on `stream`) and maps the
  /// peers. Returns nullptr when a peer is not reachable by P2P or the world is > 8.
  static std::unique_ptr<IpcAllReduce> create(Communicator& nccl, size_t capacity,
                                              void* stream);
  ~IpcAllReduce();
  IpcAllReduce(const IpcAllReduce&) = delete;
  IpcAllReduce& operator=(const IpcAllReduce&) = delete;

  /// Whether a message of `bytes` goes through this path (≤ capacity, a multiple of 16 bytes).
  bool fits(int64_t bytes) const;
  /// data[0:count] = Σ over ranks, in place (f32, f16, bf16); enqueued on the stream.
  void all_reduce_sum(void* data, int64_t count, DType dtype);

  struct State;

 private:
  explicit IpcAllReduce(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace pagoda::dist
