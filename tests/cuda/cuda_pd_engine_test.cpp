// Prefill–decode disaggregation on the CUDA path: a prefill engine's held KV moves into a decode
// engine's preallocated pages through the staged transfer (device pool -> pinned staging ->
// the peer's pinned staging -> device pool on copy streams, disagg/staging.h), in chunks of a
// sender staging smaller than the prompts; the decode engine's greedy tokens equal one engine's.
// The put between the two stagings is a host copy of the write ops (UCX's loopback puts are
// covered on the CPU by disagg_tests and serve_disaggregated). Label "gpu".
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "engine_pd_util.h"
#include "gpu_test_common.h"
#include "pagoda/disagg/kv_layout.h"
#include "pagoda/disagg/staging.h"
#include "pagoda/engine/engine.h"
#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/weights.h"
#include "pagoda/platform/cuda/cuda_platform.h"

namespace pagoda {
namespace {

engine::EngineConfig pd_config() {
  engine::EngineConfig cfg;
  cfg.page_size = 16;
  cfg.pool_tokens = 2048;
  cfg.scheduler.max_running_requests = 8;
  cfg.backend.attention = "cuda";
  cfg.dtype = DType::kF32;
  cfg.check_integrity = true;
  return cfg;
}

TEST(CudaPdEngine, StagedTransferBetweenTwoEnginesDecodesLikeOne) {
  PAGODA_REQUIRE_GPU();
  const uint64_t seed = gpu_test::test_seed(4444);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 44));
  // Prompts of 1 to 120 tokens, some sharing a 40-token prefix (the decode engine's cache reuses
  // its pages: only the rest moves).
  std::vector<int32_t> system(40);
  for (auto& x : system) x = static_cast<int32_t>(rng() % 256);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = i % 2 == 0 ? system : std::vector<int32_t>{};
    const int tail = 1 + static_cast<int>(rng() % 80);
    for (int j = 0; j < tail; ++j) p.push_back(static_cast<int32_t>(rng() % 256));
    prompts.push_back(p);
  }
  const int max_new = 12;
  auto gpu_c = platform::make_cuda_platform();
  auto gpu_p = platform::make_cuda_platform();
  auto gpu_d = platform::make_cuda_platform();
  engine::Engine colocated(m, pd_config(), gpu_c.get());
  engine::Engine prefill(m, pd_config(), gpu_p.get());
  engine::Engine decode(m, pd_config(), gpu_d.get());
  std::vector<engine::RequestId> want, got;
  for (const auto& p : prompts)
    want.push_back(colocated.add_request({.prompt = p, .max_new_tokens = max_new, .ignore_eos = true}));
  colocated.run_until_idle();

  kv::KvPool& from = prefill.worker().kv_pool();
  kv::KvPool& to = decode.worker().kv_pool();
  ASSERT_TRUE(to.device().is_cuda());
  disagg::StagingPool out(from.config(), 3, gpu_p->pinned_allocator());  // chunks of 3 pages
  disagg::StagingPool in(to.config(), 16, gpu_d->pinned_allocator());
  const disagg::PutFn put = [&](std::span<const disagg::WriteOp> ops) {
    disagg::TransferResult r{.ok = true};
    for (const disagg::WriteOp& op : ops) {
      std::memcpy(static_cast<std::byte*>(in.regions()[op.dst_region].base) + op.dst_offset,
                  static_cast<const std::byte*>(out.regions()[op.src_region].base) + op.src_offset,
                  op.bytes);
      r.bytes += op.bytes;
    }
    return r;
  };
  for (const auto& p : prompts) {
    const engine::RequestId pid =
        prefill.add_request({.prompt = p, .max_new_tokens = 1, .ignore_eos = true, .hold_kv = true});
    prefill.run_until_idle();
    ASSERT_TRUE(prefill.output(pid).kv_held);
    const engine::RequestId did =
        decode.transfer().add_request({.prompt = p, .max_new_tokens = max_new, .ignore_eos = true});
    ASSERT_TRUE(decode.transfer().preallocate(did));
    const testing::PdPages pages = testing::pd_pages(prefill, pid, decode, did);
    disagg::StagingLease room = in.take(static_cast<int32_t>(pages.dst.size()));
    ASSERT_EQ(room.size(), pages.dst.size());
    auto computed = gpu_p->make_event();
    computed->record();
    const disagg::StagedSend sent =
        disagg::send_staged(*gpu_p, from, computed.get(), out, pages.src, room.pages(), put, {},
                            std::chrono::steady_clock::now() + std::chrono::seconds(30));
    ASSERT_TRUE(sent.transfer.ok) << sent.transfer.error;
    EXPECT_EQ(sent.checksum, disagg::pages_checksum(in.regions(), in.page_bytes(), room.pages()));
    auto mark = gpu_d->make_event();
    mark->record();
    disagg::unstage(*gpu_d, in, room.pages(), to, pages.dst, mark.get());
    EXPECT_FALSE(testing::pd_commit(prefill, pid, decode, did));
    got.push_back(did);
    decode.step();  // requests join a running batch one by one
  }
  decode.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(decode.output(got[i]).output_ids, colocated.output(want[i]).output_ids) << i;
  EXPECT_EQ(out.free_pages(), out.capacity());
  EXPECT_EQ(in.free_pages(), in.capacity());
  for (engine::Engine* e : {&prefill, &decode}) EXPECT_EQ(e->memory().leaked_pages(), 0);
}

}  // namespace
}  // namespace pagoda
