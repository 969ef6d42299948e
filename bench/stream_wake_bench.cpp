// The engine loop thread's cost of handing one step's tokens to 64 streamed requests
// (server/engine_loop.h, stream_waker.h): each stream's HTTP reader sleeps in
// RequestStream::wait between steps. "direct": push, then notify each stream on the loop thread
// (a futex wake per sleeping reader; the loop before 28f3530); "waker": push, then one
// StreamWaker::wake for all of them (the loop since). Manual time: only the loop thread's part;
// a 1 ms pause between steps lets the readers fall asleep again.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "pagoda/server/engine_loop.h"
#include "pagoda/server/stream_waker.h"

namespace {

using pagoda::server::RequestStream;
using pagoda::server::StreamWake;
using pagoda::server::StreamWaker;

void BM_WakeReaders(benchmark::State& state) {
  const bool use_waker = state.range(0) == 1;
  const int n = static_cast<int>(state.range(1));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < n; ++i)
    streams.push_back(std::make_shared<RequestStream>(StreamWake::kEachToken));
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (auto& s : streams) {
    readers.emplace_back([&stop, s] {
      while (!stop.load()) s->wait(50);
    });
  }
  StreamWaker waker;
  int32_t token = 0;
  for (auto _ : state) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& s : streams) s->push(token, nullptr);
    if (use_waker) {
      std::vector<std::shared_ptr<RequestStream>> batch = streams;
      waker.wake(batch);
    } else {
      for (auto& s : streams) s->notify();
    }
    const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - t0;
    state.SetIterationTime(spent.count());
    ++token;
  }
  stop = true;
  for (auto& s : streams) s->notify();
  for (auto& t : readers) t.join();
}
BENCHMARK(BM_WakeReaders)
    ->ArgNames({"waker", "streams"})
    ->Args({0, 64})
    ->Args({1, 64})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
