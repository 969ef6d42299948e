#pragma once
/// The hierarchical cache's storage tier (L3): pages keyed by their chained PageKey, so any
/// instance sharing the store can look a prefix up from its tokens alone. Contract:
/// docs/design/tier.md "Storage tier".
///
/// Errors never reach the caller as exceptions once a backend is built: a page that is absent,
/// unreadable, or fails its checksum is a miss (counted, logged), a put that fails is counted
/// and logged, and the cache recomputes. Wrong KV is never returned.
/// Not thread-safe: the scheduler thread calls it.

#include <cstddef>
#include <cstdint>
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
  int64_t bytes_written = 0;
  int64_t bytes_read = 0;
};

class StorageBackend {
 public:
  virtual ~StorageBackend() = default;
  /// e.g. "file:/data/kv".
  virtual std::string describe() const = 0;
  /// How many of `keys`, from the first, are present (stops at the first absent one).
  virtual int64_t batch_exists(std::span<const PageKey> keys) = 0;
  /// Reads the page stored under `key` into `out` (its exact size). False on a miss or a
  /// corrupt page (counted, and removed so that a later put can store it again); `out` is then
  /// unspecified.
  virtual bool get(const PageKey& key, std::span<std::byte> out) = 0;
  /// Stores `data` under `key` (a present key is left alone). False on failure (counted).
  virtual bool put(const PageKey& key, std::span<const std::byte> data) = 0;
  virtual const StorageStats& stats() const = 0;
};

/// A backend in one local directory (created when missing): one file per page, written to a
/// temporary file, fsync'ed and renamed into place (a crash leaves the old state or the new
/// page, never a torn one), with a header (magic, key, size, SHA-256 checksum of the payload)
/// checked on every read. Throws Error(kInvalidArgument) when the directory cannot be
/// created or is not writable.
std::unique_ptr<StorageBackend> make_file_storage(const std::string& dir);

/// Checks a --hicache-storage value without opening anything: Error(kInvalidArgument) for a
/// malformed value, Error(kUnsupported) naming a scheme this build does not have.
void check_storage_spec(std::string_view spec);

/// The backend a --hicache-storage value names: "file:DIR" (check_storage_spec first). Throws Error(kInvalidArgument) for
/// a malformed value and Error(kUnsupported) naming a scheme this build does not have.
std::unique_ptr<StorageBackend> make_storage(std::string_view spec);

}  // namespace pagoda::tier
