#include "pagoda/tier/page_key.h"

#include <openssl/evp.h>

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::tier {
namespace {

PageKey digest(std::span<const unsigned char> bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  const int ok = EVP_Digest(bytes.data(), bytes.size(), md.data(), &len, EVP_sha256(), nullptr);
  PAGODA_CHECK(ok == 1 && len >= 16, "SHA-256 failed");
  PageKey k;
  for (int i = 0; i < 8; ++i) k.hi = (k.hi << 8) | md[static_cast<size_t>(i)];
  for (int i = 8; i < 16; ++i) k.lo = (k.lo << 8) | md[static_cast<size_t>(i)];
  return k;
}

void put_u64(std::vector<unsigned char>& b, uint64_t v) {
  for (int i = 7; i >= 0; --i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

}  // namespace

std::string PageKey::hex() const { return fmt::format("{:016x}{:016x}", hi, lo); }

PageKey root_key(std::string_view extra_key) {
  std::vector<unsigned char> b{'p', 'a', 'g', 'o', 'd', 'a', ':', 'n', 's', ':'};
  b.insert(b.end(), extra_key.begin(), extra_key.end());
  return digest(b);
}

PageKey chain_key(const PageKey& parent, std::span<const int32_t> page_tokens) {
  std::vector<unsigned char> b;
  b.reserve(16 + 4 * page_tokens.size());
  put_u64(b, parent.hi);
  put_u64(b, parent.lo);
  for (int32_t t : page_tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<unsigned char>(u >> (8 * i)));
  }
  return digest(b);
}

PageKey content_digest(std::span<const std::byte> bytes) {
  return digest({reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()});
}

void page_keys(std::string_view extra_key, std::span<const int32_t> tokens, int32_t page_size,
               int64_t num_pages, std::vector<PageKey>& out) {
  PAGODA_REQUIRE(page_size >= 1 && num_pages >= 0 &&
                     num_pages * page_size <= static_cast<int64_t>(tokens.size()),
                 kInvalidArgument, "page_keys: {} pages of {} tokens exceed {} tokens", num_pages,
                 page_size, tokens.size());
  out.resize(static_cast<size_t>(num_pages));
  PageKey parent = root_key(extra_key);
  for (int64_t i = 0; i < num_pages; ++i) {
    parent = chain_key(parent, tokens.subspan(static_cast<size_t>(i * page_size),
                                              static_cast<size_t>(page_size)));
    out[static_cast<size_t>(i)] = parent;
  }
}

}  // namespace pagoda::tier
