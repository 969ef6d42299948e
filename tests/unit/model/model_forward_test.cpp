// LlamaModel through the serving path (LlamaWorker: its paged KV pool, a registered backend, the
// CPU ops) against the naive double-precision model: logits of a two-chunk prefill and of several
// decode steps, with each GEMM mode of the CPU ops (OpenBLAS on every backend and page size;
// oneDNN f32 and bf16 on one: a bf16 tolerance, and the same top-1 wherever the naive margin is
// wider than it; the bf16 case is skipped, saying why, where oneDNN has no bf16 matmul).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "naive_llama.h"
#include "pagoda/attention/paged_plan.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/step_input.h"
#include "pagoda/model/sampler.h"
#include "pagoda/platform/platform.h"
#include "test_model.h"
#include "test_seed.h"

namespace pagoda::model {
namespace {

using attention::ForwardMode;

std::vector<std::string> backend_names() {
  attention::BackendRegistry r;
  backends::register_builtin_backends(r);
  std::vector<std::string> names = {"reference"};
  if (r.contains("cpu")) names.push_back("cpu");
  return names;
}

struct Variant {
  std::string name;
  ModelConfig config;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"base", testing::test_model_config()});
  ModelConfig f = testing::test_model_config();
  f.layer_window = {5, -1};
  f.attn_logit_softcap = 5.f;
  f.final_logit_softcap = 3.f;
  f.tie_word_embeddings = true;
  f.rope = RopeConfig{.theta = 500000.0, .scaling = RopeScalingKind::kLlama3, .factor = 8.0,
                      .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                      .original_max_position = 64};
  v.push_back({"window_softcap_llama3_tied", f});
  ModelConfig l = testing::test_model_config();
  l.rope = RopeConfig{.theta = 10000.0, .scaling = RopeScalingKind::kLinear, .factor = 2.0};
  v.push_back({"linear_rope", l});
  v.push_back({"qwen2_bias", testing::qwen2_test_config()});
  ModelConfig m = testing::test_model_config();
  m.family = ModelFamily::kMistral;
  m.layer_window = {4, 4};  // 5 keys visible, far fewer than the 29 tokens of the test
  m.rope.theta = 1e6;
  v.push_back({"mistral_window", m});
  return v;
}

double max_abs_diff(std::span<const float> a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// Logit tolerance against the naive f64 model: f32 GEMMs 2e-3; bf16 weights and GEMM inputs
/// (8 significant bits, relative rounding 2^-9 on each factor) 10 % of the largest logit: the
/// bf16 path emulated in f32 (inputs rounded as oneDNN gets them) deviates by up to 5.5 % on
/// these variants (the soft-capped one), so this leaves 2x headroom.
double logit_tolerance(CpuGemm gemm, const std::vector<double>& ref) {
  if (gemm != CpuGemm::kOnednn && gemm != CpuGemm::kAmx) return 2e-3;
  double m = 1.0;
  for (double v : ref) m = std::max(m, std::abs(v));
  return 0.1 * m;
}

/// The naive top-1 (pagoda's argmax must equal it) when its margin over the runner-up exceeds
/// 2 tol; -1 when the margin is too thin to decide at this tolerance.
int32_t clear_top1(const std::vector<double>& ref, double tol) {
  std::vector<int32_t> idx(ref.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(),
                    [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  return ref[idx[0]] - ref[idx[1]] > 2 * tol ? idx[0] : -1;
}

}  // namespace

// Test names print the GEMM mode by name (found by ADL: outside the unnamed namespace).
void PrintTo(CpuGemm g, std::ostream* os) { *os << cpu_gemm_name(g); }

namespace {

class ModelForward
    : public ::testing::TestWithParam<std::tuple<std::string, int, CpuGemm>> {};

TEST_P(ModelForward, MatchesNaiveLogits) {
  const auto [backend_name, page_size, gemm] = GetParam();
  if (const std::string why = cpu_gemm_unavailable(gemm); !why.empty())
    GTEST_SKIP() << "--cpu-gemm " << cpu_gemm_name(gemm) << " cannot run here: " << why;
  int top1_checked = 0;
  for (const Variant& var : variants()) {
    SCOPED_TRACE(var.name);
    const uint64_t seed = 11;
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    ModelWeights w = make_random_weights(var.config, seed);
    if (var.config.tie_word_embeddings) w.lm_head.clear();
    LlamaModel model(var.config, w);
    auto platform = platform::make_cpu_platform();
    const int32_t num_pages = 64;
    kv::PageAllocator alloc(num_pages, page_size);
    kv::ReqToTokenTable table(2, 256);
    LlamaWorker worker(model, make_cpu_ops(*platform, DType::kF32, gemm),
                       WorkerConfig{.page_size = page_size,
                                    .num_pages = num_pages,
                                    .backend = {.attention = backend_name},
                                    .cuda_graph = false,
                                    .max_batch_size = 2},
                       table);
    // One step: the logits of the sequence's last token (none for a non-final chunk).
    std::vector<float> logits_out;
    auto run = [&](const StepInput& in) -> std::span<const float> {
      WorkerBatch b{.forward = build_forward_batch(in)};
      for (const StepSequence& q : in.seqs) {
        b.input_ids.insert(b.input_ids.end(), q.tokens.begin(), q.tokens.end());
        b.logit_rows.push_back(q.want_logits ? 1 : 0);
        b.sampling.push_back(SamplingParams{});
        b.sample_step.push_back(0);
      }
      b.return_logits = true;
      logits_out = worker.run(b).logits;
      return logits_out;
    };

    std::mt19937 rng(seed);
    std::vector<int32_t> tokens(23);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
    testing::NaiveLlama naive(var.config, w);
    std::vector<double> ref;
    for (int32_t t : tokens) ref = naive.feed(t);

    const ReqSlot row = *table.alloc();
    // Prefill in two extends: [0, 16) then [16, 23) on top of the cached prefix.
    const int32_t cut = 16;
    const int32_t zero = 0, n = static_cast<int32_t>(tokens.size()), none = -1;
    auto s1 = *alloc.alloc_extend(std::span(&zero, 1), std::span(&cut, 1), std::span(&none, 1));
    table.write(row, 0, s1);
    StepInput a{.mode = ForwardMode::kExtend,
                .seqs = {{.req_slot = row.value(), .prefix_len = 0,
                          .tokens = std::span(tokens).first(cut), .want_logits = false}},
                .out_cache_loc = s1};
    EXPECT_TRUE(run(a).empty());
    const SlotIndex last = s1.back();
    auto s2 = *alloc.alloc_extend(std::span(&cut, 1), std::span(&n, 1), std::span(&last, 1));
    table.write(row, cut, s2);
    StepInput b{.mode = ForwardMode::kExtend,
                .seqs = {{.req_slot = row.value(), .prefix_len = cut,
                          .tokens = std::span(tokens).subspan(cut)}},
                .out_cache_loc = s2};
    auto logits = run(b);
    EXPECT_LT(max_abs_diff(logits, ref), logit_tolerance(gemm, ref));

    for (int step = 0; step < 6; ++step) {
      const int32_t next = argmax(logits);
      if (const int32_t top = clear_top1(ref, logit_tolerance(gemm, ref)); top >= 0) {
        EXPECT_EQ(next, top) << "step " << step;
        ++top1_checked;
      }
      tokens.push_back(next);
      ref = naive.feed(next);
      const int32_t len = static_cast<int32_t>(tokens.size());
      const SlotIndex last_loc = table.row(row)[len - 2];
      auto s = *alloc.alloc_decode(std::span(&len, 1), std::span(&last_loc, 1));
      table.write(row, len - 1, s);
      StepInput d{.mode = ForwardMode::kDecode,
                  .seqs = {{.req_slot = row.value(), .prefix_len = len - 1,
                            .tokens = std::span(tokens).subspan(len - 1, 1)}},
                  .out_cache_loc = s};
      logits = run(d);
      ASSERT_LT(max_abs_diff(logits, ref), logit_tolerance(gemm, ref)) << "decode step " << step;
    }
  }
  EXPECT_GT(top1_checked, 0) << "no decode step had a clear top-1 at this tolerance";
}

/// Every backend × page size with OpenBLAS; the oneDNN and AMX modes on the last backend, page 16.
std::vector<std::tuple<std::string, int, CpuGemm>> forward_cases() {
  std::vector<std::tuple<std::string, int, CpuGemm>> cases;
  for (const std::string& b : backend_names())
    for (int page : {1, 16}) cases.emplace_back(b, page, CpuGemm::kOpenBlas);
  for (CpuGemm g : {CpuGemm::kOnednnF32, CpuGemm::kOnednn, CpuGemm::kAmx})
    cases.emplace_back(backend_names().back(), 16, g);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) {
                           const CpuGemm g = std::get<2>(info.param);
                           std::string name = std::get<0>(info.param) + "_page" +
                                              std::to_string(std::get<1>(info.param));
                           if (g == CpuGemm::kOnednn) name += "_onednn_bf16";
                           if (g == CpuGemm::kOnednnF32) name += "_onednn_f32";
                           if (g == CpuGemm::kAmx) name += "_amx_bf16";
                           return name;
                         });

// The q/k/v biases change the output (so matching the naive model above is not vacuous), and the
// forward adds them: LlamaModel with biases matches the naive model only when both use them.
TEST(ModelForwardBias, BiasesMatter) {
  const ModelConfig c = testing::qwen2_test_config();
  const ModelWeights w = make_random_weights(c, 21);
  ModelConfig c0 = c;
  c0.qkv_bias = false;
  ModelWeights w0 = w;
  for (LayerWeights& l : w0.layers) l.q_bias.clear(), l.k_bias.clear(), l.v_bias.clear();
  testing::NaiveLlama with(c, w), without(c0, w0);
  std::vector<double> a, b;
  for (int32_t t : {3, 1, 4, 1, 5, 9, 2, 6}) a = with.feed(t), b = without.feed(t);
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  EXPECT_GT(diff, 0.05);
  // Biases the config does not declare are refused, not ignored.
  EXPECT_THROW(LlamaModel(c0, w), Error);
}

TEST(StepInput, BuildsBatchesPerMode) {
  const std::vector<int32_t> t = {5, 6, 7, 8};
  StepInput in{.mode = ForwardMode::kMixed,
               .seqs = {{.req_slot = 1, .prefix_len = 10, .tokens = std::span(t).first(3)},
                        {.req_slot = 2, .prefix_len = 4, .tokens = std::span(t).subspan(3)}},
               .out_cache_loc = {40, 41, 42, 9}};
  const auto b = build_forward_batch(in);
  EXPECT_EQ(b.seq_lens, (std::vector<int32_t>{13, 5}));
  EXPECT_EQ(b.extend_prefix_lens, (std::vector<int32_t>{10, 4}));
  EXPECT_EQ(b.extend_seq_lens, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{10, 11, 12, 4}));
  in.mode = ForwardMode::kDecode;
  EXPECT_THROW(build_forward_batch(in), Error);
  in.out_cache_loc.pop_back();
  in.mode = ForwardMode::kMixed;
  EXPECT_THROW(build_forward_batch(in), Error);
}

// WorkerBatch token masks: a greedy row with a one-token mask samples that token (an unmasked
// row of the same step is unaffected), and malformed masks are refused with kInvalidArgument
// naming the problem, before anything is computed.
TEST(LlamaWorker, TokenMasksApplyAndBadMasksAreRefused) {
  const ModelConfig c = testing::test_model_config();
  const ModelWeights w = make_random_weights(c, 5);
  LlamaModel model(c, w);
  auto platform = platform::make_cpu_platform();
  kv::PageAllocator alloc(16, 16);
  kv::ReqToTokenTable table(3, 64);
  LlamaWorker worker(model, make_cpu_ops(*platform, DType::kF32),
                     WorkerConfig{.page_size = 16, .num_pages = 16,
                                  .backend = {.attention = "reference"}, .cuda_graph = false,
                                  .max_batch_size = 2},
                     table);
  const std::vector<int32_t> tokens = {5, 9, 13};
  const int32_t zero = 0, n = 3, none = -1;
  std::vector<int32_t> prefix(2, zero), lens(2, n), last(2, none);
  const auto slots = *alloc.alloc_extend(prefix, lens, last);
  const ReqSlot r0 = *table.alloc(), r1 = *table.alloc();
  table.write(r0, 0, std::span(slots).first(3));
  table.write(r1, 0, std::span(slots).subspan(3));
  StepInput in{.mode = ForwardMode::kExtend,
               .seqs = {{.req_slot = r0.value(), .prefix_len = 0, .tokens = tokens},
                        {.req_slot = r1.value(), .prefix_len = 0, .tokens = tokens}},
               .out_cache_loc = slots};
  WorkerBatch b{.forward = build_forward_batch(in)};
  for (int i = 0; i < 2; ++i) {
    b.input_ids.insert(b.input_ids.end(), tokens.begin(), tokens.end());
    b.logit_rows.push_back(1);
    b.sampling.push_back(SamplingParams{});
    b.sample_step.push_back(0);
  }
  b.return_logits = true;
  const int64_t words = token_mask_words(c.vocab_size);
  const WorkerOutput plain = worker.run(b);
  const int32_t forced = (plain.tokens[1] + 7) % c.vocab_size;  // not row 1's argmax
  b.mask_rows = {1};
  b.token_mask.assign(static_cast<size_t>(words), 0u);
  b.token_mask[static_cast<size_t>(forced / 32)] = 1u << (forced % 32);
  const WorkerOutput masked = worker.run(b);
  EXPECT_EQ(masked.tokens[0], plain.tokens[0]);
  EXPECT_EQ(masked.tokens[1], forced);
  auto refused = [&](const WorkerBatch& bad, const std::string& words_in_message) {
    try {
      worker.run(bad);
      ADD_FAILURE() << "accepted: " << words_in_message;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(words_in_message), std::string::npos) << e.what();
    }
  };
  WorkerBatch bad = b;
  bad.token_mask.pop_back();
  refused(bad, "token_mask has");
  bad = b;
  bad.mask_rows = {2};  // only 2 logit rows
  refused(bad, "mask_rows[0] = 2");
  bad = b;
  bad.mask_rows = {1, 1};
  bad.token_mask.insert(bad.token_mask.end(), b.token_mask.begin(), b.token_mask.end());
  refused(bad, "mask_rows[1] = 1");
  bad = b;
  std::fill(bad.token_mask.begin(), bad.token_mask.end(), 0u);
  if (c.vocab_size % 32 != 0) bad.token_mask.back() = ~0u << (c.vocab_size % 32);  // past vocab
  refused(bad, "allows no token");
}

TEST(LlamaWorker, CudaGraphBucketsAndPadding) {
  const auto b = cuda_graph_batch_sizes(40);
  EXPECT_EQ(b, (std::vector<int>{1, 2, 4, 8, 12, 16, 24, 32, 40}));
  EXPECT_EQ(cuda_graph_batch_sizes(3), (std::vector<int>{1, 2, 3}));
  attention::ForwardBatch fb;
  fb.mode = ForwardMode::kDecode;
  fb.batch_size = 1;
  fb.req_pool_indices = {3};
  fb.seq_lens = {9};
  fb.positions = {8};
  fb.out_cache_loc = {77};
  pad_decode_batch(fb, 4, 1);
  EXPECT_EQ(fb.batch_size, 4);
  EXPECT_EQ(fb.req_pool_indices, (std::vector<int32_t>{3, 0, 0, 0}));
  EXPECT_EQ(fb.out_cache_loc, (std::vector<int32_t>{77, 0, 0, 0}));
  EXPECT_EQ(fb.positions, (std::vector<int32_t>{8, 0, 0, 0}));
}

// pad_verify_batch: padded requests repeat request 0 (row, lengths, positions, mask block) and
// write slot 0, so the padded batch plans at page size 16 (row 0 would not be page-contiguous)
// and every padded request sees exactly request 0's pages. Checked against the plan of request 0
// alone (build_paged_plan), on random lengths.
TEST(LlamaWorker, VerifyGraphPadding) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  constexpr int kPage = 16, n = 5;
  kv::ReqToTokenTable table(4, 256);
  attention::ForwardBatch fb;
  fb.mode = ForwardMode::kTargetVerify;
  fb.spec.num_draft_tokens = n;
  for (int b = 0; b < 2; ++b) {
    const ReqSlot row = table.alloc().value();
    const int32_t len = static_cast<int32_t>(1 + rng() % 100);
    std::vector<SlotIndex> slots(static_cast<size_t>(len + n));
    std::iota(slots.begin(), slots.end(), (1 + b * 16) * kPage);  // page-contiguous
    table.write(row, 0, slots);
    fb.req_pool_indices.push_back(row.value());
    fb.seq_lens.push_back(len);
    fb.extend_prefix_lens.push_back(len);
    fb.extend_seq_lens.push_back(n);
    for (int i = 0; i < n; ++i) {
      fb.positions.push_back(len + i);
      fb.out_cache_loc.push_back(slots[static_cast<size_t>(len + i)]);
    }
    for (int i = 0; i < n; ++i)  // a chain: row i sees the prefix and nodes 0..i
      for (int j = 0; j < len + n; ++j) fb.spec.tree_mask.push_back(j < len + i + 1 ? 1 : 0);
    fb.batch_size = b + 1;
  }
  attention::ForwardBatch first = fb;  // request 0 alone
  first.batch_size = 1;
  first.req_pool_indices.resize(1);
  first.seq_lens.resize(1);
  first.extend_prefix_lens.resize(1);
  first.extend_seq_lens.resize(1);
  first.positions.resize(n);
  first.out_cache_loc.resize(n);
  first.spec.tree_mask.resize(static_cast<size_t>(n * (fb.seq_lens[0] + n)));
  const attention::PagedPlan one = attention::build_paged_plan(first, table, kPage);
  attention::ForwardBatch padded = fb;
  pad_verify_batch(padded, 5);
  ASSERT_EQ(padded.batch_size, 5);
  const attention::PagedPlan plan = attention::build_paged_plan(padded, table, kPage);
  ASSERT_EQ(plan.page_size, kPage);
  ASSERT_EQ(plan.batch_size(), 5);
  const auto pages0 = std::vector<int32_t>(one.kv_indices.begin(),
                                           one.kv_indices.begin() + one.kv_indptr[1]);
  const auto mask0 = std::vector<uint8_t>(one.custom_mask.begin(),
                                          one.custom_mask.begin() + one.mask_indptr[1]);
  for (int b = 2; b < 5; ++b) {
    EXPECT_EQ(std::vector<int32_t>(plan.kv_indices.begin() + plan.kv_indptr[b],
                                   plan.kv_indices.begin() + plan.kv_indptr[b + 1]),
              pages0) << "padded request " << b;
    EXPECT_EQ(plan.kv_last_page_len[b], one.kv_last_page_len[0]);
    EXPECT_EQ(std::vector<uint8_t>(plan.custom_mask.begin() + plan.mask_indptr[b],
                                   plan.custom_mask.begin() + plan.mask_indptr[b + 1]),
              mask0) << "padded request " << b;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(padded.out_cache_loc[static_cast<size_t>(b * n + i)], 0);
      EXPECT_EQ(padded.positions[static_cast<size_t>(b * n + i)], fb.positions[static_cast<size_t>(i)]);
    }
  }
  // The real requests are unchanged.
  EXPECT_TRUE(std::equal(fb.out_cache_loc.begin(), fb.out_cache_loc.end(),
                         padded.out_cache_loc.begin()));
  // Bad input is refused by name, the batch unchanged.
  attention::ForwardBatch bad = fb;
  EXPECT_THROW(pad_verify_batch(bad, 1), Error);
  bad.extend_seq_lens[1] = n - 1;
  EXPECT_THROW(pad_verify_batch(bad, 4), Error);
  EXPECT_EQ(bad.batch_size, 2);
  bad = fb;
  bad.mode = ForwardMode::kExtend;
  EXPECT_THROW(pad_verify_batch(bad, 4), Error);
}

}  // namespace
}  // namespace pagoda::model
