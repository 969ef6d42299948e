#pragma once
/// The hierarchical cache's storage tier (L3): pages keyed by their chained PageKey, so any
/// instance sharing the store can look a prefix up from its tokens alone. Contract:
/// docs/design/tier.md "Storage tier".
///
/// Errors never reach the caller as exceptions once a backend is built: a page that is absent,
/// unreadable, or fails its checksum is a miss (counted, logged), a put that fails is counted
/// and logged, and the cache recomputes. Wrong KV is never returned.
/// Backends: `file:DIR` (one local directory) and `redis://HOST[:PORT][/PREFIX]` (a Redis or
/// Valkey server shared by any number of engines on any number of machines; needs hiredis at
/// build time). Not thread-safe: one thread uses one backend object (the prefetch thread opens
/// its own).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "pagoda/tier/page_key.h"

namespace pagoda::tier {

/// Cumulative counters of a backend.
struct StorageStats {
  int64_t puts = 0;           ///< pages written
  int64_t put_skipped = 0;    ///< already present
  int64_t put_errors = 0;
  int64_t get_hits = 0;
  int64_t get_misses = 0;     ///< absent or unreadable
  int64_t corrupt_pages = 0;  ///< present but failing the checksum, key or size check
  int64_t errors = 0;         ///< the store was unreachable, timed out or answered an error
  int64_t bytes_written = 0;
  int64_t bytes_read = 0;
  StorageStats& operator+=(const StorageStats& o) {
    puts += o.puts;
    put_skipped += o.put_skipped;
    put_errors += o.put_errors;
    get_hits += o.get_hits;
    get_misses += o.get_misses;
    corrupt_pages += o.corrupt_pages;
    errors += o.errors;
    bytes_written += o.bytes_written;
    bytes_read += o.bytes_read;
    return *this;
  }
};

class StorageBackend {
 public:
  virtual ~StorageBackend() = default;
  /// e.g. "file:/data/kv", "redis://10.0.0.5:6379/pagoda".
  virtual std::string describe() const = 0;
  /// How many of `keys`, from the first, are present (stops at the first absent one).
  virtual int64_t batch_exists(std::span<const PageKey> keys) = 0;
  /// Reads the page stored under `key` into `out` (its exact size). False on a miss or a
  /// corrupt page (counted, and removed so that a later put can store it again); `out` is then
  /// unspecified.
  virtual bool get(const PageKey& key, std::span<std::byte> out) = 0;
  /// Stores `data` under `key` (a present key is left alone). False on failure (counted).
  virtual bool put(const PageKey& key, std::span<const std::byte> data) = 0;
  /// get() of keys[i] into outs[i] for each i in order, stopping at the first miss or corrupt
  /// page; returns how many leading pages were read. A remote backend sends the batch in one
  /// round trip.
  virtual int64_t batch_get(std::span<const PageKey> keys,
                            std::span<const std::span<std::byte>> outs);
  /// put() of every (keys[i], data[i]); returns how many were stored or already present.
  virtual int64_t batch_put(std::span<const PageKey> keys,
                            std::span<const std::span<const std::byte>> data);
  virtual const StorageStats& stats() const = 0;
};

/// A backend in one local directory (created when missing): one file per page, written to a
/// temporary file, fsync'ed and renamed into place (a crash leaves the old state or the new
/// page, never a torn one), with a header (magic, key, size, SHA-256 checksum of the payload)
/// checked on every read. Throws Error(kInvalidArgument) when the directory cannot be
/// created or is not writable.
std::unique_ptr<StorageBackend> make_file_storage(const std::string& dir);

/// Opens the backend a --hicache-storage value names (make_storage, or a test double).
using StorageFactory = std::function<std::unique_ptr<StorageBackend>()>;

/// A backend on a Redis / Valkey server: one string value per page under
/// "PREFIX:<key hex>" holding the page record (page_record.h), written with SET NX (a present
/// page is left alone); batches are pipelined (one round trip). Every command has a timeout
/// (`timeout_s`, also the connect timeout); a broken connection is retried at the next call
/// at most once per `timeout_s`, and until then calls fail fast (counted in `errors`). Throws
/// Error(kInvalidArgument) when the server cannot be reached at construction, kUnsupported in
/// a build without hiredis.
std::unique_ptr<StorageBackend> make_redis_storage(const std::string& host, int port,
                                                   const std::string& prefix,
                                                   double timeout_s = 1.0);

/// Checks a --hicache-storage value without opening anything: Error(kInvalidArgument) for a
/// malformed value, Error(kUnsupported) naming a scheme this build does not have.
void check_storage_spec(std::string_view spec);

/// The backend a --hicache-storage value names: "file:DIR" or "redis://HOST[:PORT][/PREFIX]"
/// (port 6379, prefix "pagoda" by default). Throws Error(kInvalidArgument) for a malformed
/// value or a store that cannot be opened, Error(kUnsupported) naming a scheme this build does
/// not have.
std::unique_ptr<StorageBackend> make_storage(std::string_view spec);

}  // namespace pagoda::tier
