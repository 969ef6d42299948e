#pragma once
/// KvTransfer: one-sided writes of KV pages from this process's memory into a peer's registered
/// memory (prefill–decode disaggregation, docs/design/pd.md). Each side builds one over the
/// regions it exposes (the KV pool's per-layer buffers); the receiving side hands its
/// descriptor() to the sender out of band (the PD bootstrap, over HTTP); the sender write()s
/// runs of pages into it. The receiver needs to do nothing per transfer (it keeps a progress
/// thread); completion and integrity are reported out of band by the caller.
///
/// Engines: UCX (make_ucx_transfer: host memory over TCP or shared memory, RMA puts with remote
/// keys; what CI uses on loopback). An NCCL point-to-point engine for GPU memory is not built
/// yet (docs/design/pd.md lists it as missing).
///
/// Thread rules: descriptor() and write() may be called from any thread, concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pagoda::disagg {

/// A memory region a KvTransfer exposes (receiver) or reads from (sender).
struct MemRegion {
  void* base = nullptr;
  size_t bytes = 0;
};

/// One contiguous write: bytes [src_offset, +bytes) of local region src_region into bytes
/// [dst_offset, +bytes) of the peer's region dst_region.
struct WriteOp {
  uint32_t src_region = 0;
  uint64_t src_offset = 0;
  uint32_t dst_region = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};

/// How a write() ended.
struct TransferResult {
  bool ok = false;
  bool timed_out = false;  ///< not complete within the timeout
  std::string error;       ///< why, when !ok (peer unreachable, failed, timed out)
  uint64_t bytes = 0;      ///< bytes written (all of the ops when ok)
};

class KvTransfer {
 public:
  virtual ~KvTransfer() = default;
  /// "ucx".
  virtual std::string name() const = 0;
  /// Opaque bytes a peer needs to write into this side's regions (worker address, region
  /// bases, lengths and remote keys).
  virtual std::vector<std::byte> descriptor() const = 0;
  /// Writes `ops` into the peer described by `peer` (its descriptor()) and waits until all are
  /// complete at the peer (flushed) or `timeout_s` passed. Connections are cached per peer and
  /// dropped after a failure. Throws Error(kInvalidArgument) before writing anything for a
  /// malformed descriptor or an op outside a local or remote region; transport failures and
  /// timeouts come back in the result.
  virtual TransferResult write(std::span<const std::byte> peer, std::span<const WriteOp> ops,
                               double timeout_s) = 0;
};

/// Whether this build has the UCX engine.
bool have_ucx_transfer();
/// The UCX engine over `regions` (registered with ucp_mem_map; they must outlive it). Throws
/// Error(kUnsupported) in a build without UCX, Error(kInternal) when UCX fails to start.
std::unique_ptr<KvTransfer> make_ucx_transfer(std::span<const MemRegion> regions);

}  // namespace pagoda::disagg
