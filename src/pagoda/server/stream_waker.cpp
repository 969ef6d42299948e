#include "pagoda/server/stream_waker.h"

#include "pagoda/server/engine_loop.h"

namespace pagoda::server {

StreamWaker::StreamWaker() : thread_([this] { run(); }) {}

StreamWaker::~StreamWaker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void StreamWaker::wake(std::vector<std::shared_ptr<RequestStream>>& streams) {
  if (streams.empty()) return;
  {
    std::lock_guard lock(mu_);
    if (queued_.empty()) {
      queued_.swap(streams);
    } else {
      queued_.insert(queued_.end(), streams.begin(), streams.end());
      streams.clear();
    }
  }
  cv_.notify_one();
}

void StreamWaker::run() {
  std::vector<std::shared_ptr<RequestStream>> batch;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queued_.empty(); });
      batch.swap(queued_);
      if (batch.empty() && stop_) return;
    }
    for (const auto& s : batch) s->notify();
    batch.clear();
  }
}

}  // namespace pagoda::server
