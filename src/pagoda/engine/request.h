#pragma once
/// Requests as the engine's users see them (GenerateRequest in, RequestOutput out) and as the
/// scheduler tracks them (Req). Contract: docs/design/engine.md.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/cache/prefix_cache.h"
#include "pagoda/engine/token_constraint.h"
#include "pagoda/model/logit_processing.h"
#include "pagoda/model/sampler.h"

namespace pagoda::engine {

/// Engine-assigned request id (0, 1, 2, ... in submission order).
using RequestId = int64_t;

/// One generation to run.
struct GenerateRequest {
  std::vector<int32_t> prompt;  ///< token ids, non-empty, each < vocab_size
  int32_t max_new_tokens = 16;  ///< >= 1
  model::SamplingParams sampling{};
  /// logit_bias and penalties, applied to the logits before sampling (the worker's eager path;
  /// not with speculative decoding: Error(kUnsupported)).
  model::LogitProcessing logit_processing{};
  /// -1: none; n in [0, model::kMaxLogprobs]: each output token's log-probability and the n most
  /// likely alternatives (RequestOutput::logprobs, StepOutput::logprobs; not with speculative
  /// decoding: Error(kUnsupported)).
  int32_t logprobs = -1;
  /// Structured output: the tokens allowed at each step (token_constraint.h); null = any. One
  /// per request (it holds the request's state); not with speculative decoding (kUnsupported).
  std::shared_ptr<TokenConstraint> constraint{};
  /// Keep generating after EOS (benchmarks: every request produces max_new_tokens).
  bool ignore_eos = false;
  /// Prefix-cache namespace (SGLang's extra_key); requests only share KV within one namespace.
  std::string extra_key{};
  /// Prefill–decode disaggregation, prefill side (docs/design/pd.md): when the request finishes,
  /// its row and prompt KV stay held (RequestOutput::kv_held) until EngineTransfer::release_kv.
  bool hold_kv = false;
};

enum class RequestState : uint8_t {
  kWaiting,     ///< queued (new or retracted); holds no KV, no row, no lock
  kPrefilling,  ///< chunked prefill in progress; holds a row, a lock and its KV so far
  kDecoding,    ///< running: every step decodes one token
  kFinished,    ///< done (any FinishReason); holds nothing
};

enum class FinishReason : uint8_t {
  kNone,     ///< not finished
  kLength,   ///< max_new_tokens reached
  kStop,     ///< EOS sampled
  kContext,  ///< the context (max_context_len) is full
  kError,    ///< aborted by the engine: see RequestOutput::error
  kAbort,    ///< aborted by the user (Engine::abort)
};

/// "none", "length", "stop", "context", "error", "abort".
const char* finish_reason_name(FinishReason r);

/// What a user gets back about a request. Times are seconds since the engine started.
struct RequestOutput {
  RequestId id = -1;
  RequestState state = RequestState::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;                ///< set when finish_reason == kError
  int32_t prompt_len = 0;
  std::vector<int32_t> output_ids;
  std::vector<model::TokenLogprobs> logprobs;  ///< one per output token when asked, else empty
  int64_t cached_tokens = 0;        ///< prompt tokens reused from the prefix cache (first admission)
  int32_t num_retractions = 0;
  double arrival_s = 0.0;
  double first_token_s = -1.0;      ///< -1 until the first token
  double finish_s = -1.0;           ///< -1 until finished
  bool kv_held = false;             ///< finished, row and prompt KV held (GenerateRequest::hold_kv)
};

/// The scheduler's view of a request. Owned by the engine; moved between queues by pointer.
struct Req {
  RequestId id = -1;
  int32_t prompt_len = 0;
  int32_t max_new_tokens = 0;
  bool ignore_eos = false;
  bool hold_kv = false;  ///< GenerateRequest::hold_kv
  RequestState state = RequestState::kWaiting;
  /// tokens = prompt ++ output; row, lock and protected prefix (see cache::CacheRequest).
  cache::CacheRequest cache;
  /// Tokens whose K/V is in the pool (positions [0, kv_len) of the row). The last sampled token
  /// has no K/V yet, so kv_len == tokens.size() - 1 while decoding.
  int64_t kv_len = 0;
  /// SWA pool: the leading pages of the row whose window side the request released already
  /// (0 after a retraction).
  int64_t swa_released_pages = 0;
  bool admitted_once = false;
  model::SamplingParams sampling;  ///< validated at add_request; sampled on the worker
  model::LogitProcessing logit_processing;  ///< validated at add_request
  /// Counts of cache.tokens for the penalties (build_batch extends it; empty without them).
  model::TokenCounts token_counts;
  int32_t logprobs = -1;                    ///< GenerateRequest::logprobs
  std::shared_ptr<TokenConstraint> constraint;  ///< GenerateRequest::constraint
  /// Overlap loop: trailing entries of cache.tokens that are placeholders for ids still being
  /// sampled (0–2; docs/design/engine.md "Overlap"). Always 0 without overlap.
  int32_t unresolved = 0;
  RequestOutput out;
  Req(RequestId rid, GenerateRequest&& g, double now);
  int32_t num_output() const { return static_cast<int32_t>(cache.tokens.size()) - prompt_len; }
  int64_t num_tokens() const { return static_cast<int64_t>(cache.tokens.size()); }
};

}  // namespace pagoda::engine
