// CUDA graphs for speculative (kTargetVerify) batches: a LlamaWorker with verify graphs and one
// without (eager) get the same prefill, then the same random draft trees — full verify batches
// (every row's logits) and draft-style batches (one logit row per request), batch sizes that
// need padding — and must return the same ids and the same f32 logits, and write the same K/V
// into the draft slots; the pools start NaN-poisoned, so a stray read or a padded request that
// wrote a live slot shows up. Captures and replays are counted. LlamaWorker::move_kv (the CUDA
// gather/scatter kernel pair over every layer's K and V) against a host replay of the same moves
// on random overlapping pairs. Label "gpu".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/config.h"
#include "pagoda/model/llama.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/step_input.h"
#include "pagoda/model/weights.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "pagoda/spec/draft_tree.h"
#include "test_seed.h"

namespace pagoda {
namespace {

using attention::ForwardMode;

struct Round {
  std::vector<int> reqs;  ///< indices of the prefilled requests in this batch
  int n;                  ///< tree size
  int r;                  ///< logit rows per request (n = verify, 1 = a draft step)
};

std::vector<float> slot_rows(platform::Platform& p, kv::KvPool& pool, int layer,
                             const std::vector<SlotIndex>& slots) {
  const TensorView k = pool.k_view(LayerId{layer});
  const int64_t row = k.size(2) * k.size(3);
  std::vector<float> all(static_cast<size_t>(pool.num_slots() * row)), out;
  p.allocator().copy_to_host(all.data(), k.data(), all.size() * sizeof(float));
  for (SlotIndex s : slots)
    out.insert(out.end(), all.begin() + s * row, all.begin() + (s + 1) * row);
  return out;
}

TEST(CudaSpecGraph, VerifyGraphMatchesEager) {
  if (platform::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 20240611));
  const int64_t vocab = config.vocab_size;
  auto gpu = platform::make_cuda_platform();
  for (int page : {1, 16}) {
    constexpr int kCtx = 256, kReqs = 3;
    const int per_req = kCtx / page + 1;  // pages of one request's row
    kv::ReqToTokenTable table(8, kCtx);
    model::WorkerConfig wc{.page_size = page,
                           .num_pages = (kReqs + 1) * per_req,
                           .kv_dtype = DType::kF32,
                           .backend = {.attention = "cuda"},
                           .cuda_graph = false,
                           .max_batch_size = 8};
    model::LlamaWorker eager(m, engine::make_model_ops(*gpu, DType::kF32), wc, table);
    wc.cuda_graph = true;
    wc.verify_graph_tokens = 64;
    model::LlamaWorker graph(m, engine::make_model_ops(*gpu, DType::kF32), wc, table);
    eager.kv_pool().fill_bytes(0xFF);  // NaN
    graph.kv_pool().fill_bytes(0xFF);
    // Prefill: request b's token i sits at slot (1 + b * per_req) * page + i (page-contiguous).
    std::vector<ReqSlot> rows;
    std::vector<int32_t> lens;
    std::vector<std::vector<int32_t>> prompts;
    model::StepInput in{.mode = ForwardMode::kExtend, .seqs = {}, .out_cache_loc = {}};
    for (int b = 0; b < kReqs; ++b) {
      rows.push_back(table.alloc().value());
      lens.push_back(static_cast<int32_t>(20 + rng() % 150));
      std::vector<SlotIndex> slots(kCtx);
      std::iota(slots.begin(), slots.end(), (1 + b * per_req) * page);
      table.write(rows.back(), 0, slots);
      prompts.emplace_back(static_cast<size_t>(lens.back()));
      for (auto& t : prompts.back()) t = static_cast<int32_t>(rng() % vocab);
    }
    model::WorkerBatch pre;
    for (int b = 0; b < kReqs; ++b) {
      in.seqs.push_back({.req_slot = rows[b].value(), .prefix_len = 0, .tokens = prompts[b]});
      for (int32_t i = 0; i < lens[b]; ++i) in.out_cache_loc.push_back(table.row(rows[b])[i]);
      pre.input_ids.insert(pre.input_ids.end(), prompts[b].begin(), prompts[b].end());
    }
    pre.forward = model::build_forward_batch(in);
    pre.logit_rows.assign(kReqs, 1);
    pre.sampling.assign(kReqs, model::SamplingParams{});
    pre.sample_step.assign(kReqs, 0);
    EXPECT_EQ(eager.run(pre).tokens, graph.run(pre).tokens);

    const std::vector<Round> rounds = {{{0, 1, 2}, 5, 5}, {{0, 1, 2}, 5, 5}, {{1}, 3, 1},
                                       {{2, 0}, 5, 5},    {{0, 1, 2}, 3, 1}, {{1}, 3, 1}};
    int64_t captured_keys = 0;
    for (size_t ri = 0; ri < rounds.size(); ++ri) {
      const Round& rd = rounds[ri];
      model::WorkerBatch vb;
      attention::ForwardBatch& f = vb.forward;
      f.mode = ForwardMode::kTargetVerify;
      f.batch_size = static_cast<int>(rd.reqs.size());
      f.spec.num_draft_tokens = rd.n;
      std::vector<SlotIndex> draft_slots;
      for (int b : rd.reqs) {
        spec::DraftTree t = spec::DraftTree::root_only(prompts[b].back());
        for (int i = 1; i < rd.n; ++i)
          t.add(static_cast<int32_t>(rng() % vocab), static_cast<int32_t>(rng() % i));
        f.req_pool_indices.push_back(rows[b].value());
        f.seq_lens.push_back(lens[b]);
        f.extend_prefix_lens.push_back(lens[b]);
        f.extend_seq_lens.push_back(rd.n);
        const auto depth = t.depths();
        for (int i = 0; i < rd.n; ++i) {
          f.positions.push_back(lens[b] + depth[static_cast<size_t>(i)]);
          f.out_cache_loc.push_back(table.row(rows[b])[lens[b] + i]);
          draft_slots.push_back(f.out_cache_loc.back());
        }
        vb.input_ids.insert(vb.input_ids.end(), t.tokens.begin(), t.tokens.end());
        spec::append_verify_mask(t, lens[b], f.spec.tree_mask);
        vb.sample_step.push_back(0);
      }
      vb.logit_rows.assign(rd.reqs.size(), rd.r);
      vb.sampling.assign(rd.reqs.size(), model::SamplingParams{});
      vb.return_logits = true;
      const model::WorkerOutput e = eager.run(vb);
      const model::WorkerOutput g = graph.run(vb);
      const std::string what = "page " + std::to_string(page) + " round " + std::to_string(ri);
      ASSERT_EQ(e.tokens.size(), g.tokens.size()) << what;
      ASSERT_EQ(e.logits.size(), g.logits.size()) << what;
      double worst = 0.0;
      for (size_t i = 0; i < e.logits.size(); ++i) {
        ASSERT_TRUE(std::isfinite(g.logits[i])) << what << " logit " << i;
        worst = std::max(worst, std::fabs(double(e.logits[i]) - double(g.logits[i])));
      }
      EXPECT_LT(worst, 1e-3) << what;
      for (size_t row = 0; row < e.tokens.size(); ++row) {
        if (e.tokens[row] == g.tokens[row]) continue;
        // Only a near tie of the eager logits may flip.
        const float* l = e.logits.data() + row * static_cast<size_t>(vocab);
        EXPECT_LT(std::fabs(l[e.tokens[row]] - l[g.tokens[row]]), 1e-4) << what << " row " << row;
      }
      for (int layer : {0, config.num_layers - 1}) {
        const auto ek = slot_rows(*gpu, eager.kv_pool(), layer, draft_slots);
        const auto gk = slot_rows(*gpu, graph.kv_pool(), layer, draft_slots);
        for (size_t i = 0; i < ek.size(); ++i) {
          ASSERT_TRUE(std::isfinite(gk[i])) << what << " layer " << layer;
          ASSERT_NEAR(ek[i], gk[i], 1e-4) << what << " layer " << layer;
        }
      }
      captured_keys = graph.num_verify_graphs();
      std::printf("[%s] %zu requests, tree %d, %d rows each: max |logit diff| %.2e\n",
                  what.c_str(), rd.reqs.size(), rd.n, rd.r, worst);
    }
    // Keys (n, r, bucket): (5,5,4) (3,1,1) (5,5,2) (3,1,4) — every round replayed a graph.
    EXPECT_EQ(captured_keys, 4);
    EXPECT_EQ(graph.stats().spec_graph_steps, static_cast<int64_t>(rounds.size()));
    EXPECT_EQ(eager.stats().spec_graph_steps, 0);
  }
}

TEST(CudaSpecGraph, MoveKvKernelMatchesHostMoves) {
  if (platform::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  const model::ModelConfig config = model::builtin_tiny_config();
  model::LlamaModel m(config, model::make_random_weights(config, 7));
  auto gpu = platform::make_cuda_platform();
  for (DType kv : {DType::kF32}) {  // the backend reads f32 KV with f32 activations
    kv::ReqToTokenTable table(2, 64);
    model::LlamaWorker w(m, engine::make_model_ops(*gpu, DType::kF32),
                         model::WorkerConfig{.page_size = 16,
                                             .num_pages = 32,
                                             .kv_dtype = kv,
                                             .backend = {.attention = "cuda"},
                                             .cuda_graph = false,
                                             .max_batch_size = 4},
                         table);
    kv::KvPool& pool = w.kv_pool();
    const int64_t slots = pool.num_slots();
    // Random bytes in every buffer; host copies as the reference.
    std::vector<std::vector<uint8_t>> host;
    std::vector<void*> bases;
    for (int l = 0; l < pool.num_layers(); ++l)
      for (const TensorView& t : {pool.k_view(LayerId{l}), pool.v_view(LayerId{l})}) {
        std::vector<uint8_t> b(static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
        for (auto& x : b) x = static_cast<uint8_t>(rng());
        gpu->allocator().copy_to_device(t.data(), b.data(), b.size());
        host.push_back(std::move(b));
        bases.push_back(t.data());
      }
    const size_t row = host[0].size() / static_cast<size_t>(slots);
    // 40 pairs: distinct destinations, sources drawn from slots that are also destinations.
    std::vector<SlotIndex> all(static_cast<size_t>(slots));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<SlotIndex> dst(all.begin(), all.begin() + 40), src;
    for (int i = 0; i < 40; ++i)
      src.push_back(i % 2 == 0 ? dst[rng() % dst.size()] : all[40 + rng() % 100]);
    for (auto& b : host) {  // reference: read every source, then write
      std::vector<uint8_t> rows;
      for (SlotIndex s : src) rows.insert(rows.end(), b.begin() + s * row, b.begin() + (s + 1) * row);
      for (size_t i = 0; i < dst.size(); ++i)
        std::copy(rows.begin() + i * row, rows.begin() + (i + 1) * row, b.begin() + dst[i] * row);
    }
    w.move_kv(src, dst);
    // A bad slot is refused by name and changes nothing.
    std::vector<SlotIndex> bad_src = src;
    bad_src[3] = static_cast<SlotIndex>(slots);
    EXPECT_THROW(w.move_kv(bad_src, dst), Error);
    for (size_t i = 0; i < bases.size(); ++i) {
      std::vector<uint8_t> got(host[i].size());
      gpu->allocator().copy_to_host(got.data(), bases[i], got.size());
      EXPECT_TRUE(got == host[i]) << "buffer " << i << " kv " << dtype_name(kv);
    }
  }
}

}  // namespace
}  // namespace pagoda
