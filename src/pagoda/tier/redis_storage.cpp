// The storage tier on a Redis / Valkey server (hiredis): one string per page, pipelined batches,
// timeouts, reconnection with back-off. Contract: storage.h (make_redis_storage) and
// docs/design/tier.md "Storage tier".
#include <hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/core/log.h"
#include "pagoda/tier/page_record.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {
namespace {

using Clock = std::chrono::steady_clock;
using Reply = std::unique_ptr<redisReply, decltype(&freeReplyObject)>;

/// hiredis writes with write(): a write into a connection the server closed raises SIGPIPE, whose
/// default action ends the process. For its scope this blocks SIGPIPE in the calling thread and
/// then discards one that the scope raised (the write itself fails with EPIPE and is counted).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{};
      sigtimedwait(&pipe_, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

/// Pages per pipelined round trip (bounds the client's buffers).
constexpr size_t kBatch = 64;

class RedisStorage final : public StorageBackend {
 public:
  RedisStorage(std::string host, int port, std::string prefix, double timeout_s)
      : host_(std::move(host)), port_(port), prefix_(std::move(prefix)), timeout_s_(timeout_s) {
    PAGODA_REQUIRE(timeout_s > 0, kInvalidArgument, "redis storage timeout must be positive");
    PAGODA_REQUIRE(connect(), kInvalidArgument, "hicache storage {}: cannot reach the server: {}",
                   describe(), last_error_);
  }
  ~RedisStorage() override { drop(); }

  std::string describe() const override {
    return fmt::format("redis://{}:{}/{}", host_, port_, prefix_);
  }

  int64_t batch_exists(std::span<const PageKey> keys) override {
    int64_t n = 0;
    for (size_t at = 0; at < keys.size(); at += kBatch) {
      const auto chunk = keys.subspan(at, std::min(kBatch, keys.size() - at));
      std::vector<Reply> replies;
      if (!roundtrip(chunk, "EXISTS", {}, replies)) return n;
      for (const Reply& r : replies) {
        if (r->type != REDIS_REPLY_INTEGER || r->integer != 1) return n;
        ++n;
      }
    }
    return n;
  }

  bool get(const PageKey& key, std::span<std::byte> out) override {
    const std::span<std::byte> outs[1] = {out};
    return batch_get(std::span(&key, 1), outs) == 1;
  }

  int64_t batch_get(std::span<const PageKey> keys,
                    std::span<const std::span<std::byte>> outs) override {
    PAGODA_CHECK_EQ(keys.size(), outs.size());
    int64_t n = 0;
    for (size_t at = 0; at < keys.size(); at += kBatch) {
      const auto chunk = keys.subspan(at, std::min(kBatch, keys.size() - at));
      std::vector<Reply> replies;
      if (!roundtrip(chunk, "GET", {}, replies)) {
        ++stats_.get_misses;
        return n;
      }
      for (size_t i = 0; i < chunk.size(); ++i) {
        const redisReply& r = *replies[i];
        if (r.type != REDIS_REPLY_STRING) {
          ++stats_.get_misses;
          if (r.type == REDIS_REPLY_ERROR) note_error("GET", r.str);
          return n;
        }
        const std::span<const std::byte> record(reinterpret_cast<const std::byte*>(r.str),
                                                static_cast<size_t>(r.len));
        if (!decode_page_record(record, chunk[i], outs[at + i])) {
          ++stats_.corrupt_pages;
          PAGODA_LOG_WARN(
              "hicache storage: page {} in {} is corrupt (size, key or checksum); "
              "it is deleted and recomputed",
              chunk[i].hex(), describe());
          std::vector<Reply> ignored;
          roundtrip(chunk.subspan(i, 1), "DEL", {}, ignored);  // a later put stores it again
          return n;
        }
        ++stats_.get_hits;
        stats_.bytes_read += static_cast<int64_t>(outs[at + i].size());
        ++n;
      }
    }
    return n;
  }

  bool put(const PageKey& key, std::span<const std::byte> data) override {
    const std::span<const std::byte> d[1] = {data};
    return batch_put(std::span(&key, 1), d) == 1;
  }

  int64_t batch_put(std::span<const PageKey> keys,
                    std::span<const std::span<const std::byte>> data) override {
    PAGODA_CHECK_EQ(keys.size(), data.size());
    int64_t n = 0;
    for (size_t at = 0; at < keys.size(); at += kBatch) {
      const size_t len = std::min(kBatch, keys.size() - at);
      std::vector<std::vector<std::byte>> records(len);
      for (size_t i = 0; i < len; ++i) encode_page_record(keys[at + i], data[at + i], records[i]);
      std::vector<Reply> replies;
      if (!roundtrip(keys.subspan(at, len), "SET", records, replies)) {
        stats_.put_errors += static_cast<int64_t>(len);
        continue;
      }
      for (size_t i = 0; i < len; ++i) {
        const redisReply& r = *replies[i];
        if (r.type == REDIS_REPLY_STATUS) {
          ++stats_.puts;
          stats_.bytes_written += static_cast<int64_t>(records[i].size());
          ++n;
        } else if (r.type == REDIS_REPLY_NIL) {  // NX: already present
          ++stats_.put_skipped;
          ++n;
        } else {
          ++stats_.put_errors;  // e.g. OOM: the server is full
          if (r.type == REDIS_REPLY_ERROR) note_error("SET", r.str);
        }
      }
    }
    return n;
  }

  const StorageStats& stats() const override { return stats_; }

 private:
  timeval timeout() const {
    const auto us = static_cast<long>(timeout_s_ * 1e6);
    return timeval{.tv_sec = us / 1000000, .tv_usec = us % 1000000};
  }

  bool connect() {
    const SigpipeGuard guard;
    ctx_ = redisConnectWithTimeout(host_.c_str(), port_, timeout());
    bool ok = ctx_ != nullptr && ctx_->err == 0 && redisSetTimeout(ctx_, timeout()) == REDIS_OK;
    if (ok) {
      Reply pong(static_cast<redisReply*>(redisCommand(ctx_, "PING")), freeReplyObject);
      ok = pong != nullptr && pong->type == REDIS_REPLY_STATUS;
    }
    if (!ok) {
      last_error_ = ctx_ == nullptr ? "out of memory" : ctx_->err != 0 ? ctx_->errstr : "no PONG";
      drop();
      retry_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_s_));
    }
    return ok;
  }

  void drop() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  /// A usable connection: the current one, or a new one when the back-off has passed.
  bool ready() {
    if (ctx_ != nullptr) return true;
    if (Clock::now() < retry_at_) return false;
    if (!connect()) return false;
    PAGODA_LOG_INFO("hicache storage: reconnected to {}", describe());
    return true;
  }

  /// Sends `cmd KEY [records[i] NX]` for every key in one pipeline and reads every reply. False
  /// (counted in errors, the connection dropped) when the server is unreachable or times out.
  bool roundtrip(std::span<const PageKey> keys, const char* cmd,
                 std::span<const std::vector<std::byte>> records, std::vector<Reply>& replies) {
    if (!ready()) {
      ++stats_.errors;
      return false;
    }
    const SigpipeGuard guard;
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string k = prefix_ + ":" + keys[i].hex();
      const bool set = !records.empty();
      const char* argv[4] = {
          cmd, k.c_str(), set ? reinterpret_cast<const char*>(records[i].data()) : nullptr, "NX"};
      const size_t argl[4] = {std::strlen(cmd), k.size(), set ? records[i].size() : 0, 2};
      if (redisAppendCommandArgv(ctx_, set ? 4 : 2, argv, argl) != REDIS_OK) return lost();
    }
    replies.clear();
    for (size_t i = 0; i < keys.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) return lost();
      replies.emplace_back(static_cast<redisReply*>(r), freeReplyObject);
    }
    return true;
  }

  bool lost() {
    ++stats_.errors;
    PAGODA_LOG_WARN("hicache storage: {} failed ({}); pages are recomputed until it answers again",
                    describe(), ctx_->errstr);
    drop();
    retry_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(timeout_s_));
    return false;
  }

  void note_error(const char* cmd, const char* what) {
    ++stats_.errors;
    if (stats_.errors == 1 || stats_.errors % 1000 == 0)
      PAGODA_LOG_WARN("hicache storage: {} {} answered an error ({} so far): {}", describe(), cmd,
                      stats_.errors, what);
  }

  std::string host_;
  int port_;
  std::string prefix_;
  double timeout_s_;
  redisContext* ctx_ = nullptr;
  Clock::time_point retry_at_{};
  std::string last_error_;
  StorageStats stats_;
};

}  // namespace

std::unique_ptr<StorageBackend> make_redis_storage(const std::string& host, int port,
                                                   const std::string& prefix, double timeout_s) {
  return std::make_unique<RedisStorage>(host, port, prefix, timeout_s);
}

}  // namespace pagoda::tier
