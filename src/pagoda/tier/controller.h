#pragma once
/// TierController: moves KV pages between the device pool and the host pool on a
/// platform::CopyStream (HiCache's cache controller). Contract: docs/design/tier.md.
///
/// - Backups (device -> host) are queued by backup() and submitted in one batch by flush(), per
///   layer and per run of pages consecutive on both sides; complete() says when the last
///   submitted batch has finished.
/// - Load-backs (host -> device) are queued by load() during scheduling and submitted by
///   begin_forward(): layer 0's pages of every queued load, an event, layer 1's pages, an event,
///   and so on. The controller is then the device pool's LayerGate: the forward's
///   KvPool::wait_layer(l) makes the compute stream wait for event l only (Platform::wait_event),
///   so layer l's attention overlaps the copies of the layers after it. end_forward() removes
///   the gate (every layer has been waited for by then).
/// - One copy stream, in submission order: a load submitted after a backup never overtakes it.
///   Each submission first makes the copy stream wait for the compute stream (an event recorded
///   on it), so no copy overtakes compute work enqueued before it.
/// - synchronize() submits everything queued and waits: the scheduler calls it (through HiCache)
///   before host pages that a copy may touch are freed. quiesce_pages() waits only for the last
///   submission that touched given device pages (each submission leaves a mark: an event and the
///   pages it read or wrote), so evicting device pages whose copies finished long ago does not
///   wait for the backups and load-backs of other pages still in flight.
///
/// - Tensor parallelism: each rank holds its own head shard of the KV in its own device pool,
///   so each rank has its own host pool and its own controller. The scheduler's controller
///   (rank 0's) mirrors every backup(), load() and synchronize() to the other ranks through
///   TierPeers, in its own order; a peer's controller runs begin_forward() / end_forward()
///   around each of its rank's forwards. One tree, one host page allocator, the same page ids
///   on every rank.
///
/// - Overlap scheduler: the scheduler's thread queues copies and take()s them when it launches
///   a step; the step thread runs begin_forward(copies) / the forward / end_forward(); the
///   scheduler's thread calls synchronize() and quiesce_pages() only through the step barrier
///   (set_step_barrier: wait until the step in flight has run), so the two threads never use the
///   controller at once and no copy reads or overwrites a page the step in flight still writes or
///   reads.
///
/// Threads: one thread at a time (the scheduler's; the step thread between take() and the end
/// of that step's forward); the copies run on the stream (on the CPU platform: a worker thread).

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "pagoda/kv/host_pool.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/platform/platform.h"

namespace pagoda::tier {

/// Bytes and time moved each way (cumulative).
struct TransferStats {
  int64_t backup_pages = 0;   ///< device -> host
  int64_t load_pages = 0;     ///< host -> device
  int64_t bytes_d2h = 0;
  int64_t bytes_h2d = 0;
  int64_t backup_batches = 0;
  int64_t load_batches = 0;
  double d2h_wait_s = 0;      ///< time the scheduler blocked waiting for copies (synchronize,
                              ///< quiesce_pages)
  int64_t copy_waits = 0;     ///< times it blocked (d2h_wait_s is their sum)
  double load_stall_s = 0;    ///< time the forward blocked in wait_layer for a load-back
  int64_t load_stalls = 0;    ///< layer waits that found the layer not yet loaded
};

/// Page copies queued for one step: backups (device -> host pages) and load-backs (host ->
/// device pages), pairwise.
struct StepCopies {
  std::vector<int32_t> backup_device, backup_host;
  std::vector<int32_t> load_host, load_device;
  bool empty() const { return backup_device.empty() && load_host.empty(); }
};

/// The other tensor-parallel ranks' page copies, as the scheduler's controller sees them (a
/// tensor-parallel leader worker implements it: engine/tp.h). Each peer holds its own shard of
/// every device page and host page and its own controller; it applies the calls in the order
/// they are made, relative to the forwards and K/V moves the worker sends it, and runs its
/// controller's begin_forward() / end_forward() around each forward.
class TierPeers {
 public:
  virtual ~TierPeers() = default;
  /// Every peer builds a host pool of `host_pages` pages of its own shard's geometry and a
  /// controller over it and its device pool. Called once, before any other call.
  virtual void tier_start(int32_t host_pages) = 0;
  /// Every peer queues `copies` (TierController::backup / load), then with `sync` runs
  /// TierController::synchronize before its next forward or K/V move.
  virtual void tier_copies(const StepCopies& copies, bool sync) = 0;
};

class TierController final : public kv::LayerGate {
 public:
  /// Copies between `device` and `host` (same geometry) on a new copy stream of `platform`
  /// (Error(kUnsupported) when the platform has none), mirrored to `peers` when given (the
  /// other tensor-parallel ranks; tier_start is called here). All must outlive the controller.
  TierController(platform::Platform& platform, kv::KvPool& device, kv::HostKvPool& host,
                 TierPeers* peers = nullptr);
  ~TierController() override;
  TierController(const TierController&) = delete;
  TierController& operator=(const TierController&) = delete;

  /// Queues copies of device pages -> host pages (page ids, equal lengths). The device pages
  /// must stay unchanged and allocated, and the host pages unread, until complete().
  void backup(std::span<const int32_t> device_pages, std::span<const int32_t> host_pages);
  /// Submits the queued backups as one batch (no-op when none).
  void flush();
  /// True when every submitted copy has finished and nothing is queued.
  bool idle();

  /// Queues copies of host pages -> device pages for the next begin_forward(). The device pages
  /// must not be read before the forward's wait_layer, the host pages stay allocated until then.
  void load(std::span<const int32_t> host_pages, std::span<const int32_t> device_pages);
  /// Takes the queued copies out (for begin_forward(StepCopies)): the overlap scheduler takes
  /// them on the scheduler's thread when it launches a step, so copies queued later go with the
  /// next step.
  StepCopies take();
  /// Mirrors `copies` to the peers, submits the backups, then the loads layer by layer (one
  /// event per layer), and installs the controller as the device pool's layer gate (also when
  /// nothing is loaded). With the overlap scheduler the step thread calls it (and end_forward
  /// and, through the gate, wait): the scheduler's thread then calls only backup, load and take,
  /// and synchronize after the step barrier.
  void begin_forward(StepCopies copies);
  void begin_forward() { begin_forward(take()); }
  /// Makes the compute stream wait for this step's whole load-back (a no-op when the forward
  /// already waited for every layer) and removes the gate: a page loaded in a step is complete
  /// for every later step.
  void end_forward();
  /// LayerGate: the compute stream waits for `layer`'s load-back event of this step.
  void wait(LayerId layer) override;

  /// Runs the step barrier, submits everything queued and blocks until every copy has finished
  /// (on the peers: before their next forward or K/V move).
  void synchronize();
  /// Blocks until no submitted or queued copy reads or writes any of `device_pages` (device
  /// pages about to be freed): runs the step barrier, submits the queued backups (flush()), then
  /// waits for the last submission that touched one of them (copies submitted later keep
  /// running); when a queued load-back writes one, or with peers (their streams are theirs), it
  /// is synchronize().
  void quiesce_pages(std::span<const int32_t> device_pages);
  /// Called first by synchronize(): the overlap scheduler's wait until the step in flight has
  /// run, so no copy or forward of it touches the pages about to be freed or backed up.
  void set_step_barrier(std::function<void()> barrier) { barrier_ = std::move(barrier); }

  const TransferStats& stats() const { return stats_; }

 private:
  /// Submits `c`'s backups, then its loads (layer events when `layer_events`).
  void submit_all(const StepCopies& c, bool layer_events);
  /// Enqueues pages src[i] -> dst[i] from `from` to `to`, layer by layer (an event after each
  /// layer when `layer_events`), then last_.
  void submit(const kv::KvPool& from, kv::KvPool& to, std::span<const int32_t> src,
              std::span<const int32_t> dst, bool layer_events);

  platform::Platform* platform_;
  kv::KvPool* device_;
  kv::HostKvPool* host_;
  TierPeers* peers_;
  std::unique_ptr<platform::CopyStream> stream_;
  int64_t page_bytes_ = 0;
  StepCopies queued_;
  bool peers_unsynced_ = false;  ///< copies mirrored since the peers' last synchronize
  std::function<void()> barrier_;
  std::shared_ptr<platform::Event> last_;  ///< after the last submitted copy
  /// Submissions so far; touched_[page] = the number of the last one that read or wrote device
  /// page `page` (0: none); marks_ = (number, its end event) of submissions that may still run,
  /// oldest first (dropped once done).
  uint64_t submissions_ = 0;
  std::vector<uint64_t> touched_;
  std::deque<std::pair<uint64_t, std::shared_ptr<platform::Event>>> marks_;
  std::vector<char> flag_;  ///< quiesce_pages' scratch: one per device page
  std::vector<std::unique_ptr<platform::Event>> layer_;  ///< this step's per-layer load events
  bool gate_installed_ = false;
  TransferStats stats_;
};

/// One forward of a tier (a TierController, or the HiCache that owns one): begins it at
/// construction (begin_forward(), or begin_forward(copies) for copies taken earlier) and ends
/// it (end_forward()) on every exit from the scope, a throwing forward included, so the device
/// pool never keeps a stale layer gate. A null tier does nothing. If begin_forward throws,
/// nothing is ended (nothing began).
///
///   ForwardScope forward(hicache);   // nullptr without a hierarchical cache
///   worker.run(batch);
template <class Tier>
class ForwardScope {
 public:
  explicit ForwardScope(Tier* tier) : tier_(tier) {
    if (tier_ != nullptr) tier_->begin_forward();
  }
  ForwardScope(Tier* tier, StepCopies copies) : tier_(tier) {
    if (tier_ != nullptr) tier_->begin_forward(std::move(copies));
  }
  ~ForwardScope() {
    if (tier_ != nullptr) tier_->end_forward();
  }
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

 private:
  Tier* tier_;
};

}  // namespace pagoda::tier
