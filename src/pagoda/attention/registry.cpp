#include "pagoda/attention/registry.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::attention {

namespace {

template <typename T>
bool allowed(const std::vector<T>& list, const T& value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

std::string join_dtypes(const std::vector<DType>& list) {
  std::vector<std::string_view> names;
  for (DType t : list) names.push_back(dtype_name(t));
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

std::optional<std::string> unsupported_reason(const BackendCapabilities& caps,
                                              const BackendRequirements& req) {
  std::vector<std::string> why;
  if (!allowed(caps.page_sizes, req.page_size)) {
    why.push_back(fmt::format("page size {} (supports {})", req.page_size,
                              fmt::join(caps.page_sizes, ", ")));
  }
  if (!allowed(caps.head_dims, req.head_dim_qk) || !allowed(caps.head_dims, req.head_dim_v)) {
    why.push_back(fmt::format("head dims {}/{} (supports {})", req.head_dim_qk, req.head_dim_v,
                              fmt::join(caps.head_dims, ", ")));
  }
  if (!allowed(caps.q_dtypes, req.q_dtype)) {
    why.push_back(
        fmt::format("q dtype {} (supports {})", req.q_dtype, join_dtypes(caps.q_dtypes)));
  }
  if (!allowed(caps.kv_dtypes, req.kv_dtype)) {
    why.push_back(
        fmt::format("kv dtype {} (supports {})", req.kv_dtype, join_dtypes(caps.kv_dtypes)));
  }
  if (req.mla && !caps.mla) why.push_back("MLA (absorbed) attention");
  if (req.dsa && !caps.dsa)
    why.push_back("DeepSeek sparse attention (indexer metadata hook and sparse MLA)");
  if (!req.mla && !caps.mha_gqa_mqa) why.push_back("MHA/GQA/MQA attention (MLA only)");
  if (req.sliding_window && !caps.sliding_window) why.push_back("sliding window");
  if (req.logit_cap && !caps.logit_cap) why.push_back("logit soft cap");
  if (req.sinks && !caps.sinks) why.push_back("attention sinks");
  if (req.non_causal && !caps.non_causal) why.push_back("non-causal attention");
  if (req.custom_mask && !caps.custom_mask) why.push_back("tree-mask (custom mask) verify");
  if (req.multi_step_draft && !caps.multi_step_draft) why.push_back("multi-step draft");
  if (req.topk > caps.max_topk) {
    why.push_back(fmt::format("speculative topk {} (max {})", req.topk, caps.max_topk));
  }
  if (req.mixed_batches && !caps.mixed_batches) why.push_back("mixed batches");
  if (req.cuda_graph && !caps.cuda_graph) why.push_back("CUDA graphs");
  if (req.device != caps.device) {
    why.push_back(fmt::format("device {} (runs on {})", req.device, caps.device));
  }
  if (why.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(why, "; "));
}

void BackendRegistry::add(std::string name, std::string description, BackendCapabilities caps,
                          Factory factory) {
  PAGODA_REQUIRE(!name.empty(), kInvalidArgument, "attention backend name must not be empty");
  PAGODA_REQUIRE(find(name) == nullptr, kInvalidArgument,
                 "attention backend '{}' is already registered", name);
  PAGODA_REQUIRE(static_cast<bool>(factory), kInvalidArgument,
                 "attention backend '{}' registered without a factory", name);
  entries_.push_back(
      Entry{std::move(name), std::move(description), std::move(caps), std::move(factory)});
}

bool BackendRegistry::contains(const std::string& name) const { return find(name) != nullptr; }

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

const BackendCapabilities& BackendRegistry::capabilities(const std::string& name) const {
  const Entry* e = find(name);
  PAGODA_REQUIRE(e != nullptr, kUnsupported, "unknown attention backend '{}' (registered: {})",
                 name, fmt::join(names(), ", "));
  return e->caps;
}

void BackendRegistry::validate(const std::string& name, const BackendRequirements& req) const {
  std::vector<std::string> would;
  for (const auto& e : entries_) {
    if (!unsupported_reason(e.caps, req)) would.push_back(e.name);
  }
  const std::string alternatives =
      would.empty() ? std::string("none of the registered backends would")
                    : fmt::format("backends that would: {}", fmt::join(would, ", "));
  const Entry* e = find(name);
  PAGODA_REQUIRE(e != nullptr, kUnsupported, "unknown attention backend '{}' (registered: {}); {}",
                 name, fmt::join(names(), ", "), alternatives);
  const auto reason = unsupported_reason(e->caps, req);
  PAGODA_REQUIRE(!reason, kUnsupported, "backend '{}' cannot serve {}; {}", name,
                 reason.value_or(""), alternatives);
}

std::unique_ptr<AttentionBackend> BackendRegistry::create(const std::string& name,
                                                          const BackendRequirements& req,
                                                          const BackendContext& ctx) const {
  validate(name, req);
  auto backend = find(name)->factory(ctx);
  PAGODA_CHECK(backend != nullptr, "factory of backend '{}' returned null", name);
  return backend;
}

const BackendRegistry::Entry* BackendRegistry::find(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace pagoda::attention
