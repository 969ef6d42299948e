#pragma once
/// OutputProcessor: what the engine's two loops share (Engine::step, the plain loop, and
/// OverlapLoop, overlap_loop.h; docs/design/engine.md "Overlap"): a scheduled step's
/// WorkerBatch, and the path from a sampled id to a request's output. take() records a token
/// (logits observer, logprobs, counters, first-token time), checks the finish conditions (EOS,
/// max_new_tokens, context) and ends a request its token finishes — the one finish path of both
/// loops:
///   - a request of a prefill server (hold_kv) keeps its row and KV for the transfer
///     (Scheduler::hold, RequestOutput::kv_held);
///   - one the overlap loop's next schedule retracted meanwhile (kWaiting) leaves the queue
///     (Scheduler::cancel, its finish reason kept);
///   - one also in the overlap loop's step in flight has that step's decode undone (its extra
///     token is never returned) and its row handed to the caller, which frees it after that step
///     (Scheduler::undo_decode, finish_keep_row);
///   - any other one finishes (Scheduler::finish: its KV goes to the prefix cache).
/// A request that ended before its token is resolved (aborted by the overlap loop's next
/// schedule) keeps its finish reason; the token is still recorded.
///
/// Thread rules: the engine's thread only (the overlap loop's worker thread never calls it).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "pagoda/attention/forward_mode.h"
#include "pagoda/engine/request.h"
#include "pagoda/engine/scheduler.h"
#include "pagoda/model/config.h"
#include "pagoda/model/logit_processing.h"
#include "pagoda/model/worker.h"

namespace pagoda::engine {

struct EngineStats;

/// What one step produced.
struct StepOutput {
  attention::ForwardMode mode = attention::ForwardMode::kIdle;
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;                             ///< query tokens computed
  std::vector<std::pair<RequestId, int32_t>> tokens;  ///< new tokens, batch order
  std::vector<RequestId> finished;                    ///< finished (any reason) this step
  /// logprobs[i] belongs to tokens[i] when that request asked for logprobs (then i < size);
  /// other entries are empty, and the vector is empty when no request asked.
  std::vector<model::TokenLogprobs> logprobs;
};

/// Observer of every sampled row: (request, logits [vocab]) before sampling. Tests and tools only
/// (installing one makes every step copy its logits to the host).
using LogitsObserver = std::function<void(RequestId, std::span<const float>)>;

/// Sets req's finish reason when `token` (just appended) ends it: a failed token constraint
/// (error), EOS (unless ignore_eos), a complete constraint (stop), then max_new_tokens, then the
/// context; false when it goes on.
bool check_finished(Req& req, int32_t token, int32_t eos, int32_t max_context_len);

class OutputProcessor {
 public:
  /// `scheduler`, `model` and `stats` must outlive it; now() counts from `start`.
  OutputProcessor(Scheduler& scheduler, const model::ModelConfig& model, int32_t max_context_len,
                  EngineStats& stats, std::chrono::steady_clock::time_point start);

  /// Seconds since `start` (the time base of RequestOutput).
  double now() const;
  /// Installs (or clears, with nullptr) the logits observer.
  void set_observer(LogitsObserver observer) { observer_ = std::move(observer); }
  /// Fills `b` from `s` (its requests' tokens as they are now). Every logit row's logits are
  /// returned when an observer is installed or a request asks for logprobs; several tokens per
  /// sequence (a speculative round) are allowed only in a decode step with neither and no
  /// waiting request the scheduler could admit instead.
  void build_batch(const ScheduledStep& s, model::WorkerBatch& b) const;
  /// The requests `s` aborted (Scheduler::schedule) end now: into out.finished.
  void take_aborted(const ScheduledStep& s, StepOutput& out) const;
  /// Records the token at the end of r's tokens, sampled from `result`'s logit row `row` at
  /// time `t`, into `out`, and ends r when it finishes it (the file comment). `next_step_rows`:
  /// null, or (overlap loop) r is in the step in flight, whose batch reads its row: if r ends,
  /// its row is appended there instead of freed. Returns true when r has ended (now or before).
  bool take(Req& r, const model::WorkerOutput& result, size_t row, double t, StepOutput& out,
            std::vector<ReqSlot>* next_step_rows = nullptr);
  /// Counts a resolved step in the stats (steps per mode, computed tokens).
  void count(const StepOutput& out);

 private:
  Scheduler& scheduler_;
  const model::ModelConfig& model_;
  int32_t max_context_len_;
  EngineStats& stats_;
  std::chrono::steady_clock::time_point start_;
  LogitsObserver observer_;
};

}  // namespace pagoda::engine
