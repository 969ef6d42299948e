#pragma once
/// OverlapLoop: the engine loop of the overlap scheduler (EngineConfig::overlap, `--overlap on`;
/// docs/design/engine.md "Overlap"), SGLang's event_loop_overlap. While the worker runs step N
/// on the StepThread, step() schedules and launches step N + 1 and then resolves step N.
///
/// Contract:
///   - launch: a step is booked as done when it is handed to the worker (complete_decode /
///     complete_extend), and each request whose k-th logit row it samples gets the placeholder
///     -(k + 1) as its last token (Req::unresolved counts them, at most 2). The next step's batch
///     carries those placeholders as input ids; the step thread replaces them with the ids the
///     previous step sampled before it runs that step (the jobs run in order). The worker
///     stages the step on this thread at launch (ModelWorker::stage: what it reads from host
///     state the scheduler writes next, e.g. a tensor-parallel leader's table entries) and the
///     step thread runs it with what was staged (ModelWorker::run_staged).
///   - resolve: waits for a step's ids, puts them in place of the placeholders and records them
///     through OutputProcessor::take, the plain loop's finish path, one step late. A request it
///     finishes that is also in the step in flight loses that step's token (never returned) and
///     its row is freed once that step has run.
///   - step() returns the resolved step's tokens (the first call, which only launches, none);
///     a step whose requests use logit processing (penalties read the output so far) is
///     resolved before the next one is scheduled.
///   - Outputs (ids, finish reasons, KV in the prefix cache) are the plain loop's; pages of
///     finished requests come back one step later.
///   - Hierarchical cache (`hicache`): launch takes the copies queued so far for the step
///     (HiCache::begin_step, on this thread) and the step thread runs them before the forward
///     (HiCache::begin_forward: backups, then the load-back per layer; end_forward after it), so
///     a load-back is ordered after the step before (which may still read or write the page it
///     lands in) and before the step that reads it, and a write-through backup of pages booked
///     by a launched step runs only after that step wrote them (it is queued after the launch,
///     so it goes with the next step). Every synchronize of the tier controller (device and
///     host evictions, write-back) first waits for the steps in flight (step_barrier(), which
///     the engine installs as the cache's step barrier), so no copy touches a page the step in
///     flight uses and the two threads never use the controller at once. Steps whose
///     scheduling evicts lose their overlap; the others keep it.
///
/// Thread rules: one thread (the engine's) calls it; the worker runs only on the step thread
/// while a step is in flight (wait() before reading the worker's state). `scheduler`, `worker`,
/// `table` and `outputs` must outlive it; the destructor lets the step in flight finish.

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "pagoda/engine/output_processor.h"
#include "pagoda/engine/scheduler.h"
#include "pagoda/engine/step_thread.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/worker.h"
#include "pagoda/tier/hicache.h"

namespace pagoda::engine {

class OverlapLoop {
 public:
  /// `hicache`: the hierarchical cache, or nullptr.
  OverlapLoop(Scheduler& scheduler, model::ModelWorker& worker, kv::ReqToTokenTable& table,
              OutputProcessor& outputs, tier::HiCache* hicache = nullptr);
  ~OverlapLoop();
  OverlapLoop(const OverlapLoop&) = delete;
  OverlapLoop& operator=(const OverlapLoop&) = delete;

  /// One Engine::step() (the file comment): the tokens and finishes of the step it resolved,
  /// after those drain() resolved.
  StepOutput step();
  /// Resolves the step in flight now (Engine::abort); its output comes with the next step().
  void drain();
  /// Waits until the step in flight (if any) has run.
  void wait() const;
  /// Whether a step is in flight (launched, not yet resolved).
  bool busy() const { return inflight_ != nullptr; }
  /// Rows of finished requests that the step in flight still reads (the row audit counts them).
  int64_t held_rows() const;
  /// Blocks until every launched step has run (the hierarchical cache's step barrier).
  void step_barrier() { thread_.wait_idle(); }

 private:
  /// A step the worker is running.
  struct InFlight {
    ScheduledStep s;  ///< seqs[i].req = nullptr once that request finished one step earlier
    model::WorkerBatch batch;
    std::future<model::WorkerOutput> result;
    std::vector<ReqSlot> rows;  ///< rows of requests that finished meanwhile: freed after it
  };
  /// Builds the batch of `s`, hands it to the step thread and books it as done.
  void launch(ScheduledStep s);
  /// Waits for `f`'s ids, puts them in place of the placeholders and records them.
  void resolve(InFlight& f, StepOutput& out);

  Scheduler& scheduler_;
  model::ModelWorker& worker_;
  kv::ReqToTokenTable& table_;
  OutputProcessor& outputs_;
  tier::HiCache* hicache_;
  std::unique_ptr<InFlight> inflight_;
  StepOutput drained_;               ///< resolved by drain(), not yet returned
  std::vector<int32_t> future_ids_;  ///< the last step's ids (step thread only)
  StepThread thread_;                ///< last: it stops first, before what its jobs read goes
};

}  // namespace pagoda::engine
