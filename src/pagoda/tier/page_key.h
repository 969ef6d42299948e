#pragma once
/// PageKey: the storage key of one KV page in the hierarchical cache (HiCache L2 / L3): a chained
/// hash over the page's tokens and its parent page's key, so a key names the whole prefix up to
/// and including the page (the same tokens after a different prefix get a different key) and any
/// instance can compute it from the tokens alone, without a tree. SHA-256 (OpenSSL) of
/// parent key (16 bytes) ++ each token as 4-byte little-endian, truncated to 128 bits; the chain
/// starts from the key of the namespace (extra_key), so namespaces never share pages.
/// Pure functions; thread-safe.

#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::tier {

struct PageKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  auto operator<=>(const PageKey&) const = default;
  /// 32 lowercase hex digits (file names, logs).
  std::string hex() const;
};

struct PageKeyHash {
  size_t operator()(const PageKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)); }
};

/// The chain's start for namespace `extra_key` (the parent of a prefix's first page).
PageKey root_key(std::string_view extra_key);
/// The key of a page with tokens `page_tokens` whose parent page has key `parent`.
PageKey chain_key(const PageKey& parent, std::span<const int32_t> page_tokens);
/// SHA-256 of `bytes`, truncated to 128 bits (the storage tier's page checksum).
PageKey content_digest(std::span<const std::byte> bytes);
/// Keys of the first `num_pages` whole pages of `tokens` (num_pages * page_size <= len) into
/// `out` (overwritten).
void page_keys(std::string_view extra_key, std::span<const int32_t> tokens, int32_t page_size,
               int64_t num_pages, std::vector<PageKey>& out);

}  // namespace pagoda::tier
