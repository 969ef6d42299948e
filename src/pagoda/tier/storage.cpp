// --hicache-storage values and the batched defaults of StorageBackend.
#include <charconv>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {
namespace {

struct RedisSpec {
  std::string host;
  int port = 6379;
  std::string prefix = "pagoda";
};

/// redis://HOST[:PORT][/PREFIX]
RedisSpec parse_redis(std::string_view spec) {
  std::string_view rest = spec.substr(std::string_view("redis://").size());
  RedisSpec r;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    r.prefix = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    PAGODA_REQUIRE(!r.prefix.empty() && r.prefix.find_first_of(" \t\r\n") == std::string::npos,
                   kInvalidArgument,
                   "hicache storage '{}': the key prefix after '/' must be a "
                   "non-empty word",
                   spec);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    const std::string_view port = rest.substr(colon + 1);
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), r.port);
    PAGODA_REQUIRE(
        ec == std::errc{} && end == port.data() + port.size() && r.port >= 1 && r.port <= 65535,
        kInvalidArgument, "hicache storage '{}': the port must be in [1, 65535]", spec);
    rest = rest.substr(0, colon);
  }
  PAGODA_REQUIRE(!rest.empty(), kInvalidArgument,
                 "hicache storage '{}' needs a host: redis://HOST[:PORT][/PREFIX]", spec);
  r.host = std::string(rest);
  return r;
}

}  // namespace

int64_t StorageBackend::batch_get(std::span<const PageKey> keys,
                                  std::span<const std::span<std::byte>> outs) {
  PAGODA_CHECK_EQ(keys.size(), outs.size());
  int64_t n = 0;
  while (static_cast<size_t>(n) < keys.size() &&
         get(keys[static_cast<size_t>(n)], outs[static_cast<size_t>(n)]))
    ++n;
  return n;
}

int64_t StorageBackend::batch_put(std::span<const PageKey> keys,
                                  std::span<const std::span<const std::byte>> data) {
  PAGODA_CHECK_EQ(keys.size(), data.size());
  int64_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) n += put(keys[i], data[i]);
  return n;
}

void check_storage_spec(std::string_view spec) {
  if (spec.starts_with("redis://")) {
    parse_redis(spec);
    return;
  }
  const size_t colon = spec.find(':');
  PAGODA_REQUIRE(colon != std::string_view::npos && colon > 0, kInvalidArgument,
                 "hicache storage '{}' must look like file:DIR or redis://HOST[:PORT][/PREFIX]",
                 spec);
  const std::string_view scheme = spec.substr(0, colon);
  PAGODA_REQUIRE(scheme == "file", kUnsupported,
                 "hicache storage scheme '{}' is not supported (have: file:DIR, "
                 "redis://HOST[:PORT][/PREFIX])",
                 scheme);
  PAGODA_REQUIRE(colon + 1 < spec.size(), kInvalidArgument,
                 "hicache storage 'file:' needs a directory");
}

std::unique_ptr<StorageBackend> make_storage(std::string_view spec) {
  check_storage_spec(spec);
  if (spec.starts_with("redis://")) {
    const RedisSpec r = parse_redis(spec);
    return make_redis_storage(r.host, r.port, r.prefix);
  }
  return make_file_storage(std::string(spec.substr(spec.find(':') + 1)));
}

}  // namespace pagoda::tier
