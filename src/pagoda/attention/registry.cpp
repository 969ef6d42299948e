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
  if (req.dsa_indexer && !caps.dsa_indexer)
    why.push_back("the DSA lightning indexer (select_index_topk: scores and top-k)");
  if (req.ragged && !caps.ragged)
    why.push_back("ragged attention (save_kv, gather_kv, forward_ragged)");
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

std::optional<std::string> unsupported_reason(const LinearCapabilities& caps,
                                              const LinearRequirements& req) {
  std::vector<std::string> why;
  if (!allowed(caps.dtypes, req.dtype)) {
    why.push_back(fmt::format("dtype {} (supports {})", req.dtype, join_dtypes(caps.dtypes)));
  }
  if (req.tree_verify && !caps.tree_verify) why.push_back("tree verify (speculative decoding)");
  if (req.cuda_graph && !caps.cuda_graph) why.push_back("CUDA graphs");
  if (req.device != caps.device) {
    why.push_back(fmt::format("device {} (runs on {})", req.device, caps.device));
  }
  if (why.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(why, "; "));
}

namespace {

template <typename Table>
const typename Table::Entry* find_in(const Table& t, const std::string& name) {
  for (const auto& e : t.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

template <typename Table>
std::vector<std::string> names_in(const Table& t) {
  std::vector<std::string> out;
  for (const auto& e : t.entries) out.push_back(e.name);
  return out;
}

template <typename Table, typename Caps, typename Fn>
void add_to(Table& t, std::string name, std::string description, Caps caps, Fn factory) {
  PAGODA_REQUIRE(!name.empty(), kInvalidArgument, "{} backend name must not be empty", t.kind);
  PAGODA_REQUIRE(find_in(t, name) == nullptr, kInvalidArgument,
                 "{} backend '{}' is already registered", t.kind, name);
  PAGODA_REQUIRE(static_cast<bool>(factory), kInvalidArgument,
                 "{} backend '{}' registered without a factory", t.kind, name);
  t.entries.push_back({std::move(name), std::move(description), std::move(caps),
                       std::move(factory)});
}

template <typename Table>
const auto& caps_in(const Table& t, const std::string& name) {
  const auto* e = find_in(t, name);
  PAGODA_REQUIRE(e != nullptr, kUnsupported, "unknown {} backend '{}' (registered: {})", t.kind,
                 name, fmt::join(names_in(t), ", "));
  return e->caps;
}

/// The attention kind keeps its historical message ("backend 'x' cannot serve ...").
template <typename Table, typename Req>
void validate_in(const Table& t, const std::string& name, const Req& req) {
  std::vector<std::string> would;
  for (const auto& e : t.entries) {
    if (!unsupported_reason(e.caps, req)) would.push_back(e.name);
  }
  const std::string alternatives =
      would.empty() ? std::string("none of the registered backends would")
                    : fmt::format("backends that would: {}", fmt::join(would, ", "));
  const auto* e = find_in(t, name);
  PAGODA_REQUIRE(e != nullptr, kUnsupported, "unknown {} backend '{}' (registered: {}); {}",
                 t.kind, name, fmt::join(names_in(t), ", "), alternatives);
  const auto reason = unsupported_reason(e->caps, req);
  const std::string kind = std::string_view(t.kind) == "attention" ? "" : t.kind + std::string(" ");
  PAGODA_REQUIRE(!reason, kUnsupported, "{}backend '{}' cannot serve {}; {}", kind, name,
                 reason.value_or(""), alternatives);
}

template <typename Table, typename Req, typename Ctx>
auto create_in(const Table& t, const std::string& name, const Req& req, const Ctx& ctx) {
  validate_in(t, name, req);
  auto backend = find_in(t, name)->factory(ctx);
  PAGODA_CHECK(backend != nullptr, "factory of {} backend '{}' returned null", t.kind, name);
  return backend;
}

}  // namespace

void BackendRegistry::add(std::string name, std::string description, BackendCapabilities caps,
                          Factory factory) {
  add_to(attention_, std::move(name), std::move(description), std::move(caps),
         std::move(factory));
}

bool BackendRegistry::contains(const std::string& name) const {
  return find_in(attention_, name) != nullptr;
}

std::vector<std::string> BackendRegistry::names() const { return names_in(attention_); }

const BackendCapabilities& BackendRegistry::capabilities(const std::string& name) const {
  return caps_in(attention_, name);
}

void BackendRegistry::validate(const std::string& name, const BackendRequirements& req) const {
  validate_in(attention_, name, req);
}

std::unique_ptr<AttentionBackend> BackendRegistry::create(const std::string& name,
                                                          const BackendRequirements& req,
                                                          const BackendContext& ctx) const {
  return create_in(attention_, name, req, ctx);
}

void BackendRegistry::add_linear(std::string name, std::string description,
                                 LinearCapabilities caps, LinearFactory factory) {
  add_to(linear_, std::move(name), std::move(description), std::move(caps), std::move(factory));
}

bool BackendRegistry::contains_linear(const std::string& name) const {
  return find_in(linear_, name) != nullptr;
}

std::vector<std::string> BackendRegistry::linear_names() const { return names_in(linear_); }

const LinearCapabilities& BackendRegistry::linear_capabilities(const std::string& name) const {
  return caps_in(linear_, name);
}

void BackendRegistry::validate_linear(const std::string& name,
                                      const LinearRequirements& req) const {
  validate_in(linear_, name, req);
}

std::unique_ptr<LinearAttentionBackend> BackendRegistry::create_linear(
    const std::string& name, const LinearRequirements& req,
    const LinearBackendContext& ctx) const {
  return create_in(linear_, name, req, ctx);
}

}  // namespace pagoda::attention
