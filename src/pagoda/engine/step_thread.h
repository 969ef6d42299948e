#pragma once
/// StepThread: one thread that runs the worker's steps in submission order, for the overlap
/// loop (docs/design/engine.md "Overlap"). submit() queues a job and returns at once; the jobs
/// run one after another, so a job sees everything the jobs before it wrote (the future-id
/// slot). The destructor runs the queued jobs to the end, then joins.

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "pagoda/model/worker.h"

namespace pagoda::engine {

class StepThread {
 public:
  StepThread() : thread_([this] { loop(); }) {}
  ~StepThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  StepThread(const StepThread&) = delete;
  StepThread& operator=(const StepThread&) = delete;

  /// Queues `job`; its result (or exception) comes through the future.
  std::future<model::WorkerOutput> submit(std::function<model::WorkerOutput()> job) {
    std::packaged_task<model::WorkerOutput()> task(std::move(job));
    auto result = task.get_future();
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(task));
    }
    wake_.notify_one();
    return result;
  }

  /// Blocks until every job submitted so far has run.
  void wait_idle() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<model::WorkerOutput()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        task = std::move(jobs_.front());
        jobs_.pop_front();
        running_ = true;
      }
      task();
      {
        std::lock_guard lock(mutex_);
        running_ = false;
      }
      idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;  ///< wait_idle(): a job finished
  std::deque<std::packaged_task<model::WorkerOutput()>> jobs_;
  bool stop_ = false;
  bool running_ = false;  ///< a job runs now
  std::thread thread_;  ///< last: starts after the members above exist
};

}  // namespace pagoda::engine
