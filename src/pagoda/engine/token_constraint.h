#pragma once
/// TokenConstraint: a per-request limit on the tokens a request may sample next (structured
/// output: a grammar matcher, grammar/grammar.h). Before each of the request's sampling steps
/// the engine has it write the allowed set straight into the step's packed bitmask
/// (WorkerBatch::mask_rows / token_mask, worker.h); the worker's sampler masks every other
/// token's logit to -inf (ModelOps::mask_logits, on every device, CUDA graphs included), and
/// the engine tells it each token sampled. A request with one is never overlapped (its next mask needs the token) and is
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
