// KvTransfer over UCX (ucp RMA): the receiver maps its regions (ucp_mem_map) and publishes its
// worker address and packed remote keys; the sender connects an endpoint per peer, unpacks the
// keys and issues ucp_put_nbx per op, then flushes the endpoint. Each side runs a progress thread
// (UCX may emulate RMA in software over TCP, which needs the target to progress).
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "pagoda/core/error.h"
#include "pagoda/disagg/kv_transfer.h"
#include "pagoda/dist/wire.h"

namespace pagoda::disagg {

namespace {

using dist::WireReader;
using dist::WireWriter;

constexpr uint32_t kDescriptorMagic = 0x50445543;  // "PDUC"
constexpr int kProgressPollMs = 2;

void check_ucs(ucs_status_t s, const char* what) {
  PAGODA_REQUIRE(s == UCS_OK, kInternal, "UCX {} failed: {}", what, ucs_status_string(s));
}

/// A peer's regions as its descriptor states them.
struct RemoteRegion {
  uint64_t base = 0;
  uint64_t bytes = 0;
  std::vector<std::byte> rkey;
};

struct ParsedDescriptor {
  std::vector<std::byte> address;
  std::vector<RemoteRegion> regions;
};

ParsedDescriptor parse_descriptor(std::span<const std::byte> bytes) {
  WireReader r(bytes);
  PAGODA_REQUIRE(r.get<uint32_t>() == kDescriptorMagic, kInvalidArgument,
                 "KV transfer descriptor: not a UCX descriptor");
  ParsedDescriptor d;
  r.get_vec(d.address);
  const auto n = r.get<uint32_t>();
  PAGODA_REQUIRE(n <= 1u << 20, kInvalidArgument, "KV transfer descriptor: {} regions", n);
  for (uint32_t i = 0; i < n; ++i) {
    RemoteRegion g;
    g.base = r.get<uint64_t>();
    g.bytes = r.get<uint64_t>();
    r.get_vec(g.rkey);
    d.regions.push_back(std::move(g));
  }
  PAGODA_REQUIRE(r.remaining() == 0 && !d.address.empty(), kInvalidArgument,
                 "KV transfer descriptor: malformed");
  return d;
}

/// Waits for `request` (a ucs_status_ptr_t of a non-blocking call) to complete, progressing
/// `worker`, until `deadline`. Frees the request. Returns its status (UCS_ERR_TIMED_OUT: not
/// complete in time; the request is then left to complete after a forced close).
ucs_status_t wait_request(ucp_worker_h worker, ucs_status_ptr_t request,
                          std::chrono::steady_clock::time_point deadline) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  ucs_status_t s = UCS_INPROGRESS;
  for (;;) {
    s = ucp_request_check_status(request);
    if (s != UCS_INPROGRESS) break;
    if (ucp_worker_progress(worker) == 0) {
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  ucp_request_free(request);
  return s == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : s;
}

class UcxTransfer;

/// A connected peer: its endpoint and unpacked keys. Closed (forced) when dropped.
struct Peer {
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::vector<ucp_rkey_h> rkeys;
  std::vector<RemoteRegion> regions;
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex mu;  ///< guards `failure`

  ~Peer() {
    for (ucp_rkey_h k : rkeys) ucp_rkey_destroy(k);
    if (ep != nullptr) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      wait_request(worker, ucp_ep_close_nbx(ep, &p),
                   std::chrono::steady_clock::now() + std::chrono::seconds(5));
    }
  }
};

extern "C" void on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  {
    std::lock_guard lock(peer->mu);
    peer->failure = ucs_status_string(status);
  }
  peer->failed = true;
}

class UcxTransfer final : public KvTransfer {
 public:
  explicit UcxTransfer(std::span<const MemRegion> regions)
      : regions_(regions.begin(), regions.end()) {
    ucp_config_t* config = nullptr;
    check_ucs(ucp_config_read(nullptr, nullptr, &config), "config read");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    const ucs_status_t s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check_ucs(s, "init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    if (const ucs_status_t ws = ucp_worker_create(context_, &wp, &worker_); ws != UCS_OK) {
      ucp_cleanup(context_);
      check_ucs(ws, "worker create");
    }
    try {
      ucp_address_t* addr = nullptr;
      size_t len = 0;
      check_ucs(ucp_worker_get_address(worker_, &addr, &len), "worker address");
      const auto* p = reinterpret_cast<const std::byte*>(addr);
      address_.assign(p, p + len);
      ucp_worker_release_address(worker_, addr);
      for (const MemRegion& r : regions_) {
        PAGODA_REQUIRE(r.base != nullptr && r.bytes > 0, kInvalidArgument,
                       "KV transfer: an empty memory region");
        ucp_mem_map_params_t mp{};
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = r.base;
        mp.length = r.bytes;
        ucp_mem_h memh = nullptr;
        check_ucs(ucp_mem_map(context_, &mp, &memh), "mem map");
        memh_.push_back(memh);
        void* rkey = nullptr;
        size_t rkey_len = 0;
        check_ucs(ucp_rkey_pack(context_, memh, &rkey, &rkey_len), "rkey pack");
        const auto* k = static_cast<const std::byte*>(rkey);
        rkeys_.emplace_back(k, k + rkey_len);
        ucp_rkey_buffer_release(rkey);
      }
      check_ucs(ucp_worker_get_efd(worker_, &efd_), "event fd");
    } catch (...) {
      teardown();
      throw;
    }
    progress_ = std::thread([this] { progress_loop(); });
  }

  ~UcxTransfer() override {
    stop_ = true;
    ucp_worker_signal(worker_);
    progress_.join();
    teardown();
  }

  std::string name() const override { return "ucx"; }

  std::vector<std::byte> descriptor() const override {
    std::vector<std::byte> out;
    WireWriter w(out);
    w.put(kDescriptorMagic);
    w.put_vec(address_);
    w.put(static_cast<uint32_t>(regions_.size()));
    for (size_t i = 0; i < regions_.size(); ++i) {
      w.put(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(regions_[i].base)));
      w.put(static_cast<uint64_t>(regions_[i].bytes));
      w.put_vec(rkeys_[i]);
    }
    return out;
  }

  TransferResult write(std::span<const std::byte> peer_desc, std::span<const WriteOp> ops,
                       double timeout_s) override {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    const std::string key(reinterpret_cast<const char*>(peer_desc.data()), peer_desc.size());
    std::shared_ptr<Peer> peer;
    {
      std::lock_guard lock(mu_);
      auto it = peers_.find(key);
      if (it != peers_.end()) peer = it->second;
    }
    if (peer == nullptr) {
      ParsedDescriptor d = parse_descriptor(peer_desc);
      check_ops(ops, d.regions);
      peer = connect(std::move(d));
      std::lock_guard lock(mu_);
      peers_[key] = peer;
    } else {
      check_ops(ops, peer->regions);
    }
    TransferResult res;
    auto fail = [&](const std::string& why, bool timed_out) {
      res.ok = false;
      res.timed_out = timed_out;
      res.error = why;
      std::lock_guard lock(mu_);
      peers_.erase(key);  // the next write reconnects; the endpoint closes with its last user
      return res;
    };
    for (const WriteOp& op : ops) {
      if (peer->failed) break;
      ucp_request_param_t p{};
      const auto* src = static_cast<const std::byte*>(regions_[op.src_region].base) + op.src_offset;
      ucs_status_ptr_t r =
          ucp_put_nbx(peer->ep, src, op.bytes, peer->regions[op.dst_region].base + op.dst_offset,
                      peer->rkeys[op.dst_region], &p);
      if (UCS_PTR_IS_ERR(r))
        return fail(std::string("put failed: ") + ucs_status_string(UCS_PTR_STATUS(r)), false);
      if (r != nullptr) ucp_request_free(r);  // completes in order before the flush below
      res.bytes += op.bytes;
      if (std::chrono::steady_clock::now() > deadline) break;
    }
    ucp_request_param_t p{};
    const ucs_status_t s = peer->failed ? UCS_ERR_ENDPOINT_TIMEOUT
                                        : wait_request(worker_, ucp_ep_flush_nbx(peer->ep, &p),
                                                       deadline);
    if (peer->failed) {
      std::lock_guard lock(peer->mu);
      return fail("the peer failed: " + peer->failure, false);
    }
    if (s == UCS_ERR_TIMED_OUT || std::chrono::steady_clock::now() > deadline)
      return fail("timed out after " + std::to_string(timeout_s) + " s", true);
    if (s != UCS_OK) return fail(std::string("flush failed: ") + ucs_status_string(s), false);
    res.ok = true;
    return res;
  }

 private:
  void check_ops(std::span<const WriteOp> ops, const std::vector<RemoteRegion>& remote) const {
    for (const WriteOp& op : ops) {
      PAGODA_REQUIRE(op.src_region < regions_.size() && op.dst_region < remote.size() &&
                         op.bytes <= regions_[op.src_region].bytes &&
                         op.src_offset <= regions_[op.src_region].bytes - op.bytes &&
                         op.bytes <= remote[op.dst_region].bytes &&
                         op.dst_offset <= remote[op.dst_region].bytes - op.bytes,
                     kInvalidArgument,
                     "KV transfer: write of {} bytes ({}:{} -> {}:{}) outside the regions",
                     op.bytes, op.src_region, op.src_offset, op.dst_region, op.dst_offset);
    }
  }

  std::shared_ptr<Peer> connect(ParsedDescriptor d) {
    auto peer = std::make_shared<Peer>();
    peer->worker = worker_;
    peer->regions = std::move(d.regions);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(d.address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_peer_error;
    ep.err_handler.arg = peer.get();
    check_ucs(ucp_ep_create(worker_, &ep, &peer->ep), "endpoint create");
    for (const RemoteRegion& g : peer->regions) {
      ucp_rkey_h k = nullptr;
      check_ucs(ucp_ep_rkey_unpack(peer->ep, g.rkey.data(), &k), "rkey unpack");
      peer->rkeys.push_back(k);
    }
    return peer;
  }

  void progress_loop() {
    while (!stop_) {
      while (ucp_worker_progress(worker_) != 0) {
      }
      const ucs_status_t s = ucp_worker_arm(worker_);
      if (s == UCS_ERR_BUSY) continue;
      pollfd fd{.fd = efd_, .events = POLLIN, .revents = 0};
      ::poll(&fd, 1, kProgressPollMs);
    }
  }

  void teardown() {
    {
      std::lock_guard lock(mu_);
      peers_.clear();
    }
    for (ucp_mem_h m : memh_) ucp_mem_unmap(context_, m);
    memh_.clear();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    worker_ = nullptr;
    if (context_ != nullptr) ucp_cleanup(context_);
    context_ = nullptr;
  }

  std::vector<MemRegion> regions_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<ucp_mem_h> memh_;
  std::vector<std::byte> address_;
  std::vector<std::vector<std::byte>> rkeys_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

}  // namespace

bool have_ucx_transfer() { return true; }

std::unique_ptr<KvTransfer> make_ucx_transfer(std::span<const MemRegion> regions) {
  return std::make_unique<UcxTransfer>(regions);
}

}  // namespace pagoda::disagg
