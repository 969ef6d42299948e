#pragma once
/// BackendRegistry: name -> factory, with capabilities as data so a choice can be validated
/// before anything is built (ARCHITECTURE §3). Registration is explicit
/// (register_builtin_backends in backends/builtin.h), never by static initialisers.
///
/// One backend per layer kind (issue 49; SGLang's HybridLinearAttnBackend idea): the attention
/// kind (full and sliding-window layers: AttentionBackend) and the linear kind (Mamba2 layers:
/// LinearAttentionBackend, linear_backend.h) are two tables of one registry. A name may be in
/// both ("reference", "cpu"), so one --backend NAME selects both kinds; each table has its own
/// capabilities, requirements and errors ("unknown linear-attention backend 'amx' ...").

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/linear_backend.h"

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
  bool dsa_indexer = false;  ///< DSA's lightning indexer (capabilities().dsa_indexer)
  bool ragged = false;       ///< save_kv / gather_kv / forward_ragged (capabilities().ragged)
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

/// What a model / engine configuration needs from a linear-attention backend.
struct LinearRequirements {
  DType dtype = DType::kF32;
  bool tree_verify = false;
  bool cuda_graph = false;
  std::string device = "cpu";
};

/// Empty when `caps` satisfy `req`; otherwise the reasons ("dtype bf16 (supports f32); device
/// cuda (runs on cpu)").
std::optional<std::string> unsupported_reason(const LinearCapabilities& caps,
                                              const LinearRequirements& req);

class BackendRegistry {
 public:
  using Factory = std::function<std::unique_ptr<AttentionBackend>(const BackendContext&)>;
  using LinearFactory =
      std::function<std::unique_ptr<LinearAttentionBackend>(const LinearBackendContext&)>;

  // ---- The attention kind (full and sliding-window layers) ----
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

  // ---- The linear kind (Mamba2 layers); the same contracts over the linear table ----
  void add_linear(std::string name, std::string description, LinearCapabilities caps,
                  LinearFactory factory);
  bool contains_linear(const std::string& name) const;
  std::vector<std::string> linear_names() const;
  const LinearCapabilities& linear_capabilities(const std::string& name) const;
  void validate_linear(const std::string& name, const LinearRequirements& req) const;
  std::unique_ptr<LinearAttentionBackend> create_linear(const std::string& name,
                                                        const LinearRequirements& req,
                                                        const LinearBackendContext& ctx) const;

 private:
  /// One layer kind's backends (registry.cpp's helpers serve both).
  template <typename Caps, typename Fn>
  struct Table {
    struct Entry {
      std::string name;
      std::string description;
      Caps caps;
      Fn factory;
    };
    const char* kind;  ///< "attention" or "linear-attention", for messages
    std::vector<Entry> entries;
  };
  Table<BackendCapabilities, Factory> attention_{"attention", {}};
  Table<LinearCapabilities, LinearFactory> linear_{"linear-attention", {}};
};

}  // namespace pagoda::attention
