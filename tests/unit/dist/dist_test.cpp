// dist: the in-process group's collectives against a plain f64 computation (every rank gets the
// same bits), abort waking a waiting rank, both channel transports (order, sizes, peer close),
// the wire reader's bounds checks and the WorkerBatch codec round trip on random batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "pagoda/core/error.h"
#include "pagoda/dist/channel.h"
#include "pagoda/dist/communicator.h"
#include "pagoda/dist/nccl_communicator.h"
#include "pagoda/dist/wire.h"
#include "pagoda/model/worker_codec.h"

namespace pagoda::dist {
namespace {

/// Runs body(rank, comm) on `world` threads of one LocalGroup.
template <typename F>
void on_group(int world, F body) {
  LocalGroup g(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r, c = std::shared_ptr<Communicator>(g.communicator(r))] {
      body(r, *c);
    });
  for (auto& t : threads) t.join();
}

TEST(LocalGroup, AllReduceAllGatherBroadcastMatchPlainSums) {
  const uint64_t seed = 0xD157;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int world : {1, 2, 3, 4}) {
    const int64_t n = 4099;
    std::vector<std::vector<float>> in(world, std::vector<float>(n));
    std::mt19937_64 rng(seed + world);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    for (auto& v : in)
      for (float& x : v) x = u(rng);
    std::vector<std::vector<float>> reduced = in, gathered(world), bcast(world);
    on_group(world, [&](int r, Communicator& c) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world_size(), world);
      for (int rep = 0; rep < 3; ++rep) {  // the rendezvous is reusable
        std::vector<float> tmp = in[r];
        c.all_reduce_sum(tmp.data(), n, DType::kF32);
        if (rep == 2) reduced[r] = tmp;
      }
      gathered[r].assign(static_cast<size_t>(world * n), std::nanf(""));
      c.all_gather(in[r].data(), gathered[r].data(), n, DType::kF32);
      bcast[r] = in[r];
      c.broadcast(bcast[r].data(), n * 4, world - 1);
    });
    for (int r = 0; r < world; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int s = 0; s < world; ++s) want += in[s][i];
        ASSERT_NEAR(reduced[r][i], want, 1e-5) << "world " << world << " rank " << r;
        ASSERT_EQ(reduced[r][i], reduced[0][i]);  // the same bits everywhere
        for (int s = 0; s < world; ++s) ASSERT_EQ(gathered[r][s * n + i], in[s][i]);
        ASSERT_EQ(bcast[r][i], in[world - 1][i]);
      }
    }
  }
}

TEST(LocalGroup, AbortWakesAWaitingRankAndRefusesLaterCalls) {
  LocalGroup g(2);
  auto c0 = g.communicator(0);
  std::thread t([&] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); g.abort(); });
  float x = 1.f;
  EXPECT_THROW(c0->all_reduce_sum(&x, 1, DType::kF32), Error);  // rank 1 never arrives
  t.join();
  EXPECT_THROW(c0->broadcast(&x, 4, 0), Error);
  EXPECT_THROW(LocalGroup(0), Error);
  EXPECT_THROW(g.communicator(2), Error);
  EXPECT_THROW(c0->all_reduce_sum(&x, 1, DType::kBF16), Error);
}

void check_channel(ByteChannel& a, ByteChannel& b) {
  std::mt19937_64 rng(7);
  std::vector<std::vector<std::byte>> sent;
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i) {
      std::vector<std::byte> m(static_cast<size_t>(rng() % (i == 7 ? 3'000'000 : 3000)));
      for (auto& x : m) x = static_cast<std::byte>(rng());
      a.send(m);
      sent.push_back(std::move(m));
    }
    a.close();
  });
  std::vector<std::vector<std::byte>> got;
  std::vector<std::byte> m;
  while (b.recv(m)) got.push_back(m);
  writer.join();
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], sent[i]) << i;
}

TEST(Channels, LocalAndSocketDeliverEveryMessageInOrderThenReportClose) {
  auto [a, b] = make_local_channel_pair();
  check_channel(*a, *b);
  auto [fa, fb] = make_socket_pair();
  EXPECT_GE(fa, 10);
  auto sa = make_socket_channel(fa), sb = make_socket_channel(fb);
  check_channel(*sa, *sb);
  std::vector<std::byte> m(4);
  EXPECT_THROW(sb->send(m), Error);  // the peer closed
}

TEST(Wire, ReaderRejectsShortAndOversizedMessages) {
  std::vector<std::byte> buf;
  WireWriter w(buf);
  w.put<int32_t>(5);
  w.put_vec(std::vector<int32_t>{1, 2, 3});
  w.put_str("abc");
  {
    WireReader r(buf);
    EXPECT_EQ(r.get<int32_t>(), 5);
    std::vector<int32_t> v;
    r.get_vec(v);
    EXPECT_EQ(v, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(r.get_str(), "abc");
    EXPECT_THROW(r.get<uint8_t>(), Error);
  }
  for (size_t cut = 0; cut < buf.size(); ++cut) {
    WireReader r(std::span<const std::byte>(buf.data(), cut));
    EXPECT_THROW(
        {
          (void)r.get<int32_t>();
          std::vector<int32_t> v;
          r.get_vec(v);
          (void)r.get_str();
        },
        Error)
        << cut;
  }
  std::vector<std::byte> huge;
  WireWriter(huge).put<uint64_t>(uint64_t{1} << 60);
  WireReader r(huge);
  std::vector<int32_t> v;
  EXPECT_THROW(r.get_vec(v), Error);
}

TEST(WorkerCodec, RandomBatchesRoundTripBitForBit) {
  const uint64_t seed = 0xC0DEC;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto ints = [&](size_t n) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = static_cast<int32_t>(rng() % 100000);
    return v;
  };
  for (int iter = 0; iter < 50; ++iter) {
    model::WorkerBatch b;
    const int bs = 1 + static_cast<int>(rng() % 9);
    const size_t t = static_cast<size_t>(bs + rng() % 50);
    b.forward.mode = static_cast<attention::ForwardMode>(rng() % 6);
    b.forward.batch_size = bs;
    b.forward.req_pool_indices = ints(bs);
    b.forward.seq_lens = ints(bs);
    b.forward.extend_prefix_lens = ints(bs);
    b.forward.extend_seq_lens = ints(bs);
    b.forward.positions = ints(t);
    b.forward.out_cache_loc = ints(t);
    b.forward.spec.topk = static_cast<int>(rng() % 5);
    b.forward.spec.num_draft_tokens = static_cast<int>(rng() % 9);
    b.forward.spec.tree_mask.assign(rng() % 40, uint8_t{1});
    b.forward.spec.draft_step = static_cast<int>(rng() % 4) - 1;
    b.forward.spec.draft_slots = ints(rng() % 20);
    b.input_ids = ints(t);
    b.logit_rows = ints(bs);
    for (int i = 0; i < bs; ++i) {
      b.sampling.push_back({.temperature = static_cast<float>(rng() % 100) / 50.f,
                            .top_k = static_cast<int>(rng() % 10),
                            .top_p = 0.5f,
                            .seed = rng(),
                            .min_p = 0.01f});
      b.sample_step.push_back(static_cast<int64_t>(rng()));
    }
    b.return_logits = rng() % 2 == 0;
    for (uint64_t i = rng() % 5; i > 0; --i)
      b.logit_adjust.push_back({.row = static_cast<int32_t>(rng() % 8),
                                .token = static_cast<int32_t>(rng() % 1000),
                                .bias = 1.5f,
                                .rep = 1.25f,
                                .sub = -0.5f});
    b.mask_rows = ints(rng() % 3);
    for (size_t i = 0; i < b.mask_rows.size() * 4; ++i)
      b.token_mask.push_back(static_cast<uint32_t>(rng()));
    std::vector<std::byte> buf;
    WireWriter w(buf);
    model::encode_worker_batch(b, w);
    model::WorkerBatch d;
    WireReader r(buf);
    model::decode_worker_batch(r, d);
    EXPECT_EQ(r.remaining(), 0u);
    std::vector<std::byte> again;
    WireWriter w2(again);
    model::encode_worker_batch(d, w2);
    ASSERT_EQ(buf, again) << iter;
    EXPECT_EQ(d.forward.out_cache_loc, b.forward.out_cache_loc);
    EXPECT_EQ(d.sample_step, b.sample_step);
    EXPECT_EQ(d.mask_rows, b.mask_rows);
    EXPECT_EQ(d.token_mask, b.token_mask);
    ASSERT_EQ(d.logit_adjust.size(), b.logit_adjust.size());
    for (size_t i = 0; i < b.logit_adjust.size(); ++i)
      EXPECT_EQ(std::memcmp(&d.logit_adjust[i], &b.logit_adjust[i], sizeof(model::LogitAdjust)), 0);
    buf[4] = std::byte{200};  // an unknown forward mode
    WireReader bad(buf);
    EXPECT_THROW(model::decode_worker_batch(bad, d), Error);
  }
}

TEST(Nccl, BadIdsAndUnavailableBuildsGiveClearErrors) {
  if (nccl_available()) {  // (the collectives themselves run in the GPU tests)
    const std::vector<std::byte> short_id(7);
    try {
      (void)make_nccl_communicator(short_id, 0, 2, nullptr);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
    return;
  }
  try {
    (void)nccl_unique_id();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos);
  }
}

}  // namespace
}  // namespace pagoda::dist
