// KvTransfer factories of a build without UCX (libucx-dev was not found at configure time).
#include "pagoda/core/error.h"
#include "pagoda/disagg/kv_transfer.h"

namespace pagoda::disagg {

bool have_ucx_transfer() { return false; }

std::unique_ptr<KvTransfer> make_ucx_transfer(std::span<const MemRegion>) {
  throw_error(ErrorCode::kUnsupported,
              "the UCX KV transfer is not in this build (apt install libucx-dev, then reconfigure)");
}

}  // namespace pagoda::disagg
