#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <thread>

#include "pagoda/platform/platform.h"

namespace pagoda::platform {
namespace {

/// One worker thread drains a FIFO of copies; `completed_` counts the copies done, so an event is
/// just the count it waits for.
class ThreadCopyStream final : public CopyStream {
 public:
  ThreadCopyStream() : worker_([this] { run(); }) {}
  ~ThreadCopyStream() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_one();
    worker_.join();  // the worker drains the queue before it stops
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(Task{dst, src, bytes});
      ++enqueued_;
    }
    work_cv_.notify_one();
  }

  void copy_batch(std::span<const Op> ops) override {
    {
      std::lock_guard lock(mu_);
      for (const Op& op : ops) queue_.push_back(Task{op.dst, op.src, op.bytes});
      enqueued_ += ops.size();
    }
    work_cv_.notify_one();
  }

  std::unique_ptr<Event> record() override {
    std::lock_guard lock(mu_);
    return std::make_unique<CountEvent>(this, enqueued_);
  }

  void wait(Event& event) override { event.synchronize(); }

  void synchronize() override {
    uint64_t target = 0;
    {
      std::lock_guard lock(mu_);
      target = enqueued_;
    }
    wait_for(target);
  }

 private:
  struct Task {
    void* dst;
    const void* src;
    size_t bytes;
  };
  /// Complete once the stream has finished `target` copies.
  class CountEvent final : public Event {
   public:
    CountEvent(ThreadCopyStream* stream, uint64_t target) : stream_(stream), target_(target) {}
    /// Re-marks the current end of the stream.
    void record() override {
      std::lock_guard lock(stream_->mu_);
      target_ = stream_->enqueued_;
    }
    void synchronize() override { stream_->wait_for(target_); }
    bool done() override {
      std::lock_guard lock(stream_->mu_);
      return stream_->completed_ >= target_;
    }

   private:
    ThreadCopyStream* stream_;
    uint64_t target_;
  };

  void wait_for(uint64_t target) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= target; });
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      const Task t = queue_.front();
      queue_.pop_front();
      lock.unlock();
      if (t.bytes) std::memcpy(t.dst, t.src, t.bytes);
      lock.lock();
      ++completed_;
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stop_ = false;
  std::thread worker_;  ///< last: started after every other member exists
};

}  // namespace

std::unique_ptr<CopyStream> make_thread_copy_stream() { return std::make_unique<ThreadCopyStream>(); }

}  // namespace pagoda::platform
