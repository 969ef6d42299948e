#pragma once
/// StreamWaker: wakes the HTTP threads that read RequestStreams, on a thread of its own, so the
/// engine loop thread does not pay for it. A condition variable's notify is a futex wake (a
/// system call) whenever its reader sleeps: 64 sleeping readers cost the loop thread 252 µs a
/// step when it notified them itself, 11.9 µs handing them here (bench/stream_wake_bench.cpp,
/// median of 3, the 2-core Xeon dev VM, 2026-12-06), time the GPU idles for without the
/// overlap loop.
///
/// The loop thread hands over the streams a step pushed tokens to (wake()); the waker thread
/// calls their notify() in that order. A stream's reader sees its tokens no earlier than
/// before (they were pushed first) and at most one hand-over later. Thread safe; the destructor
/// wakes what is still queued, then joins.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pagoda::server {

class RequestStream;

class StreamWaker {
 public:
  StreamWaker();
  ~StreamWaker();
  StreamWaker(const StreamWaker&) = delete;
  StreamWaker& operator=(const StreamWaker&) = delete;

  /// Queues `streams` for a notify() each (taken; empty: nothing).
  void wake(std::vector<std::shared_ptr<RequestStream>>& streams);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestStream>> queued_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pagoda::server
