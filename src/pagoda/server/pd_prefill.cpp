// Disaggregation, prefill side: POST /pd/bootstrap (prefill a room and write its KV into the
// decode server's pages) and POST /pd/abort (pd.h).
#include <httplib.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/api_request.h"
#include "pagoda/server/http_server.h"
#include "pagoda/server/pd.h"
#include "pagoda/server/server_state.h"

namespace pagoda::server {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWaitMs = 50;

/// The bootstrap message (pd.h, step 2), validated.
struct Bootstrap {
  uint64_t room = 0;
  engine::GenerateRequest request;
  disagg::KvLayout layout;
  std::vector<PageId> pages;  ///< the decode server's staging pages of prompt pages start_page...
  size_t start_page = 0;  ///< pages before it are in the decode server's cache: not sent
  std::vector<std::byte> descriptor;
};

Bootstrap parse_bootstrap(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw_invalid("body", "not a JSON object");
  auto get = [&](const char* key) -> const json& {
    auto it = j.find(key);
    if (it == j.end()) throw_invalid(key, "is missing");
    return *it;
  };
  Bootstrap b;
  if (!get("room").is_number_unsigned()) throw_invalid("room", "must be a non-negative integer");
  b.room = get("room").get<uint64_t>();
  if (!get("prompt").is_array() || get("prompt").empty())
    throw_invalid("prompt", "must be a non-empty array of token ids");
  for (const json& t : get("prompt")) {
    if (!t.is_number_integer()) throw_invalid("prompt", "must hold integers");
    b.request.prompt.push_back(t.get<int32_t>());
  }
  auto number = [&](const char* key) {
    if (!get(key).is_number()) throw_invalid(key, "must be a number");
    return get(key);
  };
  b.request.sampling.temperature = number("temperature").get<float>();
  b.request.sampling.top_p = number("top_p").get<float>();
  b.request.sampling.top_k = number("top_k").get<int32_t>();
  b.request.sampling.min_p = number("min_p").get<float>();
  if (!get("seed").is_number_unsigned()) throw_invalid("seed", "must be a non-negative integer");
  b.request.sampling.seed = get("seed").get<uint64_t>();
  if (!get("extra_key").is_string()) throw_invalid("extra_key", "must be a string");
  b.request.extra_key = get("extra_key").get<std::string>();
  b.request.max_new_tokens = 1;
  b.request.ignore_eos = true;  // the decode server applies EOS to the first token itself
  b.request.hold_kv = true;
  b.layout = parse_layout(get("layout"));
  if (!get("pages").is_array()) throw_invalid("pages", "must be an array of page ids");
  for (const json& p : get("pages")) {
    if (!p.is_number_unsigned() || p.get<uint64_t>() == 0 || p.get<uint64_t>() > INT32_MAX)
      throw_invalid("pages", "must hold page ids >= 1");
    b.pages.emplace_back(p.get<int32_t>());
  }
  if (!get("start_page").is_number_unsigned() || get("start_page").get<uint64_t>() > INT32_MAX)
    throw_invalid("start_page", "must be a page index");
  b.start_page = get("start_page").get<size_t>();
  if (!get("descriptor").is_string()) throw_invalid("descriptor", "must be a hex string");
  b.descriptor = from_hex(get("descriptor").get<std::string>());
  return b;
}

/// Ends a room: releases a held request's KV and counts the outcome.
struct PrefillRoom {
  PdContext& pd;
  uint64_t room;
  std::shared_ptr<RequestStream> stream;
  engine::RequestId held = -1;  ///< the finished request whose KV is held
  std::string failure = "aborted";
  ~PrefillRoom() {
    if (held >= 0) {
      try {
        pd.loop->run_on_loop([id = held](engine::Engine& e) {
          e.transfer().release_kv(id);
          e.release(id);
        });
      } catch (const std::exception&) {  // shutting down: the process frees everything
      }
    } else if (stream != nullptr) {
      pd.loop->cancel(stream);
    }
    pd.rooms.end_room(room, failure);
  }
  [[noreturn]] void fail(const std::string& reason, int status, const std::string& message) {
    failure = reason;
    throw ApiError(status, status < 500 ? "invalid_request_error" : "server_error", message);
  }
};

}  // namespace

void handle_pd_bootstrap(PdContext& pd, const httplib::Request& req, httplib::Response& res) {
  try {
    Bootstrap b;
    try {
      b = parse_bootstrap(req.body);
    } catch (const ApiError&) {
      pd.rooms.reject("malformed_bootstrap");
      throw;
    }
    if (const std::string m = disagg::layout_mismatch(pd.layout, b.layout); !m.empty()) {
      pd.rooms.reject("layout_mismatch");
      throw ApiError(400, "invalid_request_error", "layout mismatch: " + m, "layout");
    }
    const size_t want_pages =
        (b.request.prompt.size() + static_cast<size_t>(pd.layout.page_size) - 1) /
        static_cast<size_t>(pd.layout.page_size);
    if (b.start_page >= want_pages || b.pages.size() != want_pages - b.start_page) {
      pd.rooms.reject("malformed_bootstrap");
      throw_invalid("pages", std::to_string(b.pages.size()) + " pages from page " +
                                 std::to_string(b.start_page) + " for a prompt of " +
                                 std::to_string(b.request.prompt.size()) + " tokens (" +
                                 std::to_string(want_pages) + " pages)");
    }
    if (!pd.rooms.open(b.room, "prefilling")) {
      pd.rooms.reject("duplicate_room");
      throw ApiError(409, "invalid_request_error",
                     "room " + std::to_string(b.room) + " is already live on this prefill server",
                     "room");
    }
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(pd.timeout_s));
    PrefillRoom room{pd, b.room, nullptr};
    auto gone = [&] { return HttpServer::client_gone() || pd.rooms.aborted(b.room); };
    try {
      room.stream = pd.loop->submit(std::move(b.request));
    } catch (const ApiError& e) {
      room.fail("busy", e.status, e.what());
    }
    // The prefill (its own radix cache, max_new_tokens 1, KV held).
    RequestStream::Update u;
    std::vector<int32_t> tokens;
    for (;;) {
      u = room.stream->wait(kWaitMs);
      tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
      if (u.finished) break;
      if (gone()) room.fail("decode_gone", 499, "the decode server gave up on the room");
      if (Clock::now() > deadline) room.fail("timeout", 504, "the prefill timed out");
    }
    room.stream = nullptr;
    if (u.reason != engine::FinishReason::kError && u.reason != engine::FinishReason::kAbort)
      room.held = u.id;  // finished normally: its KV is held (hold_kv)
    if (room.held < 0 || tokens.empty())
      room.fail("prefill_error", u.error_status ? u.error_status : 500, u.error);
    std::vector<PageId> src;
    std::unique_ptr<platform::Event> computed;  // the prefill's KV writes are before it
    pd.loop->run_on_loop([&](engine::Engine& e) {
      src = e.transfer().prompt_pages(u.id);
      computed = pd.platform->make_event();
      computed->record();
    });
    src.erase(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(b.start_page));

    // The transfer: through the staging, layer by layer (K and V regions), checking between
    // layers that the decode server still waits.
    pd.rooms.set_state(b.room, "transferring");
    const auto t0 = Clock::now();
    const disagg::PutFn put = [&](std::span<const disagg::WriteOp> ops) {
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      return pd.transfer->write(b.descriptor, ops, std::max(left, 0.0));
    };
    const disagg::StagedSend sent = disagg::send_staged(
        *pd.platform, *pd.pool, computed.get(), *pd.staging, src, b.pages, put, gone, deadline);
    if (sent.stopped) room.fail("decode_gone", 499, "the decode server gave up on the room");
    const disagg::TransferResult& t = sent.transfer;
    if (!t.ok)
      room.fail(t.timed_out ? "timeout" : "transfer_failed", t.timed_out ? 504 : 502,
                "KV transfer to the decode server failed: " + t.error);
    const uint64_t bytes = t.bytes;
    const uint64_t checksum = sent.checksum;
    pd.rooms.add_transfer(bytes, std::chrono::duration<double>(Clock::now() - t0).count());
    room.failure.clear();
    res.set_content(json{{"room", b.room},
                         {"first_token", tokens.front()},
                         {"bytes", bytes},
                         {"checksum", checksum}}
                        .dump(),
                    "application/json");
  } catch (const ApiError& e) {
    set_error(res, e);
  } catch (const Error& e) {  // a descriptor or page map the transfer refused
    pd.rooms.reject("malformed_bootstrap");
    set_error(res, ApiError(400, "invalid_request_error", e.what()));
  }
}

void handle_pd_abort(PdContext& pd, const httplib::Request& req, httplib::Response& res) {
  const json j = json::parse(req.body, nullptr, false);
  if (!j.is_object() || !j.contains("room") || !j["room"].is_number_unsigned()) {
    pd.rooms.reject("malformed_abort");
    set_error(res, ApiError(400, "invalid_request_error", "expected {\"room\": id}", "room"));
    return;
  }
  const auto room = j["room"].get<uint64_t>();
  if (!pd.rooms.abort(room)) {
    pd.rooms.reject("unknown_room");
    set_error(res, ApiError(404, "invalid_request_error",
                            "room " + std::to_string(room) + " is not live here", "room"));
    return;
  }
  res.set_content(json{{"room", room}, {"aborted", true}}.dump(), "application/json");
}

}  // namespace pagoda::server
