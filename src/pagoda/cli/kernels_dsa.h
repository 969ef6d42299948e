#pragma once
/// `pagoda kernels --op dsa-decode`: one DeepSeek-V3.2 attention layer's decode step with the
/// lightning indexer's selection (DSA) against the same step dense, on one attention backend
/// (reference / cpu / cuda) over a real MLA kv::KvPool with index keys in the backend's memory
/// (issue 50's targets: the sparse step's attention time against dense MLA at the same context,
/// and the indexer's share of it).
///
///   batch sequences, each seeing kv_len cached tokens (its new token's latent row and index key
///   already in the pool) on shuffled pages; the absorbed MLA shape (q_heads × [kv_lora 512 |
///   rope 64] queries, latent pool in kv_dtype); the indexer's queries [batch, index_heads,
///   index_dim] and head weights (f32, in the backend's memory, as the model ops hand them over)
///   and top-k of `topk`.
///
/// Each sample, after init_forward_metadata (untimed, as the engine builds it once per step for
/// every layer), on the steady clock between stream synchronisations:
///   dense    forward() of the layer over every cached token;
///   first    apply_index_topk() + forward(): the step's first DSA layer (it also builds the
///            step's sparse plan);
///   indexer  apply_index_topk() alone (scores, top-k, the selection handed to the attention:
///            on the device for cuda, through the host for the host backends);
///   sparse   the sparse forward() alone;
///   layer    apply_index_topk() + forward() with no synchronisation between them: the DSA
///            layer as a model runs it (dsa_ms, what DSA / dense compares).
/// Samples alternate dense and DSA; medians and every sample go to the JSON line; a last
/// select_index_topk checks that every row selected min(topk, kv_len) positions. Bytes: dense
/// reads every latent row once; the indexer every index row
/// (index_dim + 4 bytes) once; sparse the selected latent rows. Errors: a bad size or an unknown
/// backend throws pagoda::Error before anything is allocated.

#include <string>

#include "pagoda/core/dtype.h"

namespace pagoda::cli {

struct DsaKernelArgs {
  std::string backend = "cuda";
  int batch = 16;
  int kv_len = 131072;  ///< cached tokens per sequence (the new one included)
  int q_heads = 128;
  int page_size = 64;
  DType kv_dtype = DType::kBF16;  ///< latent pool and queries (f32 on host backends)
  int index_heads = 64;
  int index_dim = 128;
  int topk = 2048;
  int iters = 10;
  int warmup = 2;
  int threads = 1;  ///< the host backends' threads
  bool json = false;
};

void run_dsa_kernels(const DsaKernelArgs& a);

}  // namespace pagoda::cli
