#include "pagoda/engine/pool_sizing.h"

#include <algorithm>
#include <cmath>

#include "pagoda/core/error.h"

namespace pagoda::engine {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// Bytes of a pool of `pages` usable pages (page 0 included).
int64_t pool_bytes(int64_t pages, int32_t page_size, int64_t bytes_per_token) {
  return (pages + 1) * page_size * bytes_per_token;
}

}  // namespace

int64_t kv_budget_from_fraction(const platform::MemoryInfo& memory, double fraction,
                                int64_t pending_weight_bytes) {
  PAGODA_REQUIRE(std::isfinite(fraction) && fraction > 0 && fraction < 1, kInvalidArgument,
                 "mem_fraction_static must be in (0, 1) (got {})", fraction);
  PAGODA_REQUIRE(memory.total_bytes > 0 && memory.free_bytes >= 0 &&
                     memory.free_bytes <= memory.total_bytes && pending_weight_bytes >= 0,
                 kInvalidArgument, "memory info: {} free of {} bytes, {} weight bytes to load",
                 memory.free_bytes, memory.total_bytes, pending_weight_bytes);
  const auto total = static_cast<double>(memory.total_bytes);
  const double used = total - static_cast<double>(memory.free_bytes);
  const double budget = fraction * total - used - static_cast<double>(pending_weight_bytes);
  PAGODA_REQUIRE(budget >= 1, kResourceExhausted,
                 "mem_fraction_static {} leaves no memory for the KV cache: {:.0f} of {:.0f} MiB "
                 "are in use and {:.0f} MiB of weights are still to load, against {:.0f} MiB "
                 "for weights and KV together (raise the fraction or give pool_tokens)",
                 fraction, used / kMiB, total / kMiB,
                 static_cast<double>(pending_weight_bytes) / kMiB, fraction * total / kMiB);
  return static_cast<int64_t>(budget);
}

PoolSizes size_pools(const PoolBudget& b) {
  PAGODA_REQUIRE(b.budget_bytes > 0 && b.page_size >= 1 && b.full_bytes_per_token >= 0 &&
                     b.swa_bytes_per_token >= 0 && b.swa_pool_tokens >= 0,
                 kInvalidArgument,
                 "pool budget: {} bytes, page size {}, {} / {} bytes per token, {} SWA tokens",
                 b.budget_bytes, b.page_size, b.full_bytes_per_token, b.swa_bytes_per_token,
                 b.swa_pool_tokens);
  const bool swa = b.swa_bytes_per_token > 0;
  PAGODA_REQUIRE(swa || b.full_bytes_per_token > 0, kInvalidArgument,
                 "pool budget: the pools store no bytes per token");
  PAGODA_REQUIRE(!swa || (std::isfinite(b.swa_full_tokens_ratio) && b.swa_full_tokens_ratio > 0 &&
                          b.swa_full_tokens_ratio <= 1),
                 kInvalidArgument, "swa_full_tokens_ratio must be in (0, 1] (got {})",
                 b.swa_full_tokens_ratio);
  const int64_t max_pages = (int64_t{1} << 30) / b.page_size - 1;  // EngineConfig's slot range
  const int64_t page_full = int64_t{b.page_size} * b.full_bytes_per_token;
  const int64_t page_swa = int64_t{b.page_size} * b.swa_bytes_per_token;
  auto refuse = [&](int64_t need) {
    throw_error(ErrorCode::kResourceExhausted,
                "a KV budget of {:.1f} MiB does not hold one page of each pool ({:.1f} MiB needed "
                "at page size {})",
                static_cast<double>(b.budget_bytes) / kMiB, static_cast<double>(need) / kMiB,
                b.page_size);
  };
  if (!swa) {
    const int64_t pages = std::min(b.budget_bytes / page_full - 1, max_pages);
    if (pages < 1) refuse(2 * page_full);
    return {.pool_tokens = pages * b.page_size, .swa_pool_tokens = 0};
  }
  // The full pool's pages given the SWA pool's, when it stores no layer (ids only).
  const double r = b.swa_full_tokens_ratio;
  auto full_of_swa = [&](int64_t swa_pages) {
    return std::min(static_cast<int64_t>(std::floor(static_cast<double>(swa_pages) / r)), max_pages);
  };
  int64_t full = 0, swa_pages = 0;
  if (b.swa_pool_tokens > 0) {
    swa_pages = b.swa_pool_tokens / b.page_size;
    const int64_t rest = b.budget_bytes - pool_bytes(swa_pages, b.page_size, b.swa_bytes_per_token);
    if (swa_pages < 1 || rest < 0) refuse(2 * (page_full + page_swa));
    full = page_full == 0 ? full_of_swa(swa_pages) : std::min(rest / page_full - 1, max_pages);
    PAGODA_REQUIRE(full < 1 || swa_pages <= full, kResourceExhausted,
                   "an SWA pool of {} tokens does not fit beside the full pool: the KV budget of "
                   "{:.1f} MiB leaves the full pool {} tokens (give fewer swa_pool_tokens)",
                   b.swa_pool_tokens, static_cast<double>(b.budget_bytes) / kMiB,
                   full * b.page_size);
  } else if (page_full == 0) {
    swa_pages = std::min(b.budget_bytes / page_swa - 1, max_pages);
    full = full_of_swa(swa_pages);
  } else {
    // (F + 1)·page_full + (floor(r·F) + 1)·page_swa <= budget: start from the real solution's
    // floor and step to the largest F that fits (floor(r·F) makes the bound a step function).
    auto fits = [&](int64_t f) {
      const auto s = static_cast<int64_t>(std::floor(r * static_cast<double>(f)));
      return (f + 1) * page_full + (s + 1) * page_swa <= b.budget_bytes;
    };
    const double est = (static_cast<double>(b.budget_bytes) - static_cast<double>(page_full) -
                        static_cast<double>(page_swa)) /
                       (static_cast<double>(page_full) + r * static_cast<double>(page_swa));
    full = std::clamp<int64_t>(static_cast<int64_t>(std::floor(est)), 0, max_pages);
    while (full > 0 && !fits(full)) --full;
    while (full < max_pages && fits(full + 1)) ++full;
    swa_pages = static_cast<int64_t>(std::floor(r * static_cast<double>(full)));
  }
  swa_pages = std::min(swa_pages, full);  // by the ratio: full's cap may bind first
  if (full < 1 || swa_pages < 1) refuse(2 * (page_full + page_swa));
  return {.pool_tokens = full * b.page_size, .swa_pool_tokens = swa_pages * b.page_size};
}

}  // namespace pagoda::engine
