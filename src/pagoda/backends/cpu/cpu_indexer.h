#pragma once
/// The cpu backend's DSA lightning indexer (AttentionBackend::select_index_topk; attention/dsa.h
/// states the selection): index_topk_host's contract in f32 with OpenBLAS and OpenMP instead of
/// f64 in one thread (the queries rounded to the key grid as there). Per request, its keys are
/// decoded once (e4m3 code · scale, f32, in
/// parallel) for all of its rows; per row, S = q [heads, dim] · keysᵀ [dim, visible] is one
/// sgemm, then score(p) = Σ_h w_h · max(S[h, p], 0) (f32, heads in order, vectorised over
/// positions, parallel), and the top k by (score descending, position ascending) come from
/// nth_element + a sort of the k kept. Equal keys give bitwise-equal scores (the same
/// operations per column), so exact ties keep the tie rule. Accuracy: f32 sums over dim and
/// heads, within the conformance column's tolerance ((dim + heads) unit roundoffs of the
/// terms' magnitude, as for the cuda backend).
///
/// Host pools only (kUnsupported otherwise); argument checks are check_index_query's (nothing
/// is written on an error). Runs on the caller's OpenMP pool.

#include <cstdint>
#include <span>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/ids.h"
#include "pagoda/kv/kv_pool.h"

namespace pagoda::backends {

void cpu_index_topk(const kv::KvPool& pool, LayerId layer, const attention::IndexerMetadata& meta,
                    const attention::IndexerQuery& q, int k, std::span<int32_t> topk,
                    std::span<float> scores);

}  // namespace pagoda::backends
