// Disaggregation, decode side: preallocate the prompt's pages, bootstrap the prefill server,
// check what arrived, commit (pd.h).
#include <httplib.h>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "pagoda/core/error.h"
#include "pagoda/server/api_request.h"
#include "pagoda/server/pd.h"

namespace pagoda::server {

using nlohmann::json;

namespace {

constexpr int kPreallocRetryMs = 5;
constexpr int kAbortNoticeTimeoutS = 1;
constexpr int kDeadlineSlackMs = 100;

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

/// Frees the room's pages (abort) and counts the failure unless committed.
struct RoomGuard {
  PdContext& pd;
  uint64_t room;
  std::shared_ptr<RequestStream> stream;
  bool committed = false;
  std::string failure = "aborted";
  ~RoomGuard() {
    if (!committed) pd.loop->cancel(stream);
    pd.rooms.end_room(room, committed ? std::string() : failure);
  }
  [[noreturn]] void fail(const std::string& reason, int status, const std::string& message) {
    failure = reason;
    throw ApiError(status,
                   status == 503   ? "service_unavailable"
                   : status < 500 ? "invalid_request_error"
                                  : "server_error",
                   message);
  }
};

json bootstrap_body(const PdContext& pd, const engine::GenerateRequest& g, uint64_t room,
                    std::span<const PageId> pages, size_t start_page) {
  json ids = json::array();
  for (PageId p : pages) ids.push_back(p.value());
  return {{"room", room},
          {"prompt", g.prompt},
          {"temperature", g.sampling.temperature},
          {"top_p", g.sampling.top_p},
          {"top_k", g.sampling.top_k},
          {"min_p", g.sampling.min_p},
          {"seed", g.sampling.seed},
          {"extra_key", g.extra_key},
          {"layout", layout_json(pd.layout)},
          {"pages", std::move(ids)},
          {"start_page", start_page},
          {"descriptor", to_hex(pd.transfer->descriptor())}};
}

/// Best effort: tells the prefill server to stop working on `room`.
void send_abort(const std::string& prefill_url, uint64_t room) {
  httplib::Client cli(prefill_url);
  cli.set_connection_timeout(kAbortNoticeTimeoutS, 0);
  cli.set_read_timeout(kAbortNoticeTimeoutS, 0);
  cli.Post("/pd/abort", json{{"room", room}}.dump(), "application/json");
}

}  // namespace

std::shared_ptr<RequestStream> pd_decode_room(PdContext& pd, engine::GenerateRequest g,
                                              uint64_t room, const std::string& prefill_url) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(pd.timeout_s));
  if (!pd.rooms.open(room, "preallocating")) {
    pd.rooms.reject("duplicate_room");
    throw ApiError(409, "invalid_request_error",
                   "room " + std::to_string(room) + " is already live on this decode server");
  }
  std::shared_ptr<RequestStream> stream;
  engine::RequestId id = -1;
  try {
    std::tie(stream, id) = pd.loop->submit_transfer(g);
  } catch (...) {
    pd.rooms.end_room(room, "rejected");
    throw;
  }
  RoomGuard guard{pd, room, stream};

  // 1. Preallocate (an admission: it waits for room like a queued request).
  // Pages [0, start) hold a prefix this server's radix cache already had: not transferred.
  std::vector<PageId> pages;
  size_t start = 0;
  for (;;) {
    bool ok = false;
    pd.loop->run_on_loop([&](engine::Engine& e) {
      ok = e.transfer().preallocate(id);
      if (ok) {
        pages = e.transfer().prompt_pages(id);
        start = static_cast<size_t>(e.output(id).cached_tokens / pd.layout.page_size);
      }
    });
    if (ok) break;
    if (Clock::now() > deadline)
      guard.fail("no_kv_room", 503, "no KV room for the prompt within the room timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(kPreallocRetryMs));
  }

  // Staging pages for the pages to receive: the whole room at once (the prefill server's answer
  // is the only sign that they are complete).
  const auto moved = std::span<const PageId>(pages).subspan(start);
  if (moved.size() > static_cast<size_t>(pd.staging->capacity()))
    guard.fail("staging_too_small", 400,
               "the prompt's KV (" + std::to_string(moved.size()) +
                   " pages to transfer) exceeds this decode server's transfer staging (" +
                   std::to_string(pd.staging->capacity()) +
                   " pages): raise --disaggregation-staging-tokens");
  disagg::StagingLease staging;
  for (;;) {
    staging = pd.staging->take(static_cast<int32_t>(moved.size()));
    if (!staging.empty()) break;
    if (Clock::now() > deadline)
      guard.fail("no_staging_room", 503, "no transfer staging free within the room timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(kPreallocRetryMs));
  }

  // 2. Bootstrap: the prefill server prefills and writes the pages into the staging.
  pd.rooms.set_state(room, "bootstrapping");
  const auto t0 = Clock::now();
  httplib::Client cli(prefill_url);
  if (!cli.is_valid())
    guard.fail("bad_prefill_url", 400, "bad prefill server URL '" + prefill_url + "'");
  const double left = std::max(0.001, seconds_left(deadline));
  const auto sec = static_cast<time_t>(left);
  const auto usec = static_cast<time_t>((left - static_cast<double>(sec)) * 1e6);
  cli.set_connection_timeout(sec, usec);
  cli.set_read_timeout(sec, usec);
  cli.set_write_timeout(sec, usec);
  const httplib::Result res =
      cli.Post("/pd/bootstrap", bootstrap_body(pd, g, room, staging.pages(), start).dump(),
               "application/json");
  if (!res) {
    // A read that ends at the deadline is the timeout (httplib rounds it); one that ends earlier
    // is a lost connection.
    const bool timed_out = res.error() == httplib::Error::Read &&
                           Clock::now() + std::chrono::milliseconds(kDeadlineSlackMs) >= deadline;
    if (timed_out) {
      send_abort(prefill_url, room);
      guard.fail("timeout", 504, "the prefill server " + prefill_url + " did not finish room " +
                                     std::to_string(room) + " within " +
                                     std::to_string(pd.timeout_s) + " s");
    }
    guard.fail("prefill_lost", 502, "the prefill server " + prefill_url +
                                        " failed or is unreachable (" +
                                        httplib::to_string(res.error()) + ")");
  }
  const json answer = json::parse(res->body, nullptr, false);
  if (res->status != 200) {
    std::string msg = "HTTP " + std::to_string(res->status);
    if (answer.is_object() && answer.contains("error") && answer["error"].is_object())
      msg = answer["error"].value("message", msg);
    guard.fail(res->status == 409 ? "prefill_rejected" : "prefill_error",
               res->status == 503 ? 503 : 502, "the prefill server " + prefill_url + ": " + msg);
  }

  // 3. Check what arrived, then commit.
  const auto field = [&](const char* key) -> uint64_t {
    if (!answer.is_object() || !answer.contains(key) || !answer[key].is_number_unsigned()) {
      pd.rooms.reject("malformed_answer");
      guard.fail("malformed_answer", 502,
                 std::string("the prefill server's answer has no valid '") + key + "'");
    }
    return answer[key].get<uint64_t>();
  };
  if (field("room") != room) {
    pd.rooms.reject("unknown_room");
    guard.fail("unknown_room", 502, "the prefill server answered for room " +
                                        std::to_string(field("room")) + ", not " +
                                        std::to_string(room));
  }
  uint64_t expected = 0;
  for (uint64_t b : pd.staging->page_bytes()) expected += b * moved.size();
  if (field("bytes") != expected) {
    pd.rooms.reject("short_transfer");
    guard.fail("short_transfer", 502, "short KV transfer: " + std::to_string(field("bytes")) +
                                          " of " + std::to_string(expected) + " bytes");
  }
  if (field("checksum") !=
      disagg::pages_checksum(pd.staging->regions(), pd.staging->page_bytes(), staging.pages())) {
    pd.rooms.reject("corrupt_transfer");
    guard.fail("corrupt_transfer", 502, "corrupt KV transfer: the checksum of the received pages "
                                        "differs from the prefill server's");
  }
  // Into the pool pages, after the compute stream's last use of them (a previous owner's).
  try {
    disagg::unstage(*pd.platform, *pd.staging, staging.pages(), *pd.pool, moved,
                    compute_mark(pd).get());
  } catch (const Error& e) {
    guard.fail("unstage_failed", 502, std::string("cannot copy the received KV into the pool: ") +
                                          e.what());
  }
  staging = disagg::StagingLease();
  const auto first = static_cast<int32_t>(field("first_token"));
  pd.rooms.add_transfer(expected, std::chrono::duration<double>(Clock::now() - t0).count());
  pd.rooms.add_reused(start);
  try {
    pd.loop->run_on_loop([&](engine::Engine& e) {
      e.transfer().commit(id, first);
      stream->push(first, nullptr);
      stream->notify();
    });
  } catch (const Error& e) {  // cancelled meanwhile (client gone), or a token outside the vocabulary
    guard.fail("commit_failed", 502, std::string("cannot commit the transferred room: ") + e.what());
  }
  guard.committed = true;
  return stream;
}

}  // namespace pagoda::server
