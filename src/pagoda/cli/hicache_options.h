#pragma once
/// The hierarchical KV cache's options, one block shared by `pagoda generate`, `pagoda bench`
/// and `pagoda serve` (docs/design/tier.md): --hicache-ratio R | --hicache-size BYTES[K|M|G]
/// --hicache-write-policy write_through|write_through_selective|write_back
/// --hicache-storage file:DIR|redis://HOST[:PORT][/PREFIX]
/// --hicache-prefetch-policy best_effort|wait_complete|timeout.

#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagoda/engine/engine.h"
#include "pagoda/tier/config.h"

namespace pagoda::cli {

struct HiCacheOptions {
  double ratio = 0;          ///< host pool = ratio x the device pool (0 = off)
  std::string size;          ///< host pool in bytes, with an optional K/M/G suffix (empty = off)
  std::string write_policy = "write_through";
  std::string storage;       ///< "", file:DIR or redis://HOST[:PORT][/PREFIX]
  std::string prefetch_policy = "wait_complete";
};

/// Registers the options on `cmd`.
void add_hicache_options(CLI::App* cmd, HiCacheOptions& o);

/// The engine's HiCacheConfig for `o` (disabled when neither size is given). Throws
/// Error(kInvalidArgument) naming the option for a bad value.
tier::HiCacheConfig make_hicache_config(const HiCacheOptions& o);

/// The tier counters of a run as JSON (hits per tier, pages and bytes moved each way, waits).
nlohmann::json hicache_stats_json(const engine::EngineStats& st);

}  // namespace pagoda::cli
