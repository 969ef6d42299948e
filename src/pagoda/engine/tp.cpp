#include "pagoda/engine/tp.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "pagoda/core/error.h"
#include "pagoda/dist/wire.h"
#include "pagoda/model/worker_codec.h"
#include "pagoda/kv/host_pool.h"
#include "pagoda/platform/platform.h"

namespace pagoda::engine {

using attention::ForwardMode;

namespace {

enum class MessageKind : uint8_t {
  kBatch = 1,
  kStop = 2,
  kMoveKv = 3,
  kTierStart = 4,   ///< i32 host pages: build the host pool shard and the tier controller
  kTierCopies = 5,  ///< backups (device, host), loads (host, device), u8 synchronize
};

/// How many req→token entries of sequence b the batch's attention reads.
int64_t entries_read(const attention::ForwardBatch& f, int b) {
  const int64_t len = f.seq_lens[static_cast<size_t>(b)];
  return f.mode == ForwardMode::kTargetVerify ? len + f.spec.num_draft_tokens : len;
}

}  // namespace

TpLeaderWorker::TpLeaderWorker(std::unique_ptr<model::ModelWorker> local,
                               std::vector<dist::ByteChannel*> followers,
                               kv::ReqToTokenTable& table)
    : local_(std::move(local)), followers_(std::move(followers)), table_(&table) {
  PAGODA_REQUIRE(local_ != nullptr, kInvalidArgument, "the leader needs its own worker");
  // The followers start from a zero table: what was written before this leader existed is sent
  // the first time a batch reads it.
}

BuiltWorker TpLeaderWorker::make(std::unique_ptr<model::ModelWorker> local,
                                 std::vector<dist::ByteChannel*> followers,
                                 kv::ReqToTokenTable& table) {
  auto leader = std::make_unique<TpLeaderWorker>(std::move(local), std::move(followers), table);
  tier::TierPeers* peers = leader.get();
  return BuiltWorker(std::move(leader), peers);
}

TpLeaderWorker::~TpLeaderWorker() {
  const std::byte stop{static_cast<uint8_t>(MessageKind::kStop)};
  for (dist::ByteChannel* c : followers_) {
    try {
      c->send(std::span<const std::byte>(&stop, 1));
    } catch (const Error&) {  // the follower is gone already; nothing to stop
    }
  }
}

void TpLeaderWorker::tier_start(int32_t host_pages) {
  message_.clear();
  dist::WireWriter w(message_);
  w.put(static_cast<uint8_t>(MessageKind::kTierStart));
  w.put(host_pages);
  for (dist::ByteChannel* c : followers_) c->send(message_);
}

void TpLeaderWorker::tier_copies(const tier::StepCopies& copies, bool sync) {
  message_.clear();
  dist::WireWriter w(message_);
  w.put(static_cast<uint8_t>(MessageKind::kTierCopies));
  w.put_vec(copies.backup_device);
  w.put_vec(copies.backup_host);
  w.put_vec(copies.load_host);
  w.put_vec(copies.load_device);
  w.put(static_cast<uint8_t>(sync));
  for (dist::ByteChannel* c : followers_) c->send(message_);
}

std::vector<std::byte> TpLeaderWorker::stage(const model::WorkerBatch& batch) {
  const attention::ForwardBatch& f = batch.forward;
  std::vector<std::byte> out;
  dist::WireWriter w(out);
  // The table entries the batch reads that were written since the followers last got them:
  // each row's dirty range, cut at what the batch reads (the rest stays dirty for later).
  struct Run {
    int32_t row, begin, len;
    int64_t upto;  // positions the batch reads: marked clean once sent
  };
  std::vector<Run> runs;
  const int64_t stride = table_->row_stride();
  const int bs = std::min<int>(f.batch_size, static_cast<int>(f.req_pool_indices.size()));
  for (int b = 0; b < bs && b < static_cast<int>(f.seq_lens.size()); ++b) {
    const int32_t row = f.req_pool_indices[static_cast<size_t>(b)];
    const int64_t need = std::min<int64_t>(entries_read(f, b), stride);
    if (row <= 0 || row > table_->max_reqs() || need <= 0) continue;  // padding / rejected below
    runs.push_back(Run{row, 0, 0, need});
  }
  // A row listed twice reads the longer of its two ranges.
  std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) {
    return x.row != y.row ? x.row < y.row : x.upto > y.upto;
  });
  runs.erase(std::unique(runs.begin(), runs.end(),
                         [](const Run& x, const Run& y) { return x.row == y.row; }),
             runs.end());
  std::erase_if(runs, [&](Run& r) {
    const kv::ReqToTokenTable::DirtyRange d = table_->dirty(ReqSlot(r.row));
    if (d.begin >= d.end || d.begin >= r.upto) return true;  // the followers have it all
    r.begin = static_cast<int32_t>(d.begin);
    r.len = static_cast<int32_t>(std::min(d.end, r.upto) - d.begin);
    return false;
  });
  w.put<uint32_t>(static_cast<uint32_t>(runs.size()));
  for (const Run& r : runs) {
    w.put(r.row);
    w.put(r.begin);
    w.put_vec(table_->read(ReqSlot(r.row), r.begin, r.len));
  }
  for (const Run& r : runs) table_->mark_clean(ReqSlot(r.row), r.upto);
  return out;
}

model::WorkerOutput TpLeaderWorker::run(const model::WorkerBatch& batch) {
  return run_staged(batch, stage(batch));
}

model::WorkerOutput TpLeaderWorker::run_staged(const model::WorkerBatch& batch,
                                               std::span<const std::byte> table_entries) {
  message_.clear();
  dist::WireWriter w(message_);
  w.put(static_cast<uint8_t>(MessageKind::kBatch));
  message_.insert(message_.end(), table_entries.begin(), table_entries.end());
  model::encode_worker_batch(batch, w);
  for (dist::ByteChannel* c : followers_) c->send(message_);
  return local_->run(batch);
}

void TpLeaderWorker::move_kv(std::span<const SlotIndex> src, std::span<const SlotIndex> dst) {
  // Rank 0 first: its pool has the shape of every rank's, so what it refuses (kOutOfRange,
  // nothing changed) never reaches a follower, and what it accepts every follower can apply.
  local_->move_kv(src, dst);
  message_.clear();
  dist::WireWriter w(message_);
  w.put(static_cast<uint8_t>(MessageKind::kMoveKv));
  w.put_vec(src);
  w.put_vec(dst);
  for (dist::ByteChannel* c : followers_) c->send(message_);
}

void run_tp_follower(model::ModelWorker& worker, kv::ReqToTokenTable& table,
                     dist::ByteChannel& channel, platform::Platform& platform) {
  while (table.alloc().has_value()) {
  }
  std::vector<std::byte> msg;
  model::WorkerBatch batch;
  std::vector<int32_t> entries, move_src, move_dst;
  tier::StepCopies copies;
  // The hierarchical cache's shard on this rank (kTierStart); the controller goes first.
  std::unique_ptr<kv::HostKvPool> host;
  std::unique_ptr<tier::TierController> tier;
  while (channel.recv(msg)) {
    dist::WireReader r(msg);
    const auto kind = static_cast<MessageKind>(r.get<uint8_t>());
    if (kind == MessageKind::kStop) return;
    if (kind == MessageKind::kTierStart) {
      PAGODA_REQUIRE(tier == nullptr, kInvalidArgument,
                     "tensor-parallel follower: the hierarchical cache started twice");
      const auto pages = r.get<int32_t>();
      host = std::make_unique<kv::HostKvPool>(worker.kv_pool().config(), pages,
                                              platform.pinned_allocator());
      tier = std::make_unique<tier::TierController>(platform, worker.kv_pool(), *host);
      continue;
    }
    if (kind == MessageKind::kTierCopies) {
      PAGODA_REQUIRE(tier != nullptr, kInvalidArgument,
                     "tensor-parallel follower: tier copies before the hierarchical cache started");
      r.get_vec(copies.backup_device);
      r.get_vec(copies.backup_host);
      r.get_vec(copies.load_host);
      r.get_vec(copies.load_device);
      tier->backup(copies.backup_device, copies.backup_host);
      tier->load(copies.load_host, copies.load_device);
      if (r.get<uint8_t>() != 0) tier->synchronize();
      continue;
    }
    if (kind == MessageKind::kMoveKv) {  // rank 0 applied it already: it cannot fail here
      r.get_vec(move_src);
      r.get_vec(move_dst);
      worker.move_kv(move_src, move_dst);
      continue;
    }
    PAGODA_REQUIRE(kind == MessageKind::kBatch, kInvalidArgument,
                   "tensor-parallel follower: unknown message kind {}", static_cast<int>(kind));
    const uint32_t runs = r.get<uint32_t>();
    for (uint32_t i = 0; i < runs; ++i) {
      const auto row = r.get<int32_t>();
      const auto begin = r.get<int32_t>();
      r.get_vec(entries);
      table.write(ReqSlot(row), begin, entries);
    }
    model::decode_worker_batch(r, batch);
    // This rank's queued copies start now; its forward waits per layer for its own load-back.
    const tier::ForwardScope forward(tier.get());
    try {
      (void)worker.run(batch);
    } catch (const Error& e) {
      // Validation rejects the same batch on every rank before anything is computed.
      if (e.code() != ErrorCode::kInvalidArgument && e.code() != ErrorCode::kOutOfRange) throw;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// In-process group.

struct LocalTpGroup::Impl {
  int tp = 1;
  std::unique_ptr<dist::LocalGroup> group;
  std::unique_ptr<platform::Platform> leader_platform;
  std::unique_ptr<dist::Communicator> leader_comm;
  std::vector<std::unique_ptr<dist::ByteChannel>> leader_ends, follower_ends;
  std::vector<std::thread> threads;
  mutable std::mutex mu;
  std::string error;
  bool used = false;
  /// Followers done with building their workers (or failed): the factory returns only then, so
  /// the model they read may go as soon as the engine does (e.g. its constructor throws).
  int built = 0;
  std::condition_variable built_cv;
  void follower_built() {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++built;
    }
    built_cv.notify_all();
  }
};

LocalTpGroup::LocalTpGroup(int tp) : impl_(std::make_unique<Impl>()) {
  PAGODA_REQUIRE(tp >= 1, kInvalidArgument, "tensor parallelism needs tp >= 1 (got {})", tp);
  impl_->tp = tp;
  impl_->group = std::make_unique<dist::LocalGroup>(tp);
}

LocalTpGroup::~LocalTpGroup() {
  for (auto& c : impl_->leader_ends) c->close();
  for (std::thread& t : impl_->threads) t.join();
}

std::string LocalTpGroup::follower_error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->error;
}

WorkerFactory LocalTpGroup::factory() {
  Impl* impl = impl_.get();
  return [impl](const model::LlamaModel& model, DType dtype, const model::WorkerConfig& config,
                kv::ReqToTokenTable& table) -> BuiltWorker {
    PAGODA_REQUIRE(!impl->used, kFailedPrecondition, "a LocalTpGroup serves one engine");
    impl->used = true;
    // Check the split before starting threads (every rank would fail the same way).
    (void)model::Decoder::shard_of(model.config(), 0, impl->tp);
    for (int r = 1; r < impl->tp; ++r) {
      auto [lead, follow] = dist::make_local_channel_pair();
      impl->leader_ends.push_back(std::move(lead));
      impl->follower_ends.push_back(std::move(follow));
    }
    const int32_t rows = table.max_reqs(), cols = table.max_context_len();
    for (int r = 1; r < impl->tp; ++r) {
      std::unique_ptr<dist::Communicator> comm = impl->group->communicator(r);
      dist::ByteChannel* ch = impl->follower_ends[static_cast<size_t>(r - 1)].get();
      impl->threads.emplace_back([impl, &model, dtype, config, rows, cols, ch,
                                  comm = std::shared_ptr<dist::Communicator>(std::move(comm))] {
        bool built = false;
        try {
          std::unique_ptr<platform::Platform> p = platform::make_cpu_platform();
          kv::ReqToTokenTable mirror(rows, cols);
          model::WorkerConfig c = config;
          c.comm = comm.get();
          model::LlamaWorker worker(model, make_model_ops(*p, dtype, c.cpu_gemm), c, mirror);
          built = true;
          impl->follower_built();
          run_tp_follower(worker, mirror, *ch, *p);
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lock(impl->mu);
            impl->error = e.what();
          }
          impl->group->abort();
          if (!built) impl->follower_built();
        }
      });
    }
    {
      std::unique_lock<std::mutex> lock(impl->mu);
      impl->built_cv.wait(lock, [impl] { return impl->built == impl->tp - 1; });
    }
    impl->leader_platform = platform::make_cpu_platform();
    impl->leader_comm = impl->group->communicator(0);
    model::WorkerConfig c = config;
    c.comm = impl->leader_comm.get();
    auto local = std::make_unique<model::LlamaWorker>(
        model, make_model_ops(*impl->leader_platform, dtype, c.cpu_gemm), c, table);
    std::vector<dist::ByteChannel*> ends;
    for (auto& e : impl->leader_ends) ends.push_back(e.get());
    return TpLeaderWorker::make(std::move(local), std::move(ends), table);
  };
}

}  // namespace pagoda::engine
