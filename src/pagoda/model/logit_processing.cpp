#include "pagoda/model/logit_processing.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::model {

void LogitProcessing::validate(int64_t vocab) const {
  auto in = [](float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  PAGODA_REQUIRE(in(presence_penalty, -2.f, 2.f), kInvalidArgument,
                 "presence_penalty {} outside [-2, 2]", presence_penalty);
  PAGODA_REQUIRE(in(frequency_penalty, -2.f, 2.f), kInvalidArgument,
                 "frequency_penalty {} outside [-2, 2]", frequency_penalty);
  PAGODA_REQUIRE(in(repetition_penalty, 0.f, 2.f) && repetition_penalty > 0.f,
                 kInvalidArgument, "repetition_penalty {} outside (0, 2]", repetition_penalty);
  for (const auto& [token, bias] : logit_bias) {
    PAGODA_REQUIRE(token >= 0 && token < vocab, kInvalidArgument,
                   "logit_bias token {} outside the vocabulary [0, {})", token, vocab);
    PAGODA_REQUIRE(in(bias, -100.f, 100.f), kInvalidArgument,
                   "logit_bias {} of token {} outside [-100, 100]", bias, token);
  }
}

void TokenCounts::extend(std::span<const int32_t> tokens, int32_t prompt_len) {
  PAGODA_CHECK(static_cast<int64_t>(tokens.size()) >= counted_ && prompt_len >= 0);
  const auto old = static_cast<std::ptrdiff_t>(by_token_.size());
  for (auto i = counted_; i < static_cast<int64_t>(tokens.size()); ++i)
    by_token_.push_back(Count{.token = tokens[static_cast<size_t>(i)],
                              .output = i < prompt_len ? 0 : 1,
                              .prompt = i < prompt_len});
  counted_ = static_cast<int64_t>(tokens.size());
  // Sort the new tokens, merge them in, then fold each run of one token into its first entry.
  auto by = [](const Count& a, const Count& b) { return a.token < b.token; };
  std::sort(by_token_.begin() + old, by_token_.end(), by);
  std::inplace_merge(by_token_.begin(), by_token_.begin() + old, by_token_.end(), by);
  size_t kept = 0;
  for (const Count& c : by_token_) {
    if (kept > 0 && by_token_[kept - 1].token == c.token) {
      by_token_[kept - 1].output += c.output;
      by_token_[kept - 1].prompt = by_token_[kept - 1].prompt || c.prompt;
    } else {
      by_token_[kept++] = c;
    }
  }
  by_token_.resize(kept);
}

void append_logit_adjust(const TokenCounts& counts, const LogitProcessing& p, int32_t row,
                         std::vector<LogitAdjust>& out) {
  if (!p.active()) return;
  // logit_bias sorted by token, the last entry of a token winning (stable sort, keep the last).
  std::vector<std::pair<int32_t, float>> bias = p.logit_bias;
  std::stable_sort(bias.begin(), bias.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const bool rep = p.repetition_penalty != 1.f;
  const bool sub = p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
  auto b = bias.begin();
  auto emit_bias_below = [&](int64_t token) {  // the bias entries of tokens < token
    for (; b != bias.end() && b->first < token; ++b) {
      if (std::next(b) != bias.end() && std::next(b)->first == b->first) continue;
      out.push_back(LogitAdjust{.row = row, .token = b->first, .bias = b->second});
    }
  };
  if (rep || sub) {
    for (const TokenCounts::Count& c : counts.by_token()) {
      const int32_t token = c.token;
      emit_bias_below(token);
      LogitAdjust e{.row = row, .token = token};
      bool biased = false;
      for (; b != bias.end() && b->first == token; ++b) {
        e.bias = b->second;
        biased = true;
      }
      if (rep) e.rep = p.repetition_penalty;
      const bool counted_sub = sub && c.output > 0;
      if (counted_sub)
        e.sub = p.presence_penalty + p.frequency_penalty * static_cast<float>(c.output);
      if (rep || counted_sub || biased) out.push_back(e);
    }
  }
  emit_bias_below(int64_t{1} << 32);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top_n) {
  PAGODA_CHECK(!logits.empty() && token >= 0 && static_cast<size_t>(token) < logits.size() &&
               top_n >= 0 && static_cast<size_t>(top_n) <= logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprobs out;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - lse);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  for (int32_t i = 0; i < top_n; ++i)
    out.top.emplace_back(ids[static_cast<size_t>(i)],
                         static_cast<float>(logits[static_cast<size_t>(ids[static_cast<size_t>(i)])] - lse));
  return out;
}

void apply_logit_adjust(float* logits, int64_t vocab, std::span<const LogitAdjust> adj) {
  for (const LogitAdjust& a : adj) {
    float& l = logits[static_cast<int64_t>(a.row) * vocab + a.token];
    const float l1 = l + a.bias;
    l = (l1 > 0.f ? l1 / a.rep : l1 * a.rep) - a.sub;
  }
}

namespace {
/// The bits of a mask's last word that name tokens (the rest lie past the vocabulary).
uint32_t last_word_bits(int64_t vocab) {
  const int64_t tail = vocab - (token_mask_words(vocab) - 1) * 32;  // 1..32
  return tail == 32 ? ~0u : (1u << tail) - 1u;
}
}  // namespace

void apply_token_mask(float* logits, int64_t vocab, std::span<const int32_t> rows,
                      std::span<const uint32_t> mask) {
  const int64_t words = token_mask_words(vocab);
  PAGODA_CHECK(mask.size() >= rows.size() * static_cast<size_t>(words));
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const uint32_t past_vocab = ~last_word_bits(vocab);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* l = logits + static_cast<int64_t>(rows[i]) * vocab;
    const uint32_t* m = mask.data() + i * static_cast<size_t>(words);
    for (int64_t w = 0; w < words; ++w) {
      // Bits past the vocabulary count as allowed, so they are never written.
      const uint32_t bits = m[w] | (w + 1 == words ? past_vocab : 0u);
      if (bits == ~0u) continue;  // every token of the word allowed
      float* lw = l + w * 32;
      if (bits == 0) {  // none (most words of a narrow grammar state); a whole word
        std::fill(lw, lw + 32, kMasked);
        continue;
      }
      for (uint32_t x = ~bits; x != 0; x &= x - 1) lw[std::countr_zero(x)] = kMasked;
    }
  }
}

bool mask_allows_some(std::span<const uint32_t> mask, int64_t vocab) {
  const int64_t words = token_mask_words(vocab);
  PAGODA_CHECK(static_cast<int64_t>(mask.size()) >= words);
  for (int64_t w = 0; w + 1 < words; ++w)
    if (mask[static_cast<size_t>(w)] != 0) return true;
  return words > 0 && (mask[static_cast<size_t>(words - 1)] & last_word_bits(vocab)) != 0;
}

}  // namespace pagoda::model
