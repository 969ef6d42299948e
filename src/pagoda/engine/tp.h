#pragma once
/// Tensor parallelism at the worker seam (ARCHITECTURE §1; docs/design/distributed.md).
///
/// One scheduler (the Engine on rank 0) drives N workers. Each step the leader sends the step's
/// WorkerBatch, plus the req→token entries the batch reads that a follower has not seen yet, to
/// every follower over a ByteChannel, then runs its own shard; every rank's LlamaWorker runs the
/// same batch over its shard (Decoder: heads, MLP columns and vocabulary split N ways, all-reduce
/// and all-gather through the group's Communicator). Rank 0 samples and returns the ids; the
/// other ranks' ids are discarded (every rank holds the same logits).
///
///   rank 0: Engine → TpLeaderWorker::run ─send→ ranks 1..N-1: run_tp_follower → LlamaWorker::run
///                        └→ LlamaWorker::run (rank 0) ──── collectives ────┘
///
/// Two ways to run a group: in one process, one thread per rank, over LocalGroup and local
/// channels (tests: make_local_tp_workers); or one process per GPU over NCCL and Unix sockets
/// (TpProcessGroup: `pagoda bench|generate --tp N` spawn `pagoda tp-follower` children).
///
/// Failure rules: a follower whose batch is rejected by validation skips it (the leader rejected
/// it too and nothing was computed); any other follower error ends the follower; a follower that
/// dies is noticed by the leader's watchdog, which aborts the group and ends the leader process
/// with an error naming the rank (a rank never waits forever on a dead peer).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pagoda/dist/channel.h"
#include "pagoda/dist/communicator.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/worker.h"
#include "pagoda/platform/platform.h"
#include "pagoda/tier/controller.h"

namespace pagoda::engine {

/// Rank 0's worker: forwards every batch to the followers, then runs its own shard. It is also
/// the hierarchical cache's TierPeers (the group's factories return it as BuiltWorker::
/// tier_peers): the scheduler's tier controller mirrors its page copies to the followers
/// through it (each follower keeps its own host pool shard and controller).
class TpLeaderWorker final : public model::ModelWorker, public tier::TierPeers {
 public:
  /// `local` is rank 0's worker (built over the group's communicator); `followers` the channels
  /// to ranks 1..N-1 (must outlive this worker); `table` the engine's request table, whose dirty
  /// ranges (ReqToTokenTable::dirty) this leader consumes: each step sends the dirty entries the
  /// batch reads and marks them clean, so the cost follows what changed, not the rows' lengths.
  TpLeaderWorker(std::unique_ptr<model::ModelWorker> local,
                 std::vector<dist::ByteChannel*> followers, kv::ReqToTokenTable& table);
  /// The leader as a group's WorkerFactory returns it: the worker, and itself as the tier peers.
  static BuiltWorker make(std::unique_ptr<model::ModelWorker> local,
                          std::vector<dist::ByteChannel*> followers, kv::ReqToTokenTable& table);
  /// Tells the followers to stop (they return from run_tp_follower).
  ~TpLeaderWorker() override;
  TpLeaderWorker(const TpLeaderWorker&) = delete;
  TpLeaderWorker& operator=(const TpLeaderWorker&) = delete;

  model::WorkerOutput run(const model::WorkerBatch& batch) override;
  /// The ModelWorker staging hook, for the overlap scheduler, whose step thread runs a step
  /// while the scheduler's thread writes the table for the next one: stage() on the scheduler's
  /// thread when the step is launched (reads the batch's dirty table entries and marks them
  /// clean: the table's dirty ranges are touched by that thread only), run_staged() on the step
  /// thread with its result (sends it with the batch, runs rank 0's shard).
  std::vector<std::byte> stage(const model::WorkerBatch& batch) override;
  model::WorkerOutput run_staged(const model::WorkerBatch& batch,
                                 std::span<const std::byte> table_entries) override;
  /// Moves the rows on rank 0, then on every follower (speculative commits: each rank's pool
  /// holds its own heads of the same slots).
  void move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) override;
  /// Rank 0's pool (its kv heads only).
  kv::KvPool& kv_pool() override { return local_->kv_pool(); }
  std::string backend_name() const override { return local_->backend_name(); }
  model::WorkerStats stats() const override { return local_->stats(); }

  /// TierPeers: each is one message to every follower, on the channel of the batches (so a
  /// follower sees the copies, batches and K/V moves in rank 0's order).
  void tier_start(int32_t host_pages) override;
  void tier_copies(const tier::StepCopies& copies, bool sync) override;

 private:
  std::unique_ptr<model::ModelWorker> local_;
  std::vector<dist::ByteChannel*> followers_;
  kv::ReqToTokenTable* table_;  // its dirty ranges are this leader's to clear
  std::vector<std::byte> message_;
};

/// A follower rank's loop: receives each step, writes its table entries into `table` (a mirror
/// of the leader's, same shape; every row is marked in use here) and runs `worker`. With the
/// hierarchical cache it builds its own host pool shard and tier controller on `platform` (the
/// worker's) when the leader says so, applies the mirrored copies in order and gates each
/// forward on its own load-back. Returns when the leader stops the group or its channel closes.
/// Rethrows a worker error other than a rejected batch (kInvalidArgument / kOutOfRange).
void run_tp_follower(model::ModelWorker& worker, kv::ReqToTokenTable& table,
                     dist::ByteChannel& channel, platform::Platform& platform);

/// An in-process tensor-parallel group of `tp` ranks on the CPU (one thread per follower) for
/// tests and tools: factory() is an Engine WorkerFactory whose worker is rank 0's leader.
class LocalTpGroup {
 public:
  /// Throws Error(kInvalidArgument) for tp < 1.
  explicit LocalTpGroup(int tp);
  /// Stops and joins the follower threads.
  ~LocalTpGroup();
  LocalTpGroup(const LocalTpGroup&) = delete;
  LocalTpGroup& operator=(const LocalTpGroup&) = delete;

  /// The factory (call it once: one engine per group). Followers build their workers on their
  /// own CPU platforms from the same model, dtype and worker config; the factory returns once
  /// they have (so nothing reads the model after the engine is gone, even when the engine's
  /// constructor throws after its worker was built).
  WorkerFactory factory();
  /// A follower thread's error message ("" while none failed).
  std::string follower_error() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One process per GPU over NCCL: rank r is GPU r. Spawns ranks 1..N-1 as child processes
/// (`exe tp-follower --fd 3 --rank r --tp N`, each runs tp_follower_main) at construction.
class TpProcessGroup {
 public:
  /// `model` / `weight_seed` name the checkpoint as model::load_model takes them (each follower
  /// loads it itself). Throws Error(kUnsupported) when this build has no NCCL or the machine has
  /// fewer than `tp` GPUs, kInternal when a child cannot be started.
  TpProcessGroup(int tp, const std::string& exe, const std::string& model,
                 uint64_t weight_seed);
  /// Stops the followers (waits up to 30 s, then kills them).
  ~TpProcessGroup();
  TpProcessGroup(const TpProcessGroup&) = delete;
  TpProcessGroup& operator=(const TpProcessGroup&) = delete;

  /// The Engine WorkerFactory: sends each follower its settings, joins the NCCL group as rank 0
  /// on `platform` (GPU 0) and returns rank 0's TpLeaderWorker. Call once.
  WorkerFactory factory(platform::Platform& platform);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The follower process (`pagoda tp-follower`): loads the model (`model_spec`, `weight_seed` as
/// model::load_model takes them), reads its settings from the socket `fd`, binds GPU `rank`,
/// joins the NCCL group and runs run_tp_follower until the leader stops it. Dies with rank 0
/// (PR_SET_PDEATHSIG). Returns the exit code (0 on an orderly stop); prints errors to stderr.
int tp_follower_main(int fd, int rank, int tp, const std::string& model_spec,
                     uint64_t weight_seed);

}  // namespace pagoda::engine
