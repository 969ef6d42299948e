#pragma once
/// The WorkerBatch on the wire: what the tensor-parallel leader sends every follower rank each
/// step (the follower's worker then runs exactly the leader's batch). Every field of the batch
/// (forward batch with its spec info, ids, logit rows, sampling, sample steps, logit_adjust,
/// token masks, return_logits, top_k)
/// round-trips bit for bit.

#include <cstddef>
#include <span>
#include <vector>

#include "pagoda/dist/wire.h"
#include "pagoda/model/worker.h"

namespace pagoda::model {

/// Appends `batch` to `w`.
void encode_worker_batch(const WorkerBatch& batch, dist::WireWriter& w);

/// Reads one batch written by encode_worker_batch into `batch` (overwritten). Throws
/// Error(kInvalidArgument) on a malformed message (a short one, an unknown mode, vectors whose
/// sizes disagree with the batch size); `batch` is then unspecified.
void decode_worker_batch(dist::WireReader& r, WorkerBatch& batch);

}  // namespace pagoda::model
