#pragma once
/// The storage tier's page record, shared by every backend: a 48-byte header (magic `PGDKVPG1`,
/// the page key, the payload size, SHA-256/128 of the payload; native little-endian u64 words)
/// followed by the payload (kv::read_page's bytes). A record is accepted only when its size,
/// magic, key and checksum all match: a torn, foreign or bit-flipped page is never used.
/// Pure functions; thread-safe.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/tier/page_key.h"

namespace pagoda::tier {

struct PageHeader {
  std::array<char, 8> magic{'P', 'G', 'D', 'K', 'V', 'P', 'G', '1'};
  uint64_t key_hi = 0, key_lo = 0;
  uint64_t size = 0;
  uint64_t sum_hi = 0, sum_lo = 0;
};
static_assert(sizeof(PageHeader) == 48);

/// The header of `payload` stored under `key`.
PageHeader make_page_header(const PageKey& key, std::span<const std::byte> payload);
/// Whether `h` is the header of `payload` stored under `key` (checks the checksum).
bool page_header_matches(const PageHeader& h, const PageKey& key,
                         std::span<const std::byte> payload);
/// Header followed by the payload, in one buffer (`out` overwritten).
void encode_page_record(const PageKey& key, std::span<const std::byte> payload,
                        std::vector<std::byte>& out);
/// Whether `record` is a whole, intact record of `key` whose payload has `out.size()` bytes;
/// when it is, the payload is copied into `out` (otherwise `out` is unchanged).
bool decode_page_record(std::span<const std::byte> record, const PageKey& key,
                        std::span<std::byte> out);

}  // namespace pagoda::tier
