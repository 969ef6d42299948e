#pragma once
/// Internal helpers of the conformance harness: owning host tensors, the oracle's input rows
/// and answer, and the comparison. Not part of the public API.

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/layer.h"
#include "pagoda/backends/conformance/conformance.h"
#include "pagoda/backends/reference/reference_batch_attention.h"
#include "pagoda/core/tensor_view.h"
#include "pagoda/platform/platform.h"

namespace pagoda::backends::conformance {

/// An owning, contiguous host tensor of rank 0 (empty), 2, 3 or 4.
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  HostTensor() = default;
  HostTensor(std::vector<int64_t> shape, DType dtype);
  int64_t numel() const;
  float get(int64_t i) const;
  void set(int64_t i, float v);
  /// A TensorView of the whole tensor (an empty view when shape is empty).
  TensorView view() const;
  /// The same shape and dtype over `data` on `device` (a device copy of this tensor).
  TensorView view_at(void* data, Device device) const;
};

/// A device copy of a HostTensor: owning buffer plus a view of it. Empty tensors stay empty.
struct DeviceTensor {
  platform::DeviceBuffer buffer;
  TensorView view;
};
/// Allocates `t`'s bytes on `allocator` and copies them there (synchronous copy).
DeviceTensor to_device(const HostTensor& t, platform::Allocator& allocator);
/// Copies a device tensor's bytes back into `t` (same shape and dtype; synchronous copy).
void copy_back(const DeviceTensor& d, HostTensor& t, platform::Allocator& allocator);

/// x rounded to `dtype` and back (exact conversions).
float round_to(DType dtype, float x);
/// Uniform [-1, 1) values rounded to dtype.
HostTensor random_tensor(std::vector<int64_t> shape, DType dtype, std::mt19937_64& rng);
HostTensor filled_tensor(std::vector<int64_t> shape, DType dtype, float value);
/// Rows `toks` of a [*, row] float store as a [toks.size(), heads, row / heads] tensor.
HostTensor gather_rows(const std::vector<float>& store, int row, const std::vector<int>& toks,
                       DType dtype, int heads);

/// A token-granular oracle row (one plan row): qo_len queries over keys `toks` (logical token
/// ids); `bits` the [qo_len, kv_len] visibility when a custom mask applies; `pos` each key's
/// sequence position (a tree node's is prefix + depth), empty = its index. Query i is the key at
/// index kv_len - qo_len + i.
struct DenseRow {
  int qo_len = 0;
  std::vector<int> toks;
  std::vector<uint8_t> bits;
  std::vector<int> pos;
};

/// The oracle's answer: O (f32, [n, Hq, Dv]), LSE (f32, [n, Hq], base 2) and, per LSE element,
/// the tolerance the comparison uses (derived in oracle.h so that one dropped key is seen).
struct Expected {
  HostTensor out;
  HostTensor lse;
  std::vector<double> lse_tol;
};

/// The fault of mutant `spec` ("mutant:<name>" or "mutant"); Error(kInvalidArgument) naming the
/// family when unknown.
ReferenceFaults mutant_faults(const std::string& spec);
/// Mutant `spec` as a backend over `ctx`: the reference with its ReferenceFaults, behind a
/// draft-extend planning fault for the draft-extend members. Errors as mutant_faults().
std::unique_ptr<attention::AttentionBackend> make_mutant(const std::string& spec,
                                                         const attention::BackendContext& ctx);

/// The capabilities of a backend spec: a registry name, "prefill+decode" (their intersection)
/// or a mutant (the reference's).
attention::BackendCapabilities capabilities_of(const attention::BackendRegistry& registry,
                                               const std::string& spec);
/// The backend a spec names, over `ctx` (registry.create, a HybridBackend or make_mutant).
std::unique_ptr<attention::AttentionBackend> make_under_test(
    const attention::BackendRegistry& registry, const std::string& spec,
    const attention::BackendRequirements& req, const attention::BackendContext& ctx);

/// Runs dsa-indexer case `c` (c.dsa_indexer) on `backend` (indexer_runner.cpp): kUnsupported
/// when its capabilities lack the indexer; a device backend on `device_platform` (its index rows
/// copied to a device pool; Error(kFailedPrecondition) when that is not its device's platform).
CaseResult run_indexer_case(const attention::BackendRegistry& registry,
                            const BackendUnderTest& backend, const Case& c, uint64_t seed,
                            platform::Platform* device_platform);

/// Runs linear case `c` (c.linear.op != kNone) on `backend`'s linear kind (linear_runner.cpp):
/// kUnsupported when the spec has none (an attention-only name, a prefill+decode composition,
/// an attention mutant) or it cannot serve the case. A device linear kind runs on
/// `device_platform` (Error(kFailedPrecondition) when that is not its device's platform).
CaseResult run_linear_case(const attention::BackendRegistry& registry,
                           const BackendUnderTest& backend, const Case& c, uint64_t seed,
                           platform::Platform* device_platform);
/// Mutant `spec` of the linear kind (the reference linear backend with its LinearFaults), or
/// nullptr for an attention mutant. Errors as mutant_faults().
std::unique_ptr<attention::LinearAttentionBackend> make_linear_mutant(const std::string& spec);

/// Checks every output element was written (no NaN left from the poisoning) and is within
/// atol + rtol * |expected|; LSE (when given) within expected.lse_tol, -inf exactly.
CaseResult compare(const HostTensor& out, const HostTensor* lse, const Expected& expected,
                   double atol, double rtol);

}  // namespace pagoda::backends::conformance
