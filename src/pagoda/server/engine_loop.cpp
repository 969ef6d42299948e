// The engine thread of `pagoda serve`.
#include "pagoda/server/engine_loop.h"

#include <chrono>
#include <cstdio>

#include "pagoda/core/error.h"
#include "pagoda/server/api_request.h"

namespace pagoda::server {

RequestStream::Update RequestStream::wait(int timeout_ms) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
               [&] { return !tokens_.empty() || finished_; });
  Update u;
  u.tokens.swap(tokens_);
  u.logprobs.swap(logprobs_);
  u.finished = finished_;
  u.reason = reason_;
  u.error_status = error_status_;
  u.error = error_;
  u.prompt_len = prompt_len;
  u.id = id_;
  return u;
}

void RequestStream::set_id(engine::RequestId id) {
  std::lock_guard lock(mu_);
  id_ = id;
}

void RequestStream::push(int32_t token, const model::TokenLogprobs* logprobs) {
  std::lock_guard lock(mu_);
  tokens_.push_back(token);
  if (logprobs != nullptr) logprobs_.push_back(*logprobs);
}

void RequestStream::finish(engine::FinishReason reason, std::string error, int error_status) {
  {
    std::lock_guard lock(mu_);
    finished_ = true;
    reason_ = reason;
    error_ = std::move(error);
    error_status_ = error_status;
  }
  cv_.notify_one();
}

EngineLoop::EngineLoop(engine::Engine& engine, ServerMetrics& metrics, int64_t max_inflight)
    : engine_(engine), metrics_(metrics), max_inflight_(max_inflight) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    accepting_ = false;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::count_inflight_locked() {
  if (!accepting_) throw ApiError(503, "service_unavailable", "the server is shutting down");
  if (inflight_ >= max_inflight_)
    throw ApiError(503, "service_unavailable",
                   "the request queue is full (" + std::to_string(max_inflight_) +
                       " requests in flight); retry later");
  ++inflight_;
}

std::shared_ptr<RequestStream> EngineLoop::submit(engine::GenerateRequest request,
                                                  StreamWake wake) {
  auto stream = std::make_shared<RequestStream>(wake);
  stream->prompt_len = static_cast<int32_t>(request.prompt.size());
  stream->want_logprobs = request.logprobs >= 0;
  stream->request = std::move(request);
  {
    std::lock_guard lock(mu_);
    count_inflight_locked();
    incoming_.push_back(stream);
  }
  cv_.notify_all();
  return stream;
}

void EngineLoop::cancel(const std::shared_ptr<RequestStream>& stream) {
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(stream);
  }
  cv_.notify_all();
}

void EngineLoop::run_on_loop(std::function<void(engine::Engine&)> task) {
  std::future<void> f;
  {
    std::lock_guard lock(mu_);
    if (stop_) throw ApiError(503, "service_unavailable", "the server is shutting down");
    tasks_.push_back(Task{std::move(task), {}});
    f = tasks_.back().done.get_future();
  }
  cv_.notify_all();
  f.get();
}

std::pair<std::shared_ptr<RequestStream>, engine::RequestId> EngineLoop::submit_transfer(
    engine::GenerateRequest request) {
  auto stream = std::make_shared<RequestStream>();
  stream->prompt_len = static_cast<int32_t>(request.prompt.size());
  {
    std::lock_guard lock(mu_);
    count_inflight_locked();
  }
  engine::RequestId id = -1;
  try {
    run_on_loop([&](engine::Engine& e) {
      id = e.transfer().add_request(std::move(request));
      live_[id] = stream;
      ids_[stream.get()] = id;
      stream->set_id(id);
    });
  } catch (const std::exception& ex) {
    {
      std::lock_guard lock(mu_);
      --inflight_;
    }
    idle_cv_.notify_all();
    if (const auto* api = dynamic_cast<const ApiError*>(&ex)) throw *api;
    const auto* err = dynamic_cast<const Error*>(&ex);
    throw ApiError(!err ? 500 : err->code() == ErrorCode::kResourceExhausted ? 413 : 400,
                   !err ? "server_error" : "invalid_request_error", ex.what());
  }
  return {stream, id};
}

void EngineLoop::run_tasks(std::vector<Task>& tasks) {
  for (Task& t : tasks) {
    try {
      t.fn(engine_);
      t.done.set_value();
    } catch (...) {
      t.done.set_exception(std::current_exception());
    }
  }
  if (tasks.empty()) return;
  std::vector<engine::RequestId> done;
  for (const auto& [id, stream] : live_)
    if (engine_.output(id).state == engine::RequestState::kFinished) done.push_back(id);
  for (engine::RequestId id : done) finish_stream(id, engine_.output(id));
}

EngineSnapshot EngineLoop::snapshot() {
  std::future<EngineSnapshot> f;
  {
    std::lock_guard lock(mu_);
    if (stop_) return {};
    queries_.emplace_back();
    f = queries_.back().get_future();
  }
  cv_.notify_all();
  return f.get();
}

void EngineLoop::stop_accepting() {
  std::lock_guard lock(mu_);
  accepting_ = false;
}

bool EngineLoop::wait_idle(double timeout_s) {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [&] { return inflight_ == 0; });
}

int64_t EngineLoop::inflight() const {
  std::lock_guard lock(mu_);
  return inflight_;
}

void EngineLoop::finish_stream(engine::RequestId id, const engine::RequestOutput& out) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  std::shared_ptr<RequestStream> stream = std::move(it->second);
  live_.erase(it);
  ids_.erase(stream.get());
  const auto n = static_cast<int64_t>(out.output_ids.size());
  const double ttft = out.first_token_s >= 0 ? out.first_token_s - out.arrival_s : -1.0;
  const double tpot = n > 1 ? (out.finish_s - out.first_token_s) / static_cast<double>(n - 1) : -1.0;
  metrics_.observe_request(out.prompt_len, n, ttft, tpot, out.finish_s - out.arrival_s);
  stream->finish(out.finish_reason, out.error, 0);
  if (!out.kv_held) engine_.release(id);  // a held request is released by its owner (pd.h)
  {
    std::lock_guard lock(mu_);
    --inflight_;
  }
  idle_cv_.notify_all();
}

void EngineLoop::run() {
  for (;;) {
    std::deque<std::shared_ptr<RequestStream>> incoming;
    std::vector<std::shared_ptr<RequestStream>> cancels;
    std::vector<std::promise<EngineSnapshot>> queries;
    std::vector<Task> tasks;
    bool stop = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || engine_.has_work() || !incoming_.empty() || !cancels_.empty() ||
               !queries_.empty() || !tasks_.empty();
      });
      incoming.swap(incoming_);
      tasks.swap(tasks_);
      cancels.swap(cancels_);
      queries.swap(queries_);
      stop = stop_;
    }
    for (auto& stream : incoming) {
      try {
        const engine::RequestId id = engine_.add_request(std::move(stream->request));
        live_[id] = stream;
        ids_[stream.get()] = id;
        stream->set_id(id);
      } catch (const std::exception& e) {
        const auto* err = dynamic_cast<const Error*>(&e);
        stream->finish(engine::FinishReason::kError, e.what(),
                       !err ? 500 : err->code() == ErrorCode::kResourceExhausted ? 413 : 400);
        std::lock_guard lock(mu_);
        --inflight_;
      }
    }
    run_tasks(tasks);
    if (stop) {  // shutting down: abort everything still live
      for (auto& [stream_ptr, id] : ids_) cancels.push_back(live_.at(id));
    }
    for (auto& stream : cancels) {
      auto it = ids_.find(stream.get());
      if (it == ids_.end()) continue;  // already finished
      const engine::RequestId id = it->second;
      engine_.abort(id);
      finish_stream(id, engine_.output(id));
    }
    for (auto& q : queries) {
      EngineSnapshot s;
      s.stats = engine_.stats();
      s.leaked_pages = engine_.memory().leaked_pages();
      s.leaked_rows = engine_.memory().leaked_rows();
      s.inflight = inflight();
      q.set_value(std::move(s));
    }
    idle_cv_.notify_all();
    if (stop) return;
    if (!engine_.has_work()) continue;
    try {
      const engine::StepOutput out = engine_.step();
      std::vector<std::shared_ptr<RequestStream>> to_wake;  // the step's kEachToken streams
      for (size_t i = 0; i < out.tokens.size(); ++i) {
        auto it = live_.find(out.tokens[i].first);
        if (it == live_.end()) continue;
        const bool lp = it->second->want_logprobs && i < out.logprobs.size();
        it->second->push(out.tokens[i].second, lp ? &out.logprobs[i] : nullptr);
        // A request's tokens of one step are consecutive (speculation gives several): one wake.
        if (it->second->wake() == StreamWake::kEachToken &&
            (to_wake.empty() || to_wake.back() != it->second))
          to_wake.push_back(it->second);
      }
      waker_.wake(to_wake);  // off this thread (stream_waker.h); a finish below wakes at once
      for (engine::RequestId id : out.finished) finish_stream(id, engine_.output(id));
    } catch (const std::exception& e) {
      // A failed step: every live request ends with the error (the engine's state is unknown).
      std::fprintf(stderr, "pagoda serve: engine step failed: %s\n", e.what());
      std::vector<engine::RequestId> ids;
      for (auto& [id, stream] : live_) ids.push_back(id);
      for (engine::RequestId id : ids) {
        try {
          engine_.abort(id);
        } catch (const std::exception&) {
        }
        engine::RequestOutput out = engine_.output(id);
        out.finish_reason = engine::FinishReason::kError;
        out.error = std::string("engine step failed: ") + e.what();
        finish_stream(id, out);
      }
    }
  }
}

}  // namespace pagoda::server
