#pragma once
/// The NCCL communicator: one process per GPU, collectives on the rank's CUDA stream (capturable
/// into CUDA graphs). Built when NCCL is found (PyPI's nvidia-nccl-cu13 wheel, or a CUDA
/// toolkit that ships it); without it every call here throws Error(kUnsupported) and
/// nccl_available() is false, so tensor parallelism reports itself unavailable.
///
/// NVLink SHARP multicast is kept off (NCCL_NVLS_ENABLE=0 unless the environment sets it): the
/// device machines' fabric manager does not serve it.

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "pagoda/dist/communicator.h"

namespace pagoda::dist {

/// Whether this build has NCCL.
bool nccl_available();

/// A fresh group id (made once, by rank 0, then given to every rank), as bytes.
std::vector<std::byte> nccl_unique_id();

/// Joins group `id` as `rank` of `world`; blocks until every rank has joined. The calling
/// thread's current CUDA device must be the rank's GPU; `stream` (a cudaStream_t: the platform's
/// native_stream()) carries every collective. Throws Error(kInternal) naming NCCL's error.
std::unique_ptr<Communicator> make_nccl_communicator(std::span<const std::byte> id, int rank,
                                                     int world, void* stream);

}  // namespace pagoda::dist
