// Weights packed at load (ModelOps::prepare_linear): a LlamaWorker over the CPU ops in each
// oneDNN mode, its ops wrapped in a recorder, prepares every GEMM weight of the layers and the LM
// head while it is built (before any forward), every linear() (and fused SwiGLU down product, the
// bf16 mode's) of a prefill and a decode step then runs on a prepared (weight, n, k), and the logits still match the naive f64 model (f32 modes at
// f32 accuracy, bf16 at its tolerance) -- packing moved, the math did not change.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

#include "naive_llama.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/model/llama_worker.h"
#include "pagoda/model/step_input.h"
#include "pagoda/platform/platform.h"
#include "test_model.h"

namespace pagoda::model {
namespace {

using attention::ForwardMode;
using Key = std::tuple<const void*, int64_t, int64_t>;

/// Forwards every call to the CPU ops; records prepare_linear and the linear() calls.
class RecordingOps final : public ModelOps {
 public:
  RecordingOps(std::unique_ptr<ModelOps> inner, std::set<Key>& prepared, std::vector<Key>& used)
      : in_(std::move(inner)), prepared_(&prepared), used_(&used) {}
  DType dtype() const override { return in_->dtype(); }
  platform::Platform& platform() const override { return in_->platform(); }
  void* upload(std::span<const float> h) override { return in_->upload(h); }
  float* upload_f32(std::span<const float> h) override { return in_->upload_f32(h); }
  void embed(const void* t, const int32_t* ids, void* out, int64_t rows, int64_t hidden,
             int64_t vb, int64_t vr) override {
    in_->embed(t, ids, out, rows, hidden, vb, vr);
  }
  void copy_2d(void* d, int64_t dp, const void* s, int64_t sp, int64_t w, int64_t h) override {
    in_->copy_2d(d, dp, s, sp, w, h);
  }
  void add_rms_norm(const void* x, float* r, const void* w, void* out, int64_t rows,
                    int64_t hidden, float eps, bool first) override {
    in_->add_rms_norm(x, r, w, out, rows, hidden, eps, first);
  }
  void rms_norm_rows(const float* r, const int32_t* idx, const void* w, void* out, int64_t rows,
                     int64_t hidden, float eps) override {
    in_->rms_norm_rows(r, idx, w, out, rows, hidden, eps);
  }
  void prepare_linear(const void* w, int64_t n, int64_t k) override {
    prepared_->insert({w, n, k});
    in_->prepare_linear(w, n, k);
  }
  void linear(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
              bool f32_out) override {
    used_->push_back({w, n, k});
    in_->linear(x, w, y, m, n, k, f32_out);
  }
  void qkv_rope(const void* qkv, const void* b, const int32_t* pos, const float* f, void* q,
                void* k, void* v, int64_t rows, int hq, int hkv, int d) override {
    in_->qkv_rope(qkv, b, pos, f, q, k, v, rows, hq, hkv, d);
  }
  void silu_mul(const void* gu, void* out, int64_t rows, int64_t inter) override {
    in_->silu_mul(gu, out, rows, inter);
  }
  bool swiglu_linear(const void* gu, const void* w, void* y, int64_t m, int64_t n,
                     int64_t k) override {
    const bool fused = in_->swiglu_linear(gu, w, y, m, n, k);
    if (fused) used_->push_back({w, n, k});
    return fused;
  }
  void soft_cap(float* x, int64_t n, float cap) override { in_->soft_cap(x, n, cap); }
  void sample(const float* l, const SampleRow* p, int32_t* ids, int64_t rows,
              int64_t vocab) override {
    in_->sample(l, p, ids, rows, vocab);
  }
  void adjust_logits(float* l, int64_t vocab, const LogitAdjust* a, int64_t n) override {
    in_->adjust_logits(l, vocab, a, n);
  }
  void mask_logits(float* l, int64_t vocab, const int32_t* rows, const uint32_t* m,
                   const int32_t* c, int64_t max_rows) override {
    in_->mask_logits(l, vocab, rows, m, c, max_rows);
  }

 private:
  std::unique_ptr<ModelOps> in_;
  std::set<Key>* prepared_;
  std::vector<Key>* used_;
};

class PreparedLinear : public ::testing::TestWithParam<CpuGemm> {};

TEST_P(PreparedLinear, EveryGemmWeightPackedAtLoadAndLogitsUnchanged) {
  const CpuGemm gemm = GetParam();
  if (const std::string why = cpu_gemm_unavailable(gemm); !why.empty())
    GTEST_SKIP() << "--cpu-gemm " << cpu_gemm_name(gemm) << " cannot run here: " << why;
  const uint64_t seed = 29;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const ModelConfig& c : {testing::test_model_config(), testing::qwen2_test_config()}) {
    SCOPED_TRACE(hf_architecture_name(c.family));
    ModelWeights w = make_random_weights(c, seed);
    if (c.tie_word_embeddings) w.lm_head.clear();
    LlamaModel model(c, w);
    auto platform = platform::make_cpu_platform();
    kv::PageAllocator alloc(32, 16);
    kv::ReqToTokenTable table(1, 128);
    std::set<Key> prepared;
    std::vector<Key> used;
    LlamaWorker worker(model,
                       std::make_unique<RecordingOps>(
                           make_cpu_ops(*platform, DType::kF32, gemm), prepared, used),
                       WorkerConfig{.page_size = 16,
                                    .num_pages = 32,
                                    .backend = {.attention = "cpu"},
                                    .cuda_graph = false,
                                    .max_batch_size = 1},
                       table);
    // Before any forward: q/k/v, o, gate/up and down of every layer, and the LM head.
    EXPECT_EQ(prepared.size(), static_cast<size_t>(4 * c.num_layers + 1));
    EXPECT_TRUE(used.empty());

    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<int32_t> tokens(19);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
    testing::NaiveLlama naive(c, w);
    std::vector<double> ref;
    auto run = [&](const StepInput& in) {
      WorkerBatch b{.forward = build_forward_batch(in)};
      for (const StepSequence& q : in.seqs) {
        b.input_ids.insert(b.input_ids.end(), q.tokens.begin(), q.tokens.end());
        b.logit_rows.push_back(1);
        b.sampling.push_back(SamplingParams{});
        b.sample_step.push_back(0);
      }
      b.return_logits = true;
      const std::vector<float> logits = worker.run(b).logits;
      double err = 0, mag = 1;
      for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, std::abs(logits[i] - ref[i]));
        mag = std::max(mag, std::abs(ref[i]));
      }
      // bf16 weights and inputs: the tolerance of model_forward_test; f32: f32 accuracy.
      EXPECT_LT(err, gemm == CpuGemm::kOnednn ? 0.1 * mag : 2e-3);
    };
    const ReqSlot row = *table.alloc();
    const int32_t zero = 0, n = static_cast<int32_t>(tokens.size()), none = -1;
    auto s1 = *alloc.alloc_extend(std::span(&zero, 1), std::span(&n, 1), std::span(&none, 1));
    table.write(row, 0, s1);
    for (int32_t t : tokens) ref = naive.feed(t);
    run(StepInput{.mode = ForwardMode::kExtend,
                  .seqs = {{.req_slot = row.value(), .prefix_len = 0, .tokens = tokens}},
                  .out_cache_loc = s1});
    tokens.push_back(static_cast<int32_t>(rng() % 256));
    ref = naive.feed(tokens.back());
    const int32_t len = n + 1;
    const SlotIndex last = table.row(row)[n - 1];
    auto s2 = *alloc.alloc_decode(std::span(&len, 1), std::span(&last, 1));
    table.write(row, n, s2);
    run(StepInput{.mode = ForwardMode::kDecode,
                  .seqs = {{.req_slot = row.value(), .prefix_len = n,
                            .tokens = std::span(tokens).subspan(n, 1)}},
                  .out_cache_loc = s2});
    EXPECT_EQ(used.size(), 2 * static_cast<size_t>(4 * c.num_layers + 1));
    for (const Key& k : used)
      EXPECT_TRUE(prepared.contains(k)) << "a linear on a weight not prepared at load: n "
                                        << std::get<1>(k) << " k " << std::get<2>(k);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, PreparedLinear,
                         ::testing::Values(CpuGemm::kOpenBlas, CpuGemm::kOnednnF32,
                                           CpuGemm::kOnednn),
                         [](const auto& info) {
                           std::string s(cpu_gemm_name(info.param));
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace pagoda::model
