#pragma once
/// BackendRegistry: name -> factory, with capabilities as data so a choice can be validated
/// before anything is built (ARCHITECTURE §3). Registration is explicit
/// (register_builtin_backends in backends/builtin.h), never by static initialisers.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/attention/backend.h"

namespace pagoda::attention {

/// What a model/engine configuration needs from a backend.
struct BackendRequirements {
  int page_size = 1;
  int head_dim_qk = 128;
  int head_dim_v = 128;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  bool mla = false;
  bool dsa = false;  ///< DeepSeek sparse attention (capabilities().dsa)
  bool sliding_window = false;
  bool logit_cap = false;
  bool sinks = false;
  bool non_causal = false;
  bool custom_mask = false;
  int topk = 1;
  bool multi_step_draft = false;
  bool mixed_batches = false;
  bool cuda_graph = false;
  std::string device = "cpu";
};

/// Empty when `caps` satisfy `req`; otherwise a human-readable reason ("page size 3 not in
/// {1, 16}", "sinks unsupported", ...).
std::optional<std::string> unsupported_reason(const BackendCapabilities& caps,
                                              const BackendRequirements& req);

class BackendRegistry {
 public:
  using Factory = std::function<std::unique_ptr<AttentionBackend>(const BackendContext&)>;

  /// Adds a backend. Error(kInvalidArgument) on a duplicate name.
  void add(std::string name, std::string description, BackendCapabilities caps, Factory factory);
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;
  /// Capabilities of a registered backend; Error(kUnsupported) listing the names if unknown.
  const BackendCapabilities& capabilities(const std::string& name) const;
  /// Throws Error(kUnsupported) when `name` is unknown or cannot serve `req`; the message names
  /// the reason and the backends that would work.
  void validate(const std::string& name, const BackendRequirements& req) const;
  /// validate(), then build.
  std::unique_ptr<AttentionBackend> create(const std::string& name, const BackendRequirements& req,
                                           const BackendContext& ctx) const;

 private:
  struct Entry {
    std::string name;
    std::string description;
    BackendCapabilities caps;
    Factory factory;
  };
  const Entry* find(const std::string& name) const;
  std::vector<Entry> entries_;
};

}  // namespace pagoda::attention
