#pragma once
/// ReferenceLinearBackend: the "reference" linear-attention (Mamba2) backend, written straight
/// from the recurrence of attention/linear_backend.h: one token at a time (the conv over the
/// window of the last K inputs, then one SSM step), every sum and state in fp64; the states go
/// back to the pool as f32 after the call's last token. No chunked scan: a prefill of T tokens
/// is T steps. A tree verify keeps each node's state in fp64 and writes it to the node's slot.
/// Host memory, f32 xBC / dt / y; tree verify; no CUDA graphs. One thread.

#include <string>

#include "pagoda/attention/linear_backend.h"
#include "pagoda/attention/registry.h"

namespace pagoda::backends {

/// Deliberate faults for the conformance mutants (backends/conformance/mutants.cpp); none by
/// default.
struct LinearFaults {
  bool stale_state = false;  ///< every call starts from a zero state, ignoring the slot's
  bool conv_shift = false;   ///< the conv window one input early: token t reads t-K..t-1
};

class ReferenceLinearBackend final : public attention::LinearAttentionBackend {
 public:
  explicit ReferenceLinearBackend(LinearFaults faults = {}, std::string name = "reference");

  std::string name() const override { return name_; }
  /// Host f32, tree verify, no CUDA graphs (attention::host_linear_capabilities).
  const attention::LinearCapabilities& capabilities() const override {
    return attention::host_linear_capabilities();
  }

 protected:
  void run(const attention::LinearLayer& layer, const TensorView& xbc, const TensorView& dt,
           const TensorView& y) override;

 private:
  LinearFaults faults_;
  std::string name_;
};

/// Registers the linear kind of "reference" in `registry`.
void register_reference_linear_backend(attention::BackendRegistry& registry);

}  // namespace pagoda::backends
