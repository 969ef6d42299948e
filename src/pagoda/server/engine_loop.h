#pragma once
/// EngineLoop: the one thread that owns and drives an engine::Engine for the HTTP server.
/// HTTP threads submit requests (submit), read their tokens through a RequestStream, cancel them
/// (cancel) and ask for snapshots (snapshot); the loop thread applies submissions, cancels and
/// snapshot queries between engine steps, then runs one step and hands every new token to its
/// stream. Nothing but the loop thread touches the engine.
///
/// Admission control: at most `max_inflight` requests are submitted and not finished; submit
/// throws ApiError(503) past that, and after stop_accepting(). Thread safe (all public methods).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagoda/engine/engine.h"
#include "pagoda/server/metrics.h"
#include "pagoda/server/stream_waker.h"

namespace pagoda::server {

/// When the reader of a RequestStream is woken.
enum class StreamWake : uint8_t {
  kEachToken,  ///< after every step that gave it tokens (streamed answers, stop strings)
  kFinish,     ///< only when it finishes (a whole answer; the reader's wait() still times out)
};

/// The tokens of one request as the engine produces them. Written by the loop thread, read by
/// one HTTP thread.
class RequestStream {
 public:
  explicit RequestStream(StreamWake wake = StreamWake::kEachToken) : wake_(wake) {}

  /// What wait() hands over: tokens since the last call, and the end when it came.
  struct Update {
    std::vector<int32_t> tokens;
    std::vector<model::TokenLogprobs> logprobs;  ///< parallel to tokens when the request asked
    bool finished = false;
    engine::FinishReason reason = engine::FinishReason::kNone;
    int error_status = 0;  ///< non-zero: the request was never admitted (HTTP status)
    std::string error;
    int32_t prompt_len = 0;
    engine::RequestId id = -1;  ///< the engine's id once admitted
  };
  /// Blocks until there are new tokens or the request finished, at most `timeout_ms`.
  Update wait(int timeout_ms);

  // Loop thread side.
  /// Appends a token without waking the reader (the loop's StreamWaker calls notify() after
  /// the step for kEachToken streams). `logprobs`: the token's log-probabilities when the
  /// request asked for them, else nullptr.
  void push(int32_t token, const model::TokenLogprobs* logprobs);
  /// Ends the stream and wakes the reader.
  void finish(engine::FinishReason reason, std::string error, int error_status);
  /// Wakes the reader (any thread).
  void notify() { cv_.notify_one(); }
  StreamWake wake() const { return wake_; }
  /// At admission: the engine's id of the request.
  void set_id(engine::RequestId id);

  engine::GenerateRequest request;  ///< moved into the engine at admission
  int32_t prompt_len = 0;
  bool want_logprobs = false;  ///< request.logprobs >= 0 (set at submit)

 private:
  const StreamWake wake_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::vector<model::TokenLogprobs> logprobs_;
  bool finished_ = false;
  engine::FinishReason reason_ = engine::FinishReason::kNone;
  int error_status_ = 0;
  std::string error_;
  engine::RequestId id_ = -1;
};

class EngineLoop {
 public:
  /// Starts the loop thread. `engine` and `metrics` must outlive the loop.
  EngineLoop(engine::Engine& engine, ServerMetrics& metrics, int64_t max_inflight);
  ~EngineLoop();  ///< stops the thread (aborting what is left)
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  /// Queues `request`; its tokens arrive through the returned stream, whose reader `wake`
  /// says when to wake. Throws ApiError(503) when `max_inflight` requests are in flight or the
  /// loop no longer accepts work. Engine-side validation errors arrive as a finished Update with
  /// error_status 400 or 413.
  std::shared_ptr<RequestStream> submit(engine::GenerateRequest request,
                                        StreamWake wake = StreamWake::kEachToken);
  /// Ends the request of `stream` (a client went away or a stop string matched); its KV is
  /// freed at the next step boundary. Idempotent.
  void cancel(const std::shared_ptr<RequestStream>& stream);
  /// Runs `task` on the loop thread between steps and waits for it; an exception it throws is
  /// rethrown here. Afterwards every live request that the task finished (e.g. through
  /// EngineTransfer::commit) is finished on its stream. Used by disaggregation (pd.h).
  void run_on_loop(std::function<void(engine::Engine&)> task);
  /// Disaggregation, decode side: records `request` with EngineTransfer::add_request (not
  /// queued: its KV comes from a prefill server) and returns its stream and engine id. Admission
  /// control as submit (ApiError 503); engine validation errors as ApiError(400 / 413).
  std::pair<std::shared_ptr<RequestStream>, engine::RequestId> submit_transfer(
      engine::GenerateRequest request);
  /// Stats, leaked pages and in-flight count, read on the loop thread between steps.
  EngineSnapshot snapshot();
  /// From now on submit() answers 503 (SIGTERM drain).
  void stop_accepting();
  /// Blocks until no request is in flight or `timeout_s` passed; true when idle.
  bool wait_idle(double timeout_s);
  int64_t inflight() const;

 private:
  struct Task {
    std::function<void(engine::Engine&)> fn;
    std::promise<void> done;
  };
  void run();
  /// Runs `tasks` (loop thread), then finishes the streams of requests they finished.
  void run_tasks(std::vector<Task>& tasks);
  void finish_stream(engine::RequestId id, const engine::RequestOutput& out);
  /// Under mu_: counts one more request in flight, or throws ApiError 503 when shutting down or
  /// at max_inflight_ (nothing counted).
  void count_inflight_locked();

  engine::Engine& engine_;
  ServerMetrics& metrics_;
  const int64_t max_inflight_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       ///< wakes the loop thread
  std::condition_variable idle_cv_;  ///< wakes wait_idle
  std::deque<std::shared_ptr<RequestStream>> incoming_;
  std::vector<std::shared_ptr<RequestStream>> cancels_;
  std::vector<std::promise<EngineSnapshot>> queries_;
  std::vector<Task> tasks_;
  int64_t inflight_ = 0;
  bool accepting_ = true;
  bool stop_ = false;

  // Loop thread only.
  std::unordered_map<engine::RequestId, std::shared_ptr<RequestStream>> live_;
  std::unordered_map<const RequestStream*, engine::RequestId> ids_;
  StreamWaker waker_;  ///< before thread_: the loop thread uses it until it is joined
  std::thread thread_;
};

}  // namespace pagoda::server
