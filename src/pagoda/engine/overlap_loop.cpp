#include "pagoda/engine/overlap_loop.h"

#include <algorithm>
#include <memory>
#include <utility>

namespace pagoda::engine {

OverlapLoop::OverlapLoop(Scheduler& scheduler, model::ModelWorker& worker,
                         kv::ReqToTokenTable& table, OutputProcessor& outputs,
                         tier::HiCache* hicache)
    : scheduler_(scheduler), worker_(worker), table_(table), outputs_(outputs), hicache_(hicache) {}

OverlapLoop::~OverlapLoop() = default;

StepOutput OverlapLoop::step() {
  StepOutput out = std::exchange(drained_, StepOutput{});
  std::unique_ptr<InFlight> prev = std::move(inflight_);
  // Logit processing (penalties) and token constraints read a request's output so far: its ids
  // must be known before its next batch is built, so that step is not overlapped.
  if (prev != nullptr && std::ranges::any_of(prev->s.seqs, [](const ScheduledSeq& q) {
        return q.req != nullptr &&
               (q.req->logit_processing.active() || q.req->constraint != nullptr);
      })) {
    resolve(*prev, out);
    prev.reset();
  }
  ScheduledStep s = scheduler_.schedule();
  outputs_.take_aborted(s, out);
  if (!s.empty()) launch(std::move(s));
  if (prev != nullptr) resolve(*prev, out);
  return out;
}

void OverlapLoop::drain() {
  if (inflight_ == nullptr) return;
  std::unique_ptr<InFlight> f = std::move(inflight_);
  resolve(*f, drained_);
}

void OverlapLoop::wait() const {
  if (inflight_ != nullptr) inflight_->result.wait();
}

int64_t OverlapLoop::held_rows() const {
  return inflight_ == nullptr ? 0 : static_cast<int64_t>(inflight_->rows.size());
}

void OverlapLoop::launch(ScheduledStep s) {
  auto f = std::make_unique<InFlight>();
  f->s = std::move(s);
  outputs_.build_batch(f->s, f->batch);
  f->batch.context.clear();  // views of token vectors that grow below; only speculation reads them
  model::WorkerBatch* batch = &f->batch;
  // The copies queued so far run on the step thread right before this step's forward (after
  // the step before it); copies queued from here on go with the next step.
  auto copies = std::make_shared<tier::StepCopies>(
      hicache_ != nullptr ? hicache_->begin_step() : tier::StepCopies{});
  // What the worker reads from the scheduler's host state is staged here, before the scheduler
  // writes the next step's (tensor parallelism: the table entries the followers need, so the
  // table's dirty ranges stay on this thread).
  auto staged = std::make_shared<std::vector<std::byte>>(worker_.stage(f->batch));
  // The future-id slot: a negative input id -(k + 1) is the k-th id the previous step samples.
  // The step thread runs the steps in order, so that step has written future_ids_ by now.
  f->result = thread_.submit([this, batch, copies, staged] {
    for (int32_t& id : batch->input_ids)
      if (id < 0) id = future_ids_.at(static_cast<size_t>(-id - 1));
    const tier::ForwardScope forward(hicache_, std::move(*copies));
    model::WorkerOutput o = worker_.run_staged(*batch, *staged);
    future_ids_ = o.tokens;
    return o;
  });
  // Booked as done: the scheduler's next step follows this one (its KV is written by then).
  int32_t k = 0;
  for (const ScheduledSeq& q : f->s.seqs) {
    if (q.is_decode) {
      scheduler_.complete_decode(q.req, 1);
    } else {
      scheduler_.complete_extend(q);
    }
    if (q.completes_fill) {
      q.req->cache.tokens.push_back(-++k);
      ++q.req->unresolved;
    }
  }
  inflight_ = std::move(f);
}

void OverlapLoop::resolve(InFlight& f, StepOutput& out) {
  const model::WorkerOutput result = f.result.get();
  for (ReqSlot row : f.rows) table_.free(row);  // nothing reads them any more
  out.mode = f.s.mode;
  out.num_seqs = static_cast<int32_t>(f.s.seqs.size());
  out.num_tokens = static_cast<int64_t>(f.batch.input_ids.size());
  const double t = outputs_.now();
  size_t row = 0;
  for (const ScheduledSeq& q : f.s.seqs) {
    if (!q.completes_fill) continue;
    const size_t k = row++;
    Req* r = q.req;
    if (r == nullptr) continue;  // it finished one step earlier: this extra token is discarded
    // Its placeholder is the last token, or the one before the next step's placeholder (then
    // it is in the step in flight, inflight_).
    std::vector<int32_t>& tokens = r->cache.tokens;
    const bool in_next = r->unresolved == 2;
    const int32_t next_placeholder = tokens.back();
    if (in_next) tokens.pop_back();
    tokens.back() = result.tokens[k];
    r->unresolved = 0;
    if (!outputs_.take(*r, result, k, t, out, in_next ? &inflight_->rows : nullptr)) {
      if (in_next) {
        tokens.push_back(next_placeholder);
        r->unresolved = 1;
      }
    } else if (in_next) {  // the step in flight's token for it is never returned
      for (ScheduledSeq& n : inflight_->s.seqs)
        if (n.req == r) n.req = nullptr;
    }
  }
  outputs_.count(out);
}

}  // namespace pagoda::engine
