#include "pagoda/tier/controller.h"

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
      page_bytes_(kv::bytes_per_page(device)) {
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
  append(backups_.src, device_pages);
  append(backups_.dst, host_pages);
  if (peers_ != nullptr) peers_->tier_backup(device_pages, host_pages);
}

void TierController::load(std::span<const int32_t> host_pages,
                          std::span<const int32_t> device_pages) {
  PAGODA_REQUIRE(device_pages.size() == host_pages.size(), kInvalidArgument,
                 "load: {} host pages but {} device pages", host_pages.size(), device_pages.size());
  append(loads_.src, host_pages);
  append(loads_.dst, device_pages);
  if (peers_ != nullptr) peers_->tier_load(host_pages, device_pages);
}

int64_t TierController::submit(const kv::KvPool& src, kv::KvPool& dst, Pending& pending,
                               bool layer_events) {
  // The copies start after everything already enqueued on the compute stream (a K/V write or
  // move of a page being backed up, the last reader of a page being overwritten).
  const std::unique_ptr<platform::Event> compute = platform_->make_event();
  compute->record();
  stream_->wait(*compute);
  const auto runs = kv::page_copy_runs(pending.src, pending.dst);
  const kv::CopyFn copy = [this](void* d, const void* s, size_t n) { stream_->copy(d, s, n); };
  for (int32_t l = 0; l < src.num_layers(); ++l) {
    kv::copy_layer_pages(src, dst, LayerId{l}, runs, copy);
    if (layer_events) layer_.push_back(stream_->record());
  }
  last_ = stream_->record();
  const auto n = static_cast<int64_t>(pending.src.size());
  pending = Pending{};
  return n;
}

void TierController::flush() {
  if (backups_.src.empty()) return;
  const int64_t n = submit(*device_, host_->pool(), backups_, false);
  stats_.backup_pages += n;
  stats_.bytes_d2h += n * page_bytes_;
  ++stats_.backup_batches;
}

bool TierController::idle() {
  return backups_.src.empty() && loads_.src.empty() && (last_ == nullptr || last_->done());
}

void TierController::submit_loads() {
  layer_.clear();
  if (loads_.src.empty()) return;
  const int64_t n = submit(host_->pool(), *device_, loads_, true);
  stats_.load_pages += n;
  stats_.bytes_h2d += n * page_bytes_;
  ++stats_.load_batches;
}

void TierController::begin_forward() {
  flush();
  submit_loads();
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

void TierController::synchronize() {
  if (peers_ != nullptr) peers_->tier_synchronize();
  flush();
  if (!loads_.src.empty()) {
    submit_loads();
    layer_.clear();  // waited for below; a forward of this step then finds nothing pending
  }
  if (last_ == nullptr || last_->done()) return;
  const auto t0 = std::chrono::steady_clock::now();
  stream_->synchronize();
  stats_.d2h_wait_s += seconds_since(t0);
}

}  // namespace pagoda::tier
