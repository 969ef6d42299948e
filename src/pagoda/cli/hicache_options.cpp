#include "pagoda/cli/hicache_options.h"

#include <cctype>
#include <cstdlib>

#include "pagoda/core/error.h"

namespace pagoda::cli {
namespace {

int64_t parse_bytes(const std::string& s) {
  PAGODA_REQUIRE(!s.empty(), kInvalidArgument, "--hicache-size is empty");
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    throw_error(ErrorCode::kInvalidArgument, "--hicache-size '{}' is not a number of bytes", s);
  }
  const std::string suffix = s.substr(used);
  double scale = 1;
  if (suffix == "K" || suffix == "KB") {
    scale = 1024.0;
  } else if (suffix == "M" || suffix == "MB") {
    scale = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "GB") {
    scale = 1024.0 * 1024 * 1024;
  } else {
    PAGODA_REQUIRE(suffix.empty(), kInvalidArgument,
                   "--hicache-size '{}': the suffix must be K, M or G", s);
  }
  PAGODA_REQUIRE(value > 0 && value * scale < 9e18, kInvalidArgument,
                 "--hicache-size must be positive (got '{}')", s);
  return static_cast<int64_t>(value * scale);
}

}  // namespace

void add_hicache_options(CLI::App* cmd, HiCacheOptions& o) {
  cmd->add_option("--hicache-ratio", o.ratio,
                  "hierarchical KV cache: a pinned host tier of this many times the device "
                  "pool (0 = off)")
      ->capture_default_str();
  cmd->add_option("--hicache-size", o.size,
                  "hierarchical KV cache: the host tier in bytes (suffix K, M or G; per rank "
                  "with --tp)");
  cmd->add_option("--hicache-write-policy", o.write_policy,
                  "when device pages get a host copy: write_through (when stored), "
                  "write_through_selective (after 2 hits), write_back (on eviction)")
      ->capture_default_str();
  cmd->add_option("--hicache-storage", o.storage,
                  "hierarchical KV cache: a storage tier below the host tier, file:DIR or "
                  "redis://HOST[:PORT][/PREFIX] (pages leaving the host tier are kept there; "
                  "any engine on the same store can reuse them; not with --tp > 1 yet)");
  cmd->add_option("--hicache-prefetch-policy", o.prefetch_policy,
                  "how long a queued request's admission waits for the pages read ahead from "
                  "storage: best_effort (not at all), wait_complete, or timeout (1 s + 0.25 s "
                  "per 1,000 tokens)")
      ->capture_default_str();
}

tier::HiCacheConfig make_hicache_config(const HiCacheOptions& o) {
  tier::HiCacheConfig c;
  PAGODA_REQUIRE(o.ratio == 0 || o.size.empty(), kInvalidArgument,
                 "give --hicache-ratio or --hicache-size, not both");
  PAGODA_REQUIRE(o.ratio >= 0, kInvalidArgument, "--hicache-ratio must be positive (got {})",
                 o.ratio);
  c.host.ratio = o.ratio;
  if (!o.size.empty()) c.host.bytes = parse_bytes(o.size);
  c.write_policy = tier::parse_write_policy(o.write_policy);
  c.storage = o.storage;
  c.prefetch = tier::parse_prefetch_policy(o.prefetch_policy);
  c.validate();
  return c;
}

nlohmann::json hicache_stats_json(const engine::EngineStats& st) {
  const tier::TierStats& t = st.tier;
  return {{"device_hit_tokens", t.device_hit_tokens},
          {"host_hit_tokens", t.host_hit_tokens},
          {"load_skipped_tokens", t.load_skipped_tokens},
          {"host_pages", t.host_pages},
          {"host_capacity_pages", t.host_capacity_pages},
          {"host_evicted_pages", t.host_evicted_pages},
          {"backup_skipped_pages", t.backup_skipped_pages},
          {"backup_pages", t.transfer.backup_pages},
          {"load_pages", t.transfer.load_pages},
          {"bytes_d2h", t.transfer.bytes_d2h},
          {"bytes_h2d", t.transfer.bytes_h2d},
          {"backup_batches", t.transfer.backup_batches},
          {"load_batches", t.transfer.load_batches},
          {"copy_wait_s", t.transfer.d2h_wait_s},
          {"copy_waits", t.transfer.copy_waits},
          {"load_stalls", t.transfer.load_stalls},
          {"load_stall_s", t.transfer.load_stall_s},
          {"storage_hit_tokens", t.storage_hit_tokens},
          {"storage", t.has_storage ? nlohmann::json{{"puts", t.storage.puts},
                                                     {"put_skipped", t.storage.put_skipped},
                                                     {"put_errors", t.storage.put_errors},
                                                     {"get_hits", t.storage.get_hits},
                                                     {"get_misses", t.storage.get_misses},
                                                     {"corrupt_pages", t.storage.corrupt_pages},
                                                     {"errors", t.storage.errors},
                                                     {"prefetch_jobs", t.prefetch_jobs},
                                                     {"prefetch_pages", t.prefetch_pages},
                                                     {"prefetch_waits", t.prefetch_waits},
                                                     {"bytes_written", t.storage.bytes_written},
                                                     {"bytes_read", t.storage.bytes_read}}
                                    : nlohmann::json(nullptr)}};
}

}  // namespace pagoda::cli
