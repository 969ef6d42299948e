// make_redis_storage in a build without hiredis: a clear error naming the package.
#include "pagoda/core/error.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {

std::unique_ptr<StorageBackend> make_redis_storage(const std::string&, int, const std::string&,
                                                   double) {
  throw_error(ErrorCode::kUnsupported,
              "hicache storage redis:// is not in this build: hiredis was not found at configure "
              "time (apt install libhiredis-dev, then reconfigure)");
}

}  // namespace pagoda::tier
