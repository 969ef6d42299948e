/// The server's EngineLoop (src/pagoda/server/engine_loop.h) on the CPU test model: requests
/// submitted from several threads come out with the tokens a naive greedy reference gives
/// (tests/unit/model/naive_llama.h, not the engine), StreamWake::kEachToken readers see their
/// tokens step by step (woken by the StreamWaker thread, not by the wait's timeout), and a
/// kFinish reader is woken once, at the end, with every token.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "engine_test_util.h"
#include "pagoda/server/engine_loop.h"
#include "pagoda/server/metrics.h"
#include "pagoda/server/stream_waker.h"
#include "test_seed.h"

namespace pagoda::server {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(StreamWaker, WakesAReaderBeforeItsWaitTimesOut) {
  auto stream = std::make_shared<RequestStream>(StreamWake::kEachToken);
  StreamWaker waker;
  RequestStream::Update got;
  double waited = 0;
  std::thread reader([&] {
    const auto t0 = Clock::now();
    got = stream->wait(60'000);
    waited = seconds_since(t0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the reader is asleep by now
  stream->push(7, nullptr);
  std::vector<std::shared_ptr<RequestStream>> batch{stream};
  waker.wake(batch);
  EXPECT_TRUE(batch.empty()) << "wake() takes the streams";
  reader.join();
  EXPECT_EQ(got.tokens, std::vector<int32_t>{7});
  EXPECT_FALSE(got.finished);
  EXPECT_LT(waited, 30.0) << "the reader slept until its 60 s timeout: nothing woke it";
}

struct Reader {
  std::vector<int32_t> tokens;
  int updates_with_tokens = 0;  ///< wait() results that carried tokens, the last one included
  bool finished = false;
  engine::FinishReason reason = engine::FinishReason::kNone;
};

TEST(EngineLoop, ReadersGetTheReferenceTokensAndWakeAsAsked) {
  const pagoda::testing::TestSeed seed;
  const auto prompts = pagoda::testing::make_prompts(seed, 8);
  constexpr int kMaxNew = 64;
  engine::EngineConfig cfg{.page_size = 16,
                           .pool_tokens = 4096,
                           .scheduler = engine::SchedulerConfig{.max_running_requests = 8},
                           .backend = pagoda::testing::backend_named("reference"),
                           .check_integrity = true};
  engine::Engine engine(pagoda::testing::test_model().model, cfg);
  ServerMetrics metrics;
  EngineLoop loop(engine, metrics, 64);
  std::vector<Reader> readers(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      engine::GenerateRequest g;
      g.prompt = prompts[i];
      g.max_new_tokens = kMaxNew;
      g.ignore_eos = true;
      const StreamWake wake = i % 2 == 0 ? StreamWake::kEachToken : StreamWake::kFinish;
      auto stream = loop.submit(std::move(g), wake);
      Reader& r = readers[i];
      while (!r.finished) {
        RequestStream::Update u = stream->wait(120'000);
        if (!u.tokens.empty()) ++r.updates_with_tokens;
        r.tokens.insert(r.tokens.end(), u.tokens.begin(), u.tokens.end());
        r.finished = u.finished;
        r.reason = u.reason;
      }
    });
  }
  for (auto& t : threads) t.join();
  int each_token_updates = 0, each_token_readers = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    const Reader& r = readers[i];
    EXPECT_EQ(r.reason, engine::FinishReason::kLength);
    engine::RequestOutput out;  // what the reader got, in the engine's output form
    out.state = engine::RequestState::kFinished;
    out.finish_reason = r.reason;
    out.output_ids = r.tokens;
    ASSERT_EQ(r.tokens.size(), size_t{kMaxNew});
    pagoda::testing::expect_matches_naive(out, pagoda::testing::naive_greedy(prompts[i], kMaxNew),
                                          "request " + std::to_string(i));
    if (i % 2 == 0) {
      each_token_updates += r.updates_with_tokens;
      ++each_token_readers;
    } else {
      EXPECT_EQ(r.updates_with_tokens, 1) << "a kFinish reader is woken once, at the end";
    }
  }
  // Woken after every step, the per-token readers take their 64 tokens over many updates. A
  // reader starved of the CPU for a whole request may take them in one, so the check is on all
  // of them: without the waker each takes exactly one (its finish).
  EXPECT_GT(each_token_updates, 2 * each_token_readers);
  EXPECT_EQ(loop.snapshot().leaked_pages, 0);
}

}  // namespace
}  // namespace pagoda::server
