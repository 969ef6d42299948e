#include "pagoda/engine/output_processor.h"

#include <algorithm>

#include "pagoda/engine/engine.h"
#include "pagoda/model/step_input.h"

namespace pagoda::engine {

using attention::ForwardMode;

bool check_finished(Req& req, int32_t token, int32_t eos, int32_t max_context_len) {
  if (req.constraint != nullptr && !req.constraint->error().empty()) {
    req.out.finish_reason = FinishReason::kError;
    req.out.error = "structured output: " + req.constraint->error();
  } else if (!req.ignore_eos && eos >= 0 && token == eos) {
    req.out.finish_reason = FinishReason::kStop;
  } else if (req.constraint != nullptr && req.constraint->done()) {
    req.out.finish_reason = FinishReason::kStop;
  } else if (req.num_output() >= req.max_new_tokens) {
    req.out.finish_reason = FinishReason::kLength;
  } else if (req.num_tokens() >= max_context_len) {
    req.out.finish_reason = FinishReason::kContext;
  } else {
    return false;
  }
  return true;
}

OutputProcessor::OutputProcessor(Scheduler& scheduler, const model::ModelConfig& model,
                                 int32_t max_context_len, EngineStats& stats,
                                 std::chrono::steady_clock::time_point start)
    : scheduler_(scheduler),
      model_(model),
      max_context_len_(max_context_len),
      stats_(stats),
      start_(start) {}

double OutputProcessor::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void OutputProcessor::build_batch(const ScheduledStep& s, model::WorkerBatch& b) const {
  model::StepInput in{.mode = s.mode, .seqs = {}, .out_cache_loc = s.out_cache_loc};
  in.seqs.reserve(s.seqs.size());
  b.input_ids.clear();
  b.logit_rows.clear();
  b.sampling.clear();
  b.sample_step.clear();
  b.logit_adjust.clear();
  b.mask_rows.clear();
  b.token_mask.clear();
  const auto words = static_cast<size_t>(model::token_mask_words(model_.vocab_size));
  b.context.clear();
  b.max_emit.clear();
  b.stop_token.clear();
  b.state_slots.clear();
  const int32_t eos = model_.eos_token_id;
  int64_t rows = 0;  // logit rows so far
  for (const ScheduledSeq& q : s.seqs) {
    const Req& r = *q.req;
    const auto tokens =
        std::span<const int32_t>(r.cache.tokens)
            .subspan(static_cast<size_t>(q.prefix_len), static_cast<size_t>(q.num_tokens));
    in.seqs.push_back(model::StepSequence{.req_slot = r.cache.req_slot.value(),
                                          .prefix_len = static_cast<int32_t>(q.prefix_len),
                                          .tokens = tokens,
                                          .want_logits = q.completes_fill});
    b.input_ids.insert(b.input_ids.end(), tokens.begin(), tokens.end());
    if (q.completes_fill) {
      if (r.logit_processing.penalized())  // counts the tokens appended since the last step
        q.req->token_counts.extend(r.cache.tokens, r.prompt_len);
      model::append_logit_adjust(r.token_counts, r.logit_processing, static_cast<int32_t>(rows),
                                 b.logit_adjust);
      if (r.constraint != nullptr) {  // structured output: the matcher writes the row's mask
        const size_t at = b.token_mask.size();
        b.mask_rows.push_back(static_cast<int32_t>(rows));
        b.token_mask.resize(at + words, 0u);  // zeroed, as allowed() expects
        r.constraint->allowed(std::span<uint32_t>(b.token_mask).subspan(at, words));
      }
      ++rows;
    }
    b.logit_rows.push_back(q.completes_fill ? 1 : 0);
    b.sampling.push_back(r.sampling);
    b.sample_step.push_back(r.num_output());
    if (r.cache.state_slot >= 0) b.state_slots.push_back(r.cache.state_slot);
    // What check_finished ends the request on: its stop token, and the tokens left before
    // max_new_tokens or the context is reached.
    b.context.emplace_back(r.cache.tokens);
    b.max_emit.push_back(static_cast<int32_t>(
        std::min<int64_t>(r.max_new_tokens - r.num_output(), max_context_len_ - r.num_tokens())));
    b.stop_token.push_back(r.ignore_eos || eos < 0 ? -1 : eos);
  }
  b.forward = model::build_forward_batch(in);  // the one ForwardBatch builder (step_input.h)
  bool any_logprobs = false;
  for (const ScheduledSeq& q : s.seqs) any_logprobs |= q.completes_fill && q.req->logprobs >= 0;
  b.return_logits = static_cast<bool>(observer_) || any_logprobs;
  // Several tokens per sequence only where nobody needs every row's logits and no waiting
  // request could be admitted instead (a speculative worker then runs a round).
  b.allow_multi_token =
      s.mode == ForwardMode::kDecode && !b.return_logits && !scheduler_.wants_prefill();
}

void OutputProcessor::take_aborted(const ScheduledStep& s, StepOutput& out) const {
  for (Req* r : s.aborted) {
    r->out.finish_s = now();
    out.finished.push_back(r->id);
  }
}

bool OutputProcessor::take(Req& r, const model::WorkerOutput& result, size_t row, double t,
                           StepOutput& out, std::vector<ReqSlot>* next_step_rows) {
  const int32_t token = r.cache.tokens.back();
  std::span<const float> logits;  // empty when the worker returned none
  if (!result.logits.empty()) {
    const auto vocab = static_cast<size_t>(model_.vocab_size);
    logits = std::span<const float>(result.logits).subspan(row * vocab, vocab);
  }
  if (observer_) observer_(r.id, logits);
  if (r.logprobs >= 0) {  // the row the worker sampled from (processed, before temperature)
    r.out.logprobs.push_back(model::token_logprobs(logits, token, r.logprobs));
    out.logprobs.resize(out.tokens.size());
    out.logprobs.push_back(r.out.logprobs.back());
  }
  ++stats_.generated_tokens;
  if (r.out.first_token_s < 0) r.out.first_token_s = t;
  out.tokens.emplace_back(r.id, token);
  if (r.state == RequestState::kFinished) return true;  // aborted meanwhile: keeps its reason
  if (r.constraint != nullptr && (r.ignore_eos || token != model_.eos_token_id))
    r.constraint->consume(token);
  if (!check_finished(r, token, model_.eos_token_id, max_context_len_)) return false;
  r.out.finish_s = t;
  out.finished.push_back(r.id);
  if (r.state == RequestState::kWaiting) {  // retracted meanwhile (overlap loop)
    scheduler_.cancel(&r, r.out.finish_reason);
  } else if (r.hold_kv) {  // a prefill server's request: its KV waits for the transfer
    scheduler_.hold(&r);
    r.out.kv_held = true;
  } else if (next_step_rows != nullptr) {
    // The step in flight computes one token too many for it: that decode is taken back, and
    // the step still reads its row, which the caller frees after it.
    scheduler_.undo_decode(&r);
    next_step_rows->push_back(scheduler_.finish_keep_row(&r));
  } else {
    scheduler_.finish(&r);
  }
  return true;
}

void OutputProcessor::count(const StepOutput& out) {
  ++stats_.steps;
  stats_.computed_tokens += out.num_tokens;
  switch (out.mode) {
    case ForwardMode::kExtend:
      ++stats_.extend_steps;
      break;
    case ForwardMode::kDecode:
      ++stats_.decode_steps;
      break;
    case ForwardMode::kMixed:
      ++stats_.mixed_steps;
      break;
    default:
      break;
  }
}

}  // namespace pagoda::engine
