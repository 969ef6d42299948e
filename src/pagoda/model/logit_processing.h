#pragma once
/// Per-request logit processing before sampling (OpenAI / vLLM semantics), as sparse
/// LogitAdjust entries (model_ops.h) so that only the logits it changes are touched:
///   1. logit_bias: l += bias[token];
///   2. repetition_penalty p (HF / vLLM): a token seen in the prompt or the output gets
///      l / p when l > 0, else l * p;
///   3. presence / frequency (OpenAI): l -= presence * (count > 0) + frequency * count, where
///      count is how often the token occurs in the output so far (not the prompt).
/// A request without any of them yields no entries (the worker's step is unchanged).

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "pagoda/model/model_ops.h"

namespace pagoda::model {

struct LogitProcessing {
  float presence_penalty = 0.f;    ///< [-2, 2]; 0 = off
  float frequency_penalty = 0.f;   ///< [-2, 2]; 0 = off
  float repetition_penalty = 1.f;  ///< (0, 2]; 1 = off
  /// (token, bias) pairs, bias in [-100, 100]; a token listed twice gets the last bias.
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool active() const { return penalized() || !logit_bias.empty(); }
  /// A penalty is on (it needs the sequence's TokenCounts).
  bool penalized() const {
    return presence_penalty != 0.f || frequency_penalty != 0.f || repetition_penalty != 1.f;
  }
  /// Throws Error(kInvalidArgument) for a value outside its range or a biased token outside
  /// [0, vocab).
  void validate(int64_t vocab) const;
};

/// Running token counts of one sequence (prompt ++ output) for the penalties, kept up to date as
/// its tokens grow so that a step costs O(distinct tokens), not a rescan of the whole history.
class TokenCounts {
 public:
  struct Count {
    int32_t token = 0;
    int32_t output = 0;   ///< occurrences in the output
    bool prompt = false;  ///< occurs in the prompt
  };
  /// Counts tokens[counted(), tokens.size()); the first `prompt_len` of `tokens` are the prompt.
  /// `tokens` must start with the tokens counted so far (they only ever grow). O(distinct + new
  /// tokens * log(new tokens)).
  void extend(std::span<const int32_t> tokens, int32_t prompt_len);
  int64_t counted() const { return counted_; }
  /// Every token counted so far, once, sorted by token (a flat array: a step walks it in order).
  std::span<const Count> by_token() const { return by_token_; }

 private:
  std::vector<Count> by_token_;
  int64_t counted_ = 0;
};

/// Appends the entries of logit row `row` for a sequence whose tokens so far `counts` holds
/// (sorted by token; none when !p.active()).
void append_logit_adjust(const TokenCounts& counts, const LogitProcessing& p, int32_t row,
                         std::vector<LogitAdjust>& out);

/// Structured output's token masks (WorkerBatch::mask_rows / token_mask; the host
/// implementation of ModelOps::mask_logits): logit row rows[i] of logits [.., vocab] keeps token
/// t only where bit t % 32 of mask[i * W + t / 32] is set (W = token_mask_words(vocab)); every
/// other logit of the row becomes -inf. Bits at or past vocab are not read; other rows are
/// untouched. mask.size() >= rows.size() * W.
void apply_token_mask(float* logits, int64_t vocab, std::span<const int32_t> rows,
                      std::span<const uint32_t> mask);

/// Whether one row's mask (W words) allows a token below vocab.
bool mask_allows_some(std::span<const uint32_t> mask, int64_t vocab);

/// One sampled token's log-probabilities: the log-softmax of the logit row it was sampled from
/// (after logit_bias and penalties, before temperature and top-k / top-p / min-p).
struct TokenLogprobs {
  float logprob = 0.f;                          ///< of the sampled token
  std::vector<std::pair<int32_t, float>> top;   ///< the most likely tokens, best first (ties: lower id)
};

/// Most alternatives TokenLogprobs::top may hold (vLLM's default max_logprobs).
inline constexpr int32_t kMaxLogprobs = 20;

/// The log-probabilities of `token` and of the `top_n` (in [0, kMaxLogprobs], <= vocab) most
/// likely tokens of `logits` [vocab] (sums in double).
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top_n);

/// The host implementation of ModelOps::adjust_logits.
void apply_logit_adjust(float* logits, int64_t vocab, std::span<const LogitAdjust> adj);

}  // namespace pagoda::model
