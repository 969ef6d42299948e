#pragma once
/// TokenConstraint: a per-request limit on the tokens a request may sample next (structured
/// output: a grammar matcher, grammar/grammar.h). The engine asks it for the allowed set before
/// each of the request's sampling steps, masks every other token's logit to -inf (as LogitAdjust
/// entries, model_ops.h: the same path as logit_bias, on every device), and tells it each token
/// sampled. A request with one is never overlapped (its next mask needs the token) and is
/// refused with speculative decoding. Contract: docs/design/engine.md "Token constraints".
///
/// Thread rules: called from the engine's thread only, one call at a time.

#include <cstdint>
#include <span>
#include <string>

namespace pagoda::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  /// Writes the tokens allowed next into `mask` (bit t % 32 of word t / 32; `mask` holds
  /// ceil(vocab / 32) words and arrives zeroed). On an internal failure it leaves only EOS
  /// allowed and error() says why (the request then ends with an error).
  virtual void allowed(std::span<uint32_t> mask) = 0;
  /// Advances past `token` (sampled from the last allowed set; never EOS).
  virtual void consume(int32_t token) = 0;
  /// The constraint is complete and allows nothing more: the request finishes (reason stop).
  virtual bool done() const = 0;
  /// Empty, or why the constraint failed (the request ends with finish reason error).
  virtual std::string error() const = 0;
};

}  // namespace pagoda::engine
