#pragma once
// Prefill–decode moves between two engines of one process (EngineTransfer), shared by the CPU
// engine tests (a direct page copy) and the CUDA one (the staged transfer, tests/cuda).

#include <vector>

#include "pagoda/engine/engine.h"

namespace pagoda::testing {

/// The pages a held request of a prefill engine sends (src) and a preallocated request of a
/// decode engine receives (dst): its prompt pages from the first one the decode engine's prefix
/// cache did not match (the ones before hold that KV already).
struct PdPages {
  std::vector<PageId> src, dst;
};

inline PdPages pd_pages(engine::Engine& prefill, engine::RequestId held, engine::Engine& decode,
                        engine::RequestId preallocated) {
  const auto start = static_cast<std::ptrdiff_t>(decode.output(preallocated).cached_tokens /
                                                 decode.worker().kv_pool().page_size());
  PdPages p{prefill.transfer().prompt_pages(held), decode.transfer().prompt_pages(preallocated)};
  p.src.erase(p.src.begin(), p.src.begin() + start);
  p.dst.erase(p.dst.begin(), p.dst.begin() + start);
  return p;
}

/// After the KV moved: the decode request commits the prefill's first token (returns whether
/// that finished it) and the prefill request lets its KV go (into its prefix cache) and ends.
inline bool pd_commit(engine::Engine& prefill, engine::RequestId held, engine::Engine& decode,
                      engine::RequestId preallocated) {
  const bool finished =
      decode.transfer().commit(preallocated, prefill.output(held).output_ids.at(0));
  prefill.transfer().release_kv(held);
  prefill.release(held);
  return finished;
}

}  // namespace pagoda::testing
