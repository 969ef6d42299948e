#include "pagoda/tier/page_record.h"

#include <cstring>

namespace pagoda::tier {

PageHeader make_page_header(const PageKey& key, std::span<const std::byte> payload) {
  const PageKey sum = content_digest(payload);
  PageHeader h;
  h.key_hi = key.hi;
  h.key_lo = key.lo;
  h.size = payload.size();
  h.sum_hi = sum.hi;
  h.sum_lo = sum.lo;
  return h;
}

bool page_header_matches(const PageHeader& h, const PageKey& key,
                         std::span<const std::byte> payload) {
  if (h.magic != PageHeader{}.magic || h.key_hi != key.hi || h.key_lo != key.lo ||
      h.size != payload.size())
    return false;
  const PageKey sum = content_digest(payload);
  return h.sum_hi == sum.hi && h.sum_lo == sum.lo;
}

void encode_page_record(const PageKey& key, std::span<const std::byte> payload,
                        std::vector<std::byte>& out) {
  const PageHeader h = make_page_header(key, payload);
  out.resize(sizeof h + payload.size());
  std::memcpy(out.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(out.data() + sizeof h, payload.data(), payload.size());
}

bool decode_page_record(std::span<const std::byte> record, const PageKey& key,
                        std::span<std::byte> out) {
  if (record.size() != sizeof(PageHeader) + out.size()) return false;
  PageHeader h;
  std::memcpy(&h, record.data(), sizeof h);
  if (!page_header_matches(h, key, record.subspan(sizeof h))) return false;
  if (!out.empty()) std::memcpy(out.data(), record.data() + sizeof h, out.size());
  return true;
}

}  // namespace pagoda::tier
