#include "pagoda/backends/hybrid/hybrid_backend.h"

#include <algorithm>

#include <fmt/format.h>

#include "pagoda/core/error.h"

namespace pagoda::backends {

using namespace pagoda::attention;

namespace {

template <typename T>
std::vector<T> intersect(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  std::vector<T> out;
  for (const T& x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) out.push_back(x);
  }
  return out;
}

}  // namespace

BackendCapabilities intersect_capabilities(const BackendCapabilities& a,
                                           const BackendCapabilities& b) {
  PAGODA_REQUIRE(a.device == b.device, kInvalidArgument,
                 "a hybrid backend needs both children on one device (got {} and {})", a.device,
                 b.device);
  BackendCapabilities c;
  c.page_sizes = intersect(a.page_sizes, b.page_sizes);
  c.head_dims = intersect(a.head_dims, b.head_dims);
  c.q_dtypes = intersect(a.q_dtypes, b.q_dtypes);
  c.kv_dtypes = intersect(a.kv_dtypes, b.kv_dtypes);
  c.mha_gqa_mqa = a.mha_gqa_mqa && b.mha_gqa_mqa;
  c.mla = a.mla && b.mla;
  c.sliding_window = a.sliding_window && b.sliding_window;
  c.logit_cap = a.logit_cap && b.logit_cap;
  c.sinks = a.sinks && b.sinks;
  c.non_causal = a.non_causal && b.non_causal;
  c.custom_mask = a.custom_mask && b.custom_mask;
  c.max_topk = std::min(a.max_topk, b.max_topk);
  c.multi_step_draft = a.multi_step_draft && b.multi_step_draft;
  c.mixed_batches = a.mixed_batches && b.mixed_batches;
  c.cuda_graph = a.cuda_graph && b.cuda_graph;
  c.lse = a.lse && b.lse;
  c.device = a.device;
  return c;
}

BackendCapabilities hybrid_capabilities(const BackendCapabilities& prefill,
                                        const BackendCapabilities& decode) {
  BackendCapabilities c = intersect_capabilities(prefill, decode);
  c.ragged = prefill.ragged;
  return c;
}

HybridBackend::HybridBackend(std::unique_ptr<AttentionBackend> prefill,
                             std::unique_ptr<AttentionBackend> decode, VerifyRoute verify)
    : prefill_(std::move(prefill)), decode_(std::move(decode)), verify_(verify) {
  PAGODA_REQUIRE(prefill_ != nullptr && decode_ != nullptr, kInvalidArgument,
                 "HybridBackend needs both a prefill and a decode backend");
  caps_ = hybrid_capabilities(prefill_->capabilities(), decode_->capabilities());
}

std::string HybridBackend::name() const {
  return fmt::format("hybrid({},{})", prefill_->name(), decode_->name());
}

AttentionBackend& HybridBackend::backend_for(ForwardMode mode) const {
  if (is_decode_or_idle(mode)) return *decode_;
  if (mode == ForwardMode::kTargetVerify && verify_ == VerifyRoute::kDecode) return *decode_;
  return *prefill_;
}

void HybridBackend::init_forward_metadata(const ForwardBatch& batch) {
  backend_for(batch.mode).init_forward_metadata(batch);
}

void HybridBackend::save_kv(const TensorView& k, const TensorView& v, const AttentionLayer& layer,
                            const ForwardBatch& batch) {
  backend_for(batch.mode).save_kv(k, v, layer, batch);
}

void HybridBackend::gather_kv(const AttentionLayer& layer, const ForwardBatch& batch,
                              const KeyWindows& windows, const TensorView& k_out,
                              const TensorView& v_out) {
  backend_for(batch.mode).gather_kv(layer, batch, windows, k_out, v_out);
}

void HybridBackend::forward_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionLayer& layer, const ForwardBatch& batch,
                                   const KeyWindows& windows, const TensorView& out,
                                   const TensorView& lse) {
  backend_for(batch.mode).forward_ragged(q, k, v, layer, batch, windows, out, lse);
}

void HybridBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionLayer& layer, const ForwardBatch& batch,
                                   const TensorView& out, SaveKv save) {
  AttentionBackend& child = backend_for(batch.mode);
  child.set_lse_output(lse_);
  lse_ = TensorView();
  child.forward_extend(q, k, v, layer, batch, out, save);
}

void HybridBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionLayer& layer, const ForwardBatch& batch,
                                   const TensorView& out, SaveKv save) {
  AttentionBackend& child = backend_for(batch.mode);
  child.set_lse_output(lse_);
  lse_ = TensorView();
  child.forward_decode(q, k, v, layer, batch, out, save);
}

void HybridBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  decode_->init_cuda_graph_state(max_bs, max_num_tokens);
}

void HybridBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) {
  decode_->init_forward_metadata_capture_cuda_graph(batch);
}

void HybridBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) {
  decode_->init_forward_metadata_replay_cuda_graph(batch);
}

int HybridBackend::cuda_graph_seq_len_fill_value() const {
  return decode_->cuda_graph_seq_len_fill_value();
}

}  // namespace pagoda::backends
