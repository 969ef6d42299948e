#pragma once
/// The reference (oracle) BatchAttention: plain host loops with fp64 accumulation over the CSR
/// page table, honouring every convention of attention/batch_attention.h. Slow by design; every
/// other implementation is checked against it (tests/conformance).

#include <memory>

#include "pagoda/attention/batch_attention.h"

namespace pagoda::backends {

/// Fault injection for the conformance harness's deliberately broken backend ("mutant"). The
/// defaults are the correct oracle; production code never changes them.
struct ReferenceFaults {
  int causal_shift = 0;     ///< added to the causal boundary (-1 hides the diagonal)
  bool drop_sinks = false;  ///< ignore RunParams::sinks
};

/// Creates the oracle. Host memory only (every view must be on the CPU). Not thread-safe.
std::unique_ptr<attention::BatchAttention> make_reference_batch_attention(
    ReferenceFaults faults = {});

}  // namespace pagoda::backends
