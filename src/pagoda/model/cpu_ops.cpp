// CpuOps: ModelOps on the host in f32 (GEMMs through CpuGemmRunner: OpenBLAS or oneDNN; plain
// loops; see model_ops.h). With OpenBLAS the math is the historical host path's: the same sums in
// the same order, so f32 outputs are unchanged.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <span>
#include <unordered_set>
#include <vector>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/model/cpu_gemm.h"
#include "pagoda/model/host_sampling.h"
#include "pagoda/model/logit_processing.h"
#include "pagoda/model/model_ops.h"
#include "pagoda/model/ops.h"
#include "pagoda/model/weights.h"

namespace pagoda::model {

std::unique_ptr<ModelOps::Graph> ModelOps::capture(const std::function<void()>&) {
  throw_error(ErrorCode::kUnsupported, "CUDA graphs are not available on the '{}' platform",
              platform().name());
}

void* ModelOps::upload_bf16(std::span<const uint16_t> host) {
  return upload(widened_bf16(host));
}

void ModelOps::scale(void*, int64_t, float) {
  throw_error(ErrorCode::kUnsupported, "scale is not implemented on the '{}' platform",
              platform().name());
}
void ModelOps::rms_norm_groups(void*, int64_t, int64_t, int64_t, int64_t, const void*, float) {
  throw_error(ErrorCode::kUnsupported, "rms_norm_groups is not implemented on the '{}' platform",
              platform().name());
}
void ModelOps::gelu_tanh_mul(const void*, void*, int64_t, int64_t) {
  throw_error(ErrorCode::kUnsupported, "gelu_tanh_mul is not implemented on the '{}' platform",
              platform().name());
}

void ModelOps::add_bias(void*, DType, const float*, int64_t, int64_t) {
  throw_error(ErrorCode::kUnsupported, "add_bias is not implemented on the '{}' platform",
              platform().name());
}
void ModelOps::gated_rms_norm(const float*, const float*, int64_t, const float*, void*, int64_t,
                              int64_t, int64_t, float) {
  throw_error(ErrorCode::kUnsupported, "gated_rms_norm is not implemented on the '{}' platform",
              platform().name());
}

void ModelOps::rope_interleaved(void*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                                const float*, float) {
  throw_error(ErrorCode::kUnsupported, "rope_interleaved is not implemented on the '{}' platform",
              platform().name());
}

void ModelOps::linear_groups(const void*, int64_t, int64_t, const void*, void*, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t) {
  throw_error(ErrorCode::kUnsupported, "linear_groups is not implemented on the '{}' platform",
              platform().name());
}

void ModelOps::merge_attention(const void*, const float*, float*, float*, void*, int64_t, int64_t,
                               int64_t, bool) {
  throw_error(ErrorCode::kUnsupported, "merge_attention is not implemented on the '{}' platform",
              platform().name());
}

void ModelOps::layer_norm_f32(float*, int64_t, int64_t, const float*, const float*, float) {
  throw_error(ErrorCode::kUnsupported, "layer_norm_f32 is not implemented on the '{}' platform",
              platform().name());
}
void ModelOps::rope_neox_f32(float*, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                             const float*, float) {
  throw_error(ErrorCode::kUnsupported, "rope_neox_f32 is not implemented on the '{}' platform",
              platform().name());
}
void ModelOps::scale_f32(float*, int64_t, float) {
  throw_error(ErrorCode::kUnsupported, "scale_f32 is not implemented on the '{}' platform",
              platform().name());
}
void ModelOps::store_index_keys(const float*, const int32_t*, int64_t, int64_t, void*, int64_t) {
  throw_error(ErrorCode::kUnsupported, "store_index_keys is not implemented on the '{}' platform",
              platform().name());
}

namespace {

class CpuOps final : public ModelOps {
 public:
  CpuOps(platform::Platform& platform, CpuGemm gemm) : platform_(&platform), gemm_(gemm) {}
  DType dtype() const override { return DType::kF32; }
  platform::Platform& platform() const override { return *platform_; }

  /// The weights are used in place: the caller's array (a LlamaModel's packed weights, which
  /// outlive the Decoder and its ops) is already f32 in host memory, so nothing is copied.
  void* upload(std::span<const float> host) override {
    return const_cast<float*>(host.data());
  }
  float* upload_f32(std::span<const float> host) override {
    owned_.emplace_back(host.begin(), host.end());
    return owned_.back().data();
  }
  /// In the bf16 GEMM modes the bf16 array is used in place (its GEMM packs it as it is); in the
  /// others it is widened into a copy the ops own (their GEMMs and every other op read f32).
  void* upload_bf16(std::span<const uint16_t> host) override {
    if (gemm_.reads_bf16()) {
      bf16_weights_.insert(host.data());
      return const_cast<uint16_t*>(host.data());
    }
    return owned_.emplace_back(widened_bf16(host)).data();
  }

  void embed(const void* table, const int32_t* ids, void* out, int64_t rows, int64_t hidden,
             int64_t vocab_begin, int64_t vocab_rows) override {
    const bool bf16 = bf16_weights_.count(table) != 0;  // an upload_bf16 table: rows widened
    const float* t = static_cast<const float*>(table);
    const uint16_t* t16 = static_cast<const uint16_t*>(table);
    float* o = static_cast<float*>(out);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t local = static_cast<int64_t>(ids[i]) - vocab_begin;
      if (local >= 0 && local < vocab_rows && bf16) {
        for (int64_t d = 0; d < hidden; ++d)
          o[i * hidden + d] = bf16_bits_to_f32(t16[local * hidden + d]);
      } else if (local >= 0 && local < vocab_rows) {
        std::memcpy(o + i * hidden, t + local * hidden,
                    static_cast<size_t>(hidden) * sizeof(float));
      } else {
        std::fill(o + i * hidden, o + (i + 1) * hidden, 0.f);
      }
    }
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
               int64_t height) override {
    for (int64_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, static_cast<size_t>(width));
  }

  void add_rms_norm(const void* x, float* residual, const void* weight, void* out, int64_t rows,
                    int64_t hidden, float eps, bool first) override {
    const float* xs = static_cast<const float*>(x);
    const float* w = static_cast<const float*>(weight);
    float* o = static_cast<float*>(out);
    // Row by row (the add, then that row's norm), rows over the threads.
#pragma omp parallel for schedule(static) if (rows > 1 && rows * hidden >= kParallelMinElems)
    for (int64_t t = 0; t < rows; ++t) {
      float* r = residual + t * hidden;
      const float* xr = xs + t * hidden;
      if (!first) {
        for (int64_t i = 0; i < hidden; ++i) r[i] += xr[i];
      } else if (xr != r) {
        std::memcpy(r, xr, static_cast<size_t>(hidden) * sizeof(float));
      }
      rms_norm(r, w, o + t * hidden, 1, hidden, eps);
    }
  }

  void rms_norm_rows(const float* residual, const int32_t* row_index, const void* weight,
                     void* out, int64_t rows, int64_t hidden, float eps) override {
    float* o = static_cast<float*>(out);
    for (int64_t r = 0; r < rows; ++r)
      rms_norm(residual + static_cast<int64_t>(row_index[r]) * hidden,
               static_cast<const float*>(weight), o + r * hidden, 1, hidden, eps);
  }

  void prepare_linear(const void* w, int64_t n, int64_t k) override {
    gemm_.prepare(weight(w), n, k);
  }
  void linear(const void* x, const void* w, void* y, int64_t m, int64_t n, int64_t k,
              bool) override {
    gemm_.linear(static_cast<const float*>(x), weight(w), static_cast<float*>(y), m, n, k);
  }

  void qkv_rope(const void* qkv, const void* bias, const int32_t* positions,
                const float* inv_freq, void* q, void* k, void* v, int64_t rows, int hq, int hkv,
                int d) override {
    const float* src = static_cast<const float*>(qkv);
    const float* b = static_cast<const float*>(bias);
    float* qo = static_cast<float*>(q);
    float* ko = static_cast<float*>(k);
    float* vo = static_cast<float*>(v);
    const int64_t width = static_cast<int64_t>(hq + 2 * hkv) * d;
    const int64_t qw = static_cast<int64_t>(hq) * d, kw = static_cast<int64_t>(hkv) * d;
    const int half = d / 2;
    // Rows over the threads, each thread with its own cos / sin table (kept between calls: this
    // runs once per layer of every step).
#pragma omp parallel if (rows > 1 && rows * width >= kParallelMinElems)
    {
      thread_local std::vector<float> cs, sn;
      cs.resize(static_cast<size_t>(half));
      sn.resize(static_cast<size_t>(half));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < rows; ++t) {
        const float* row = src + t * width;
        float* dst[3] = {qo + t * qw, ko + t * kw, vo + t * kw};
        const int64_t off[3] = {0, qw, qw + kw};
        const int64_t len[3] = {qw, kw, kw};
        for (int part = 0; part < 3; ++part)
          for (int64_t i = 0; i < len[part]; ++i)
            dst[part][i] = row[off[part] + i] + (b != nullptr ? b[off[part] + i] : 0.f);
        const float pos = static_cast<float>(positions[t]);
        for (int i = 0; i < half; ++i) {
          const float angle = pos * inv_freq[i];
          cs[i] = std::cos(angle);
          sn[i] = std::sin(angle);
        }
        for (int part = 0; part < 2; ++part) {
          const int heads = part == 0 ? hq : hkv;
          for (int h = 0; h < heads; ++h) {
            float* vec = dst[part] + static_cast<int64_t>(h) * d;
            for (int i = 0; i < half; ++i) {
              const float a = vec[i], c = vec[i + half];
              vec[i] = a * cs[i] - c * sn[i];
              vec[i + half] = c * cs[i] + a * sn[i];
            }
          }
        }
      }
    }
  }

  void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter) override {
    model::silu_mul(static_cast<const float*>(gate_up), static_cast<float*>(out), rows, inter);
  }
  bool swiglu_linear(const void* gate_up, const void* w, void* y, int64_t m, int64_t n,
                     int64_t k) override {
    return gemm_.swiglu_linear(static_cast<const float*>(gate_up), weight(w),
                               static_cast<float*>(y), m, n, k);
  }

  void soft_cap(float* x, int64_t n, float cap) override { model::soft_cap(x, n, cap); }
  bool supports_gemma_ops() const override { return true; }
  void scale(void* x, int64_t n, float s) override {
    float* p = static_cast<float*>(x);
    for (int64_t i = 0; i < n; ++i) p[i] *= s;
  }
  void rms_norm_groups(void* x, int64_t rows, int64_t row_stride, int64_t groups, int64_t dim,
                       const void* weight, float eps) override {
    for (int64_t t = 0; t < rows; ++t) {
      float* r = static_cast<float*>(x) + t * row_stride;
      model::rms_norm(r, static_cast<const float*>(weight), r, groups, dim, eps);
    }
  }
  void gelu_tanh_mul(const void* gate_up, void* out, int64_t rows, int64_t inter) override {
    model::gelu_tanh_mul(static_cast<const float*>(gate_up), static_cast<float*>(out), rows, inter);
  }

  bool supports_mamba_ops() const override { return true; }
  void add_bias(void* x, DType, const float* bias, int64_t rows, int64_t n) override {
    float* r = static_cast<float*>(x);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < n; ++i) r[t * n + i] += bias[i];
  }
  void gated_rms_norm(const float* y, const float* z, int64_t z_stride, const float* weight,
                      void* out, int64_t rows, int64_t dim, int64_t groups, float eps) override {
    const int64_t group = dim / groups;
    for (int64_t t = 0; t < rows; ++t) {
      float* v = static_cast<float*>(out) + t * dim;
      const float* yt = y + t * dim;
      const float* zt = z + t * z_stride;
      for (int64_t i = 0; i < dim; ++i) v[i] = yt[i] * (zt[i] / (1.f + std::exp(-zt[i])));
      for (int64_t g0 = 0; g0 < dim; g0 += group) {
        float ss = 0.f;
        for (int64_t i = g0; i < g0 + group; ++i) ss += v[i] * v[i];
        const float inv = 1.f / std::sqrt(ss / static_cast<float>(group) + eps);
        for (int64_t i = g0; i < g0 + group; ++i) v[i] *= inv * weight[i];
      }
    }
  }

  bool supports_mla_ops() const override { return true; }
  /// Each group gathered into a contiguous [m, k] block, linear(), scattered back.
  void linear_groups(const void* x, int64_t x_pitch, int64_t x_group, const void* w, void* y,
                     int64_t y_pitch, int64_t y_group, int64_t m, int64_t n, int64_t k,
                     int64_t groups) override {
    group_in_.resize(static_cast<size_t>(m * k));
    group_out_.resize(static_cast<size_t>(m * n));
    const auto* xf = static_cast<const float*>(x);
    auto* yf = static_cast<float*>(y);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t t = 0; t < m; ++t)
        std::copy_n(xf + t * x_pitch + g * x_group, k, group_in_.data() + t * k);
      linear(group_in_.data(), static_cast<const float*>(w) + g * n * k, group_out_.data(), m, n, k,
             false);
      for (int64_t t = 0; t < m; ++t)
        std::copy_n(group_out_.data() + t * n, n, yf + t * y_pitch + g * y_group);
    }
  }
  /// attention::merge_state in place (f64 weights), after a copy for the first window.
  void merge_attention(const void* part_o, const float* part_lse, float* acc_o, float* acc_lse,
                       void* out, int64_t rows, int64_t heads, int64_t dv, bool first) override {
    const auto* part = static_cast<const float*>(part_o);
    if (first) {
      std::copy_n(part, rows * heads * dv, acc_o);
      std::copy_n(part_lse, rows * heads, acc_lse);
    } else {
      const TensorView acc(acc_o, DType::kF32, {rows, heads, dv}),
          acc_s(acc_lse, DType::kF32, {rows, heads});
      attention::merge_state(
          acc, acc_s, TensorView(const_cast<float*>(part), DType::kF32, {rows, heads, dv}),
          TensorView(const_cast<float*>(part_lse), DType::kF32, {rows, heads}), acc, acc_s);
    }
    if (out != nullptr) std::copy_n(acc_o, rows * heads * dv, static_cast<float*>(out));
  }
  void rope_interleaved(void* x, int64_t rows, int64_t row_stride, int64_t groups,
                        int64_t group_stride, int64_t dim, const int32_t* positions,
                        const float* inv_freq, float factor) override {
    const int64_t half = dim / 2;
    cos_.resize(static_cast<size_t>(half));
    sin_.resize(static_cast<size_t>(half));
    for (int64_t t = 0; t < rows; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_[i] = std::cos(angle) * factor;
        sin_[i] = std::sin(angle) * factor;
      }
      for (int64_t g = 0; g < groups; ++g) {
        float* v = static_cast<float*>(x) + t * row_stride + g * group_stride;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * cos_[i] - b * sin_[i];
          v[2 * i + 1] = b * cos_[i] + a * sin_[i];
        }
      }
    }
  }

  bool supports_dsa_ops() const override {
    return true;
  }
  void layer_norm_f32(float* x, int64_t rows, int64_t dim, const float* weight, const float* bias,
                      float eps) override {
    for (int64_t t = 0; t < rows; ++t) {
      float* v = x + t * dim;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < dim; ++j) mean += v[j];
      mean /= static_cast<double>(dim);
      for (int64_t j = 0; j < dim; ++j) var += (v[j] - mean) * (v[j] - mean);
      const double inv = 1.0 / std::sqrt(var / static_cast<double>(dim) + eps);
      for (int64_t j = 0; j < dim; ++j)
        v[j] = static_cast<float>((v[j] - mean) * inv * weight[j] + bias[j]);
    }
  }
  void rope_neox_f32(float* x, int64_t rows, int64_t groups, int64_t dim, int64_t rope,
                     const int32_t* positions, const float* inv_freq, float factor) override {
    const int64_t half = rope / 2;
    for (int64_t t = 0; t < rows; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        const float c = std::cos(angle) * factor, s = std::sin(angle) * factor;
        for (int64_t g = 0; g < groups; ++g) {
          float* v = x + (t * groups + g) * dim;
          const float a = v[i], b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
    }
  }
  void scale_f32(float* x, int64_t n, float s) override {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }
  void store_index_keys(const float* k, const int32_t* loc, int64_t rows, int64_t dim,
                        void* index_rows, int64_t row_bytes) override {
    auto* base = static_cast<uint8_t*>(index_rows);
    for (int64_t t = 0; t < rows; ++t)
      kv::quantize_index_key(k + t * dim, dim, base + loc[t] * row_bytes);
  }

  void adjust_logits(float* logits, int64_t vocab, const LogitAdjust* adj, int64_t n) override {
    apply_logit_adjust(logits, vocab, std::span<const LogitAdjust>(adj, static_cast<size_t>(n)));
  }

  void mask_logits(float* logits, int64_t vocab, const int32_t* rows, const uint32_t* mask,
                   const int32_t* count, int64_t max_rows) override {
    const auto n = static_cast<size_t>(std::clamp<int64_t>(*count, 0, max_rows));
    apply_token_mask(logits, vocab, std::span<const int32_t>(rows, n),
                     std::span<const uint32_t>(mask, n * static_cast<size_t>(token_mask_words(vocab))));
  }

  void sample(const float* logits, const SampleRow* params, int32_t* out_ids, int64_t rows,
              int64_t vocab) override {
    for (int64_t r = 0; r < rows; ++r)
      out_ids[r] = sample_row(std::span<const float>(logits + r * vocab, static_cast<size_t>(vocab)),
                              params[r], order_, probs_);
  }

 private:
  platform::Platform* platform_;
  CpuGemmRunner gemm_;
  /// A weight pointer as the GEMMs read it: bf16 when upload_bf16 kept it in place.
  WeightRef weight(const void* w) const {
    return {w, bf16_weights_.count(w) != 0};
  }

  std::list<std::vector<float>> owned_;  ///< upload_f32 copies (stable addresses)
  std::unordered_set<const void*> bf16_weights_;  ///< upload_bf16 arrays used in place
  std::vector<float> cos_, sin_;
  std::vector<float> group_in_, group_out_;  // linear_groups' gathered rows
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace

std::unique_ptr<ModelOps> make_cpu_ops(platform::Platform& platform, DType dtype, CpuGemm gemm) {
  PAGODA_REQUIRE(platform.kind() == platform::PlatformKind::kCpu, kInvalidArgument,
                 "CPU model ops need the CPU platform (got '{}')", platform.name());
  PAGODA_REQUIRE(dtype == DType::kF32, kUnsupported,
                 "the CPU model computes in f32 (requested {}); use --dtype f32 (a bf16 "
                 "checkpoint's GEMM weights stay bf16 with --cpu-gemm onednn or amx)",
                 dtype_name(dtype));
  return std::make_unique<CpuOps>(platform, gemm);
}

}  // namespace pagoda::model
