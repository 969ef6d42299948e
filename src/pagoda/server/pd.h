#pragma once
/// Prefill–decode disaggregation in `pagoda serve` (docs/design/pd.md). Internal to the server.
///
/// A request reaches the decode server through `pagoda router`, stamped with a room id and the
/// prefill server's URL (headers kRoomHeader, kPrefillHeader). The decode server (PdDecode):
///   1. records the request (EngineLoop::submit_transfer) and preallocates its prompt's KV pages
///      like an admission (retrying until they fit or the room times out);
///   2. leases staging pages for the prompt pages it does not have (disagg::StagingPool) and POSTs
///      the bootstrap message to the prefill server's /pd/bootstrap: room, prompt, sampling, its
///      KV layout, the first prompt page to send (pages before it hold a prefix its own radix
///      cache matched), the staging pages they go to and its KvTransfer descriptor;
///   3. on the answer (first token, bytes, checksum) checks the room, the byte count and the
///      checksum of its staging pages, copies them into the pool pages (disagg::unstage), then
///      commits (EngineTransfer::commit) and decodes.
/// The prefill server (PdPrefill) checks the layout and the room, runs the prefill with its own
/// radix cache (max_new_tokens 1, hold_kv), sends the prompt's pages through its staging into the
/// decode server's staging (disagg::send_staged: layer by layer, in chunks of its staging), caches
/// its side (EngineTransfer::release_kv) and answers.
/// Any failure frees the room's pages on the side that sees it and is counted (PdRooms).
/// Thread rules: the handlers run on HTTP threads; engine work goes through EngineLoop.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/disagg/kv_layout.h"
#include "pagoda/disagg/kv_transfer.h"
#include "pagoda/disagg/staging.h"
#include "pagoda/server/engine_loop.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace pagoda::server {

/// The headers `pagoda router` stamps on a request for a decode server.
inline constexpr const char* kRoomHeader = "X-Pagoda-Bootstrap-Room";
inline constexpr const char* kPrefillHeader = "X-Pagoda-Bootstrap-Url";

enum class PdRole : uint8_t { kPrefill, kDecode };

/// Per-side room table (states, aborts) and counters, rendered into /metrics. Thread safe.
class PdRooms {
 public:
  explicit PdRooms(PdRole role) : role_(role) {}
  /// Moves a room between states ("" = not present). States: decode "preallocating",
  /// "bootstrapping" (prefill + transfer running); prefill "prefilling", "transferring".
  void set_state(uint64_t room, const std::string& state);
  /// A room ended; `failure` empty on success, else its reason (counted per reason).
  void end_room(uint64_t room, const std::string& failure);
  /// A bootstrap message or answer rejected before any room state (counted per reason).
  void reject(const std::string& reason);
  void add_transfer(uint64_t bytes, double seconds);
  /// Decode side: prompt pages a room found in this server's radix cache (not transferred).
  void add_reused(uint64_t pages);
  /// Registers a new room in `state`; false (nothing changed) when it is already live.
  bool open(uint64_t room, const std::string& state);
  /// Marks a live room aborted (its owner stops at the next check); false when unknown.
  bool abort(uint64_t room);
  bool aborted(uint64_t room) const;
  std::string render() const;

 private:
  PdRole role_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::string> rooms_;
  std::set<uint64_t> aborted_;
  std::map<std::string, int64_t> failures_, rejected_;
  int64_t completed_ = 0;
  uint64_t bytes_ = 0;
  double seconds_ = 0;
  int64_t transfers_ = 0;
  uint64_t reused_pages_ = 0;
};

/// What both roles share: the engine's platform and KV pool, the staging pool whose regions the
/// KvTransfer registers, the layout, timeouts.
struct PdContext {
  explicit PdContext(PdRole r) : role(r), rooms(r) {}
  PdRole role;
  EngineLoop* loop = nullptr;
  platform::Platform* platform = nullptr;
  kv::KvPool* pool = nullptr;  ///< the engine's (device or host)
  disagg::KvLayout layout;
  std::unique_ptr<disagg::StagingPool> staging;
  std::unique_ptr<disagg::KvTransfer> transfer;  ///< over staging->regions()
  double timeout_s = 30;
  PdRooms rooms;
};

/// /metrics of a disaggregated server: the rooms' (PdRooms::render) and the staging pages.
std::string render_pd_metrics(const PdContext& pd);
/// An event marking the current end of the engine's compute stream (recorded on the engine
/// loop's thread, between steps): copies of a room's pages wait for it.
std::unique_ptr<platform::Event> compute_mark(PdContext& pd);

// The bootstrap message's pieces (pd_common.cpp).
nlohmann::json layout_json(const disagg::KvLayout& l);
/// Throws ApiError(400) naming the field.
disagg::KvLayout parse_layout(const nlohmann::json& j);
std::string to_hex(std::span<const std::byte> bytes);
/// Throws ApiError(400) for a string that is not hex.
std::vector<std::byte> from_hex(const std::string& hex);

/// Builds the context of `role` over `engine`'s KV pool on `platform` (call before the loop
/// starts), with a staging pool of `staging_tokens` tokens (rounded up to pages; 0: the engine's
/// context length). Throws Error(kUnsupported) for an MLA pool or a build without the transfer
/// engine, kResourceExhausted when the pinned staging cannot be allocated.
std::unique_ptr<PdContext> make_pd_context(PdRole role, engine::Engine& engine,
                                           platform::Platform& platform, EngineLoop& loop,
                                           const std::string& model, uint64_t weights,
                                           double timeout_s, int64_t staging_tokens);

/// Decode side: runs steps 1–3 above for one request and returns its stream, whose first token
/// is already pushed. Throws ApiError: 503 (no room before the timeout, queue full), 502 (the
/// prefill server failed, refused or is unreachable; layout mismatch; short or corrupt
/// transfer), 504 (timed out); the room's pages are freed first.
std::shared_ptr<RequestStream> pd_decode_room(PdContext& pd, engine::GenerateRequest request,
                                              uint64_t room, const std::string& prefill_url);

/// Prefill side: POST /pd/bootstrap and POST /pd/abort ({"room"}: a decode server gave up on it).
void handle_pd_bootstrap(PdContext& pd, const httplib::Request& req, httplib::Response& res);
void handle_pd_abort(PdContext& pd, const httplib::Request& req, httplib::Response& res);

}  // namespace pagoda::server
