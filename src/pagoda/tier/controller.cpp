#include "pagoda/tier/controller.h"

#include <algorithm>
#include <utility>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::tier {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void append(std::vector<int32_t>& dst, std::span<const int32_t> src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

}  // namespace

TierController::TierController(platform::Platform& platform, kv::KvPool& device,
                               kv::HostKvPool& host, TierPeers* peers)
    : platform_(&platform),
      device_(&device),
      host_(&host),
      peers_(peers),
      stream_(platform.make_copy_stream()),
      page_bytes_(kv::bytes_per_page(device)),
      touched_(static_cast<size_t>(device.config().num_pages) + 1, 0),
      flag_(touched_.size(), 0) {
  PAGODA_REQUIRE(host.pool().config().page_size == device.page_size() &&
                     kv::bytes_per_page(host.pool()) == page_bytes_,
                 kInvalidArgument, "tier controller: host and device pools differ in geometry");
  if (peers_ != nullptr) peers_->tier_start(host.num_pages());
}

TierController::~TierController() {
  end_forward();
  stream_->synchronize();
}

void TierController::backup(std::span<const int32_t> device_pages,
                            std::span<const int32_t> host_pages) {
  PAGODA_REQUIRE(device_pages.size() == host_pages.size(), kInvalidArgument,
                 "backup: {} device pages but {} host pages", device_pages.size(), host_pages.size());
  append(queued_.backup_device, device_pages);
  append(queued_.backup_host, host_pages);
}

void TierController::load(std::span<const int32_t> host_pages,
                          std::span<const int32_t> device_pages) {
  PAGODA_REQUIRE(device_pages.size() == host_pages.size(), kInvalidArgument,
                 "load: {} host pages but {} device pages", host_pages.size(), device_pages.size());
  append(queued_.load_host, host_pages);
  append(queued_.load_device, device_pages);
}

StepCopies TierController::take() { return std::exchange(queued_, StepCopies{}); }

void TierController::submit(const kv::KvPool& from, kv::KvPool& to, std::span<const int32_t> src,
                            std::span<const int32_t> dst, bool layer_events) {
  // The copies start after everything already enqueued on the compute stream (a K/V write or
  // move of a page being backed up, the last reader of a page being overwritten).
  const std::unique_ptr<platform::Event> compute = platform_->make_event();
  compute->record();
  stream_->wait(*compute);
  const auto runs = kv::page_copy_runs(src, dst);
  // One batch per layer (its K and V runs): shuffled pages make runs of one page, and one
  // copy call each cost more host time than the step (1de75ef: ~7,400 pages loaded, x 16
  // layers x K/V).
  std::vector<platform::CopyStream::Op> ops;
  const kv::CopyFn collect = [&ops](void* d, const void* s, size_t n) { ops.push_back({d, s, n}); };
  for (int32_t l = 0; l < from.num_layers(); ++l) {
    ops.clear();
    kv::copy_layer_pages(from, to, LayerId{l}, runs, collect);
    stream_->copy_batch(ops);
    if (layer_events) layer_.push_back(stream_->record());
  }
  last_ = stream_->record();
  ++submissions_;
  for (int32_t page : &from == device_ ? src : dst)
    touched_.at(static_cast<size_t>(page)) = submissions_;
  while (!marks_.empty() && marks_.front().second->done()) marks_.pop_front();
  marks_.emplace_back(submissions_, last_);
}

void TierController::submit_all(const StepCopies& c, bool layer_events) {
  if (!c.backup_device.empty()) {
    submit(*device_, host_->pool(), c.backup_device, c.backup_host, false);
    const auto n = static_cast<int64_t>(c.backup_device.size());
    stats_.backup_pages += n;
    stats_.bytes_d2h += n * page_bytes_;
    ++stats_.backup_batches;
  }
  layer_.clear();
  if (!c.load_host.empty()) {
    submit(host_->pool(), *device_, c.load_host, c.load_device, layer_events);
    const auto n = static_cast<int64_t>(c.load_host.size());
    stats_.load_pages += n;
    stats_.bytes_h2d += n * page_bytes_;
    ++stats_.load_batches;
  }
}

void TierController::flush() {
  if (queued_.backup_device.empty()) return;
  StepCopies b;
  b.backup_device = std::move(queued_.backup_device);
  b.backup_host = std::move(queued_.backup_host);
  queued_.backup_device.clear();
  queued_.backup_host.clear();
  if (peers_ != nullptr) {
    peers_->tier_copies(b, false);
    peers_unsynced_ = true;
  }
  submit_all(b, false);
}

bool TierController::idle() {
  return queued_.empty() && (last_ == nullptr || last_->done());
}

void TierController::begin_forward(StepCopies copies) {
  if (peers_ != nullptr && !copies.empty()) {
    peers_->tier_copies(copies, false);
    peers_unsynced_ = true;
  }
  submit_all(copies, true);
  device_->set_layer_gate(this);
  gate_installed_ = true;
}

void TierController::end_forward() {
  if (!gate_installed_) return;
  // A step whose forward read none of this step's loaded pages (a load for a request that was
  // not admitted after all) still leaves them complete for whoever reads them next.
  if (!layer_.empty() && !layer_.back()->done()) platform_->wait_event(*layer_.back());
  device_->set_layer_gate(nullptr);
  gate_installed_ = false;
  layer_.clear();
}

void TierController::wait(LayerId layer) {
  const auto l = static_cast<size_t>(layer.value());
  if (l >= layer_.size()) return;  // nothing loaded this step
  platform::Event& e = *layer_[l];
  if (e.done()) return;
  const auto t0 = std::chrono::steady_clock::now();
  ++stats_.load_stalls;
  platform_->wait_event(e);
  stats_.load_stall_s += seconds_since(t0);
}

void TierController::quiesce_pages(std::span<const int32_t> device_pages) {
  if (peers_ != nullptr) return synchronize();
  if (barrier_) barrier_();  // the step in flight has submitted its copies
  flush();  // queued backups (of these pages, say) run now and leave their marks
  for (int32_t page : device_pages) flag_.at(static_cast<size_t>(page)) = 1;
  bool loading = false;  // a queued load-back into one of them: not expected, waited for whole
  for (int32_t page : queued_.load_device) loading |= flag_[static_cast<size_t>(page)] != 0;
  uint64_t need = 0;
  for (int32_t page : device_pages) {
    flag_[static_cast<size_t>(page)] = 0;
    need = std::max(need, touched_[static_cast<size_t>(page)]);
  }
  if (loading) return synchronize();
  // Marks complete in submission order: the first one at or after `need` covers it.
  while (!marks_.empty() && marks_.front().first < need) marks_.pop_front();
  if (marks_.empty() || marks_.front().first != need) return;  // done and dropped, or none
  platform::Event& e = *marks_.front().second;
  if (e.done()) return;
  const auto t0 = std::chrono::steady_clock::now();
  e.synchronize();
  ++stats_.copy_waits;
  stats_.d2h_wait_s += seconds_since(t0);
}

void TierController::synchronize() {
  if (barrier_) barrier_();
  const StepCopies c = take();
  if (peers_ != nullptr && (peers_unsynced_ || !c.empty())) {
    peers_->tier_copies(c, true);
    peers_unsynced_ = false;
  }
  submit_all(c, false);  // loads waited for below: a forward of this step finds nothing pending
  if (last_ == nullptr || last_->done()) return;
  const auto t0 = std::chrono::steady_clock::now();
  stream_->synchronize();
  ++stats_.copy_waits;
  stats_.d2h_wait_s += seconds_since(t0);
}

}  // namespace pagoda::tier
